"""Providers deliver messages; kirim decides when it is safe to ask them."""

from kirim.providers.base import Message, Provider, Reconcilable, Sent

__all__ = ["Message", "Provider", "Reconcilable", "Sent"]
