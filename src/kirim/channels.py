"""A channel: a name, the provider that carries it, and its in-doubt policy."""

from __future__ import annotations

from dataclasses import dataclass

from kirim.model import OnUnknown
from kirim.providers.base import Provider, Reconcilable


@dataclass(frozen=True, slots=True, kw_only=True)
class Channel:
    name: str
    provider: Provider
    #: what to do when an earlier request may have reached a provider that does
    #: not honour idempotency keys
    on_unknown: OnUnknown = OnUnknown.ASSUME_SENT
    #: ask the provider (``lookup``) before anything else when in doubt
    lookup: bool = False

    def __post_init__(self) -> None:
        if self.lookup and not isinstance(self.provider, Reconcilable):
            raise ValueError(f"channel {self.name!r}: its provider has no lookup()")

    @property
    def idempotent(self) -> bool:
        return bool(self.provider.idempotent)
