"""kirim's HTTP service (``kirim serve``): the API, the dashboard and /metrics."""

from __future__ import annotations

from kirim.http.app import create_app

__all__ = ["create_app"]
