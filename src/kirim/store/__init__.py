"""Storage backends behind one protocol."""

from __future__ import annotations

from kirim.errors import ConfigError
from kirim.store.base import Store, StoreTime
from kirim.text import redact_url


def open_store(
    url: str, *, time: StoreTime = None, read_only: bool = False, listen_url: str | None = None
) -> Store:
    """The backend for a database URL (``sqlite:///…`` or ``postgresql://…``); not yet
    opened. ``time``: its time of record (``StoreTime``; default: each caller's ``now``).
    ``read_only``: for commands that only look: a SQLite file must exist and is opened
    read-only, never created (a PostgreSQL server creates nothing on a read).
    ``listen_url``: PostgreSQL only, a direct connection for LISTEN (``Config.listen_url``)."""
    if listen_url is not None and not url.startswith(("postgresql:", "postgres:")):
        raise ConfigError("listen_url is for a PostgreSQL database only")
    if url.startswith("sqlite:"):
        from kirim.store.sqlite import SQLiteStore

        return SQLiteStore(url, time=time, read_only=read_only)
    if url.startswith(("postgresql:", "postgres:")):
        try:
            from kirim.store.postgres import PostgresStore  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigError(
                "PostgreSQL needs the postgres extra: pip install 'kirim[postgres]'"
            ) from exc
        store: Store = PostgresStore(url, time=time, listen_url=listen_url)
        return store
    raise ConfigError(
        f"unsupported database URL {redact_url(url)!r}; use sqlite:///path.db or "
        "postgresql://host/db"
    )


__all__ = ["Store", "StoreTime", "open_store"]
