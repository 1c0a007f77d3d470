"""Random interleavings of claims, intents, outcomes, heartbeats, reaps and operator
actions on a real SQLite file and on a real PostgreSQL database, checking the
invariants of DESIGN.md after each step: one set of rules, so one machine for both."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kirim.keys import canonical_json, payload_hash
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, JobStatus
from kirim.store.base import AttemptOutcome, Claim, Finish, Intent, Lease, NewDelivery, Store
from kirim.store.sqlite import SQLiteStore
from pg import fresh_database

LEASE = 10.0
ACTIVE = ("queued", "running", "retry_scheduled")
OUTCOMES = ["succeeded", "transient", "permanent", "unknown_hold", "unknown_assume"]


class DeliveryMachine(RuleBasedStateMachine):
    #: a PostgreSQL database to run on (emptied for each example), else a SQLite file
    pg_url: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.loop = asyncio.new_event_loop()
        self.store: Store
        self.db: Any
        if self.pg_url is None:
            path = Path(self.dir.name) / "m.db"
            self.store = SQLiteStore(f"sqlite:///{path}")
        else:
            import psycopg
            from psycopg.rows import dict_row

            from kirim.store.postgres import PostgresStore

            self.store = PostgresStore(self.pg_url)
        self.now = 1_000_000.0
        self.run(self.store.open())
        self.run(self.store.migrate())
        if self.pg_url is None:
            self.db = sqlite3.connect(path)
            self.db.row_factory = sqlite3.Row
        else:
            self.db = psycopg.connect(self.pg_url, autocommit=True, row_factory=dict_row)
            self.db.execute(
                "TRUNCATE kirim_attempts, kirim_jobs, kirim_deliveries RESTART IDENTITY CASCADE"
            )
        items = [
            NewDelivery(
                idempotency_key=f"k{i}",
                event_id=f"e{i}",
                recipient="u",
                channel="push",
                payload_json=canonical_json({"i": i}),
                payload_hash=payload_hash(canonical_json({"i": i})),
                run_at=self.now,
                max_attempts=3,
            )
            for i in range(3)
        ]
        self.run(self.store.enqueue(items, now=self.now))
        self.claims: list[Claim] = []
        self.intents: dict[str, Claim] = {}  # request id -> claim that wrote it
        self.settled: dict[str, str] = {}  # request id -> final outcome, never to change
        self.ids = itertools.count()
        self.released: dict[int, float] = {}  # delivery id -> when an operator retried it

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> Any:
        """Read the tables directly (placeholders written ``?``)."""
        if self.pg_url is not None:
            query = query.replace("?", "%s")
        return self.db.execute(query, args)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.db.close()
        self.run(self.store.close())
        self.loop.close()
        self.dir.cleanup()

    @rule(worker=st.sampled_from(["w1", "w2"]), limit=st.integers(1, 3))
    def claim(self, worker: str, limit: int) -> None:
        got = self.run(self.store.claim(worker_id=worker, now=self.now, lease=LEASE, limit=limit))
        self.claims.extend(c for c in got if c.kind == "claimed")
        for c in got:
            if c.kind != "claimed":
                continue
            since = self.released.get(c.delivery.id, 0.0)
            assert all(a.requested_at >= since for a in c.doubtful), (
                "an operator's retry releases the doubt of the requests before it"
            )
            assert all(a.status in ("requested", "unknown") for a in c.doubtful)

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def write_intent(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(self.claims))
        request_id = f"req-{next(self.ids)}"
        current = self.sql(
            "SELECT claim_token, status FROM kirim_deliveries WHERE id = ?", (c.delivery.id,)
        ).fetchone()
        expect = current["claim_token"] == c.token and current["status"] == "processing"
        intent = Intent(
            delivery_id=c.delivery.id,
            job_id=c.job.id,
            token=c.token,
            number=c.job.attempts,
            provider_request_id=request_id,
            worker_id="w",
            requested_at=self.now,
        )
        (ok,) = self.run(self.store.record_intents([intent]))
        assert ok == expect, "an intent must be written exactly when the claim holds"
        if ok:
            self.intents[request_id] = c

    @precondition(lambda self: self.intents)
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.intents)))
        c = self.intents.pop(request_id)
        attempt = {
            "succeeded": AttemptStatus.SUCCEEDED,
            "transient": AttemptStatus.FAILED_TRANSIENT,
            "permanent": AttemptStatus.FAILED_PERMANENT,
        }.get(outcome, AttemptStatus.UNKNOWN)
        status, job, doubt, run_at = {
            "succeeded": (DeliveryStatus.SENT, JobStatus.COMPLETED, None, None),
            "transient": (DeliveryStatus.PENDING, JobStatus.RETRY_SCHEDULED, None, self.now + 1),
            "permanent": (DeliveryStatus.FAILED, JobStatus.DEAD, None, None),
            "unknown_hold": (DeliveryStatus.IN_DOUBT, JobStatus.DEAD, Doubt.HELD, None),
            "unknown_assume": (DeliveryStatus.SENT, JobStatus.COMPLETED, Doubt.ASSUMED_SENT, None),
        }[outcome]
        message_id = f"p-{request_id}" if attempt is AttemptStatus.SUCCEEDED else None
        self.run(
            self.store.finish(
                [
                    Finish(
                        delivery_id=c.delivery.id,
                        job_id=c.job.id,
                        token=c.token,
                        now=self.now,
                        attempt=AttemptOutcome(
                            provider_request_id=request_id,
                            status=attempt,
                            provider_message_id=message_id,
                            error=None,
                            completed_at=self.now,
                        ),
                        delivery_status=status,
                        doubt=doubt,
                        provider_message_id=message_id,
                        job_status=job,
                        run_at=run_at,
                    )
                ]
            )
        )
        if attempt is not AttemptStatus.UNKNOWN:
            self.settled[request_id] = str(attempt)

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(self.claims))
        lease = Lease(job_id=c.job.id, delivery_id=c.delivery.id, token=c.token)
        self.run(self.store.heartbeat([lease], now=self.now, lease=LEASE))

    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def reap(self) -> None:
        self.run(self.store.reap(now=self.now))

    @rule(delivery=st.integers(1, 3))
    def operator_retry(self, delivery: int) -> None:
        if self.run(self.store.retry_dead(delivery, now=self.now)):
            self.released[delivery] = self.now

    @rule(delivery=st.integers(1, 3))
    def operator_cancel(self, delivery: int) -> None:
        self.run(self.store.cancel(delivery, now=self.now))

    @invariant()
    def records_agree(self) -> None:
        for d in self.sql("SELECT * FROM kirim_deliveries"):
            jobs = self.sql("SELECT * FROM kirim_jobs WHERE delivery_id = ?", (d["id"],)).fetchall()
            active = [j for j in jobs if j["status"] in ACTIVE]
            assert len(active) <= 1, "at most one active job per delivery"
            for j in jobs:
                assert (j["status"] == "running") == (j["lease_token"] is not None)
            succeeded = self.sql(
                "SELECT 1 FROM kirim_attempts WHERE delivery_id = ? AND status = 'succeeded'",
                (d["id"],),
            ).fetchone()
            if succeeded:
                assert d["status"] == "sent", "a recorded success always makes it sent"
            if d["status"] == "processing":
                assert active, "a delivery in processing is carried by a job"
                if d["claim_token"] is None:  # revoked by the reaper: waits for a new claim
                    assert [j["status"] for j in active] == ["queued"]
                else:
                    assert [j["lease_token"] for j in active] == [d["claim_token"]]
            else:
                assert d["claim_token"] is None
            if d["status"] == "pending":
                assert [j["status"] for j in active] in (["queued"], ["retry_scheduled"]), (
                    "a pending delivery must have a job that will pick it up"
                )
            if d["status"] in ("sent", "failed", "canceled", "in_doubt"):
                assert not active, f"a {d['status']} delivery has no active job"
            if d["status"] in ("failed", "in_doubt"):
                assert any(j["status"] == "dead" for j in jobs), "the operator can see it"
        for request_id, outcome in self.settled.items():
            row = self.sql(
                "SELECT status FROM kirim_attempts WHERE provider_request_id = ?", (request_id,)
            ).fetchone()
            assert row["status"] == outcome, "a settled outcome never changes"


DeliveryMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_delivery_state_machine = DeliveryMachine.TestCase


def test_delivery_state_machine_on_postgresql(request: pytest.FixtureRequest) -> None:
    """The same machine on PostgreSQL: each example starts from emptied tables."""

    class OnPostgres(DeliveryMachine):
        pg_url = fresh_database(request)

    run_state_machine_as_test(
        OnPostgres,
        settings=settings(
            max_examples=60,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
