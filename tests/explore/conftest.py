"""What the explorer's PostgreSQL lanes share: the server they make databases on."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def pg_server() -> str:
    """The PostgreSQL server's admin URL (tests/pg.py: skipped without one, failed in
    CI)."""
    import pg

    why = pg.reachable()
    if why is not None:
        if pg.in_ci():
            pytest.fail(f"CI is set and PostgreSQL is required: {why}")
        pytest.skip(f"no PostgreSQL at {pg.ADMIN_URL}: {why}")
    return pg.ADMIN_URL
