"""SyncKirim: the whole API of Kirim for code without an event loop, its worker, and a
caller's own sync psycopg transaction."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path

import pytest

from kirim.channels import Channel
from kirim.config import Config
from kirim.engine import Kirim
from kirim.model import DeliveryStatus, JobStatus
from kirim.notify import parse_type
from kirim.sync import NOT_OFFERED, SyncKirim, SyncWorker
from kirim.testing import FlakyProvider, ManualClock

LIKED = parse_type(
    "liked",
    {"digest": {"window": "10m"}, "templates": {"push": {"title": "{{ count }} likes"}}},
)


def _public(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def test_every_public_method_of_kirim_has_its_sync_twin() -> None:
    """A method added to Kirim without its blocking twin (or a reason) fails here."""
    missing = _public(Kirim) - _public(SyncKirim) - set(NOT_OFFERED)
    assert missing == set()
    for name in _public(Kirim) & _public(SyncKirim):
        asynchronous = inspect.iscoroutinefunction(getattr(Kirim, name))
        assert not inspect.iscoroutinefunction(getattr(SyncKirim, name)), name
        if asynchronous:
            assert "Kirim." in (getattr(SyncKirim, name).__doc__ or ""), name


def _app(database_url: str, provider: FlakyProvider) -> SyncKirim:
    channels = {"push": Channel(name="push", provider=provider)}
    return SyncKirim(
        Config(database=database_url), channels=channels, clock=ManualClock(), types=[LIKED]
    )


def test_a_sync_worker_sends_and_the_record_reads_as_one(database_url: str) -> None:
    """notify, then a SyncWorker sends it once; the record has the delivery, its job and
    its attempt; a second run sends nothing more."""
    provider = FlakyProvider()
    with _app(database_url, provider).open(migrate=True) as app:
        n = app.notify("48291", "1007", "push", {"title": "Your order shipped"})
        worker = app.worker(worker_id="sync-1")
        assert isinstance(worker, SyncWorker)
        assert worker.run_once() == 1
        assert worker.run_once() == 0
        record = app.get(n.delivery_id, by="id")
        assert record is not None
        assert record.delivery.status is DeliveryStatus.SENT
        assert record.job is not None
        assert record.job.status is JobStatus.COMPLETED
        assert [a.worker_id for a in record.attempts] == ["sync-1"]
        assert provider.effective(n.idempotency_key) == 1


def test_a_sync_worker_stops_from_another_thread(database_url: str) -> None:
    """run() blocks until stop() is called from another thread; what it left is sent by
    the next run, once: nothing lost, nothing twice."""
    provider = FlakyProvider()
    with _app(database_url, provider).open(migrate=True) as app:
        n = app.notify("e-1", "r-1", "push", {"title": "hi"})
        worker = app.worker()
        running = threading.Event()
        stopper = threading.Thread(target=lambda: (running.wait(10), worker.stop()))
        stopper.start()
        app._loop.call_soon(running.set)  # runs once run() drives the loop
        worker.run()
        stopper.join(10)
        assert not stopper.is_alive()
        app.worker().run_once()
        record = app.get(n.delivery_id, by="id")
        assert record is not None
        assert record.delivery.status is DeliveryStatus.SENT
        assert provider.effective(n.idempotency_key) == 1


def test_operator_verbs_and_callbacks_block(database_url: str) -> None:
    """cancel, confirm and reconcile's refusal go through the engine's rules."""
    provider = FlakyProvider()
    with _app(database_url, provider).open(migrate=True) as app:
        n = app.notify("e-2", "r-2", "push", {"title": "hi"})
        canceled = app.cancel(n.delivery_id, by="id")
        assert canceled.delivery.status is DeliveryStatus.CANCELED
        result = app.confirm("push", "no-such-message", "delivered")
        assert str(result.outcome) == "unknown"


def test_a_digest_in_the_callers_sync_transaction(request: pytest.FixtureRequest) -> None:
    """PostgreSQL: a digest type's event on the caller's own sync psycopg connection
    exists if, and only if, the caller commits (the digest's pipelined statements reach
    the connection through the cursor)."""
    import psycopg

    from pg import fresh_database

    url = fresh_database(request)
    with _app(url, FlakyProvider()).open(migrate=True) as app:
        with psycopg.connect(url) as conn:
            with pytest.raises(RuntimeError, match="no"), conn.transaction():  # noqa: PT012
                app.notify_event("liked", ["u1"], {"by": "ana"}, event_id="l-1", connection=conn)
                raise RuntimeError("no")
            assert app.records().records == []
            with conn.transaction():
                result = app.notify_event(
                    "liked", ["u1"], {"by": "ana"}, event_id="l-2", connection=conn
                )
        assert [d.created for d in result.deliveries] == [True]
        assert len(app.records().records) == 1


def test_sync_kirim_from_the_engine_module_warns(tmp_path: Path) -> None:
    """kirim.engine.SyncKirim still works, with a DeprecationWarning naming kirim.sync."""
    import kirim.engine

    with pytest.warns(DeprecationWarning, match="kirim.sync"):
        assert kirim.engine.SyncKirim is SyncKirim
