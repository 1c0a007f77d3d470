"""The store's roles and optional capabilities, as runtime-checkable protocols."""

from __future__ import annotations

from pathlib import Path

import pytest

from kirim.errors import StoreError
from kirim.explore.faults import FaultyStore
from kirim.explore.pglane import HIDDEN, BlockingStore
from kirim.store.base import (
    EnqueuesIn,
    Ledger,
    Lifecycle,
    Notifications,
    Operator,
    Prunes,
    Queue,
    Store,
    Tokens,
    WaitsForJobs,
)
from kirim.store.sqlite import SQLiteStore

ROLES = [Lifecycle, Queue, Operator, Ledger, Tokens, Store]
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def postgres_store() -> object:
    """A PostgresStore, never opened (no server is needed)."""
    pytest.importorskip("psycopg")
    pytest.importorskip("psycopg_pool")
    from kirim.store.postgres import PostgresStore

    return PostgresStore(PG_URL)


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_both_backends_play_every_role(role: type, tmp_path: Path) -> None:
    assert isinstance(SQLiteStore(f"sqlite:///{tmp_path / 'kirim.db'}"), role)
    assert isinstance(postgres_store(), role)


def test_store_is_the_union_of_the_roles() -> None:
    # (issubclass is refused for a protocol with a data member, such as ``url``)
    assert set(ROLES[:-1]) <= set(Store.__mro__)


def test_only_postgres_declares_the_optional_capabilities(tmp_path: Path) -> None:
    """The capabilities are declared (listens, enqueues_in), not guessed from names."""
    sqlite = SQLiteStore(f"sqlite:///{tmp_path / 'kirim.db'}")
    assert (sqlite.listens, sqlite.enqueues_in) == (False, False)
    postgres = postgres_store()
    assert (postgres.listens, postgres.enqueues_in) == (True, True)  # type: ignore[attr-defined]
    assert isinstance(postgres, WaitsForJobs)
    assert isinstance(postgres, EnqueuesIn)


async def test_a_capability_not_declared_is_refused(tmp_path: Path) -> None:
    """SQLite's store refuses to wait for jobs or enqueue in a caller's transaction."""
    sqlite = SQLiteStore(f"sqlite:///{tmp_path / 'kirim.db'}")
    with pytest.raises(StoreError, match="poll instead"):
        await sqlite.wait_for_jobs(0)
    with pytest.raises(StoreError, match="your transaction"):
        await sqlite.enqueue_in(object(), [], now=0)


def test_the_worker_role_holds_what_a_worker_calls(tmp_path: Path) -> None:
    """A worker's store plays the queue, digests and rates, and retention (no guessing
    at run time)."""
    sqlite = SQLiteStore(f"sqlite:///{tmp_path / 'kirim.db'}")
    assert isinstance(sqlite, Queue)
    assert isinstance(sqlite, Notifications)
    assert isinstance(sqlite, Prunes)


def test_a_role_is_not_played_without_its_members() -> None:
    class Half:
        async def claim(self, **kwargs: object) -> list[object]:
            return []

    assert not isinstance(Half(), Queue)
    assert not isinstance(Half(), Store)


def test_the_explorer_hides_wait_for_jobs() -> None:
    """The PostgreSQL lane's workers poll: the wrapper (and the fault injector around
    it) is no ``WaitsForJobs``, although the store inside is."""
    assert "wait_for_jobs" in HIDDEN
    inner = postgres_store()
    assert isinstance(inner, WaitsForJobs)
    blocking = BlockingStore(inner)
    assert not isinstance(blocking, WaitsForJobs)
    assert blocking.listens is False
    faulty = FaultyStore(
        blocking, host="w1", plan=[], time=lambda: 0.0, heal=0.0, on_intent=lambda _: None
    )
    assert not isinstance(faulty, WaitsForJobs)
    assert not hasattr(faulty, "wait_for_jobs")
