"""The test databases by backend: the ``database_url`` fixture's parameters.

``BACKENDS`` are what every contract test runs on; ``POOLED`` adds ``pgbouncer``, a
PostgreSQL database reached through PgBouncer in transaction pooling mode
(tests/pgbouncer.py), for the modules of the worker's store calls, which override the
fixture with ``params=POOLED``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

BACKENDS = ["sqlite", "postgres"]
POOLED = [*BACKENDS, "pgbouncer"]


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of the backend ``request.param``."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kirim.db'}"
    from pg import fresh_database  # tests/pg.py: skips (or fails in CI) without a server

    if request.param == "postgres":
        return fresh_database(request)
    if request.param == "pgbouncer":
        from pgbouncer import pooled_url, shared_bouncer

        return pooled_url(fresh_database(request), shared_bouncer(request))
    raise AssertionError(request.param)
