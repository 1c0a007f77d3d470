"""The worker's fan-out of topic events (``kirim.topics``, docs/topics.md).

A ``TopicExpander`` leases the oldest topic event still expanding (a lease and a fresh
fencing token, in the store's time, as a job's claim: docs/design.md, step 1), then
expands it batch after batch: it reads the next ``batch`` subscribers live at the
event's mark after its cursor, plans their deliveries as ``notify_event`` does
(``plan``: preferences, addresses, throttles, digests), and records them in one
transaction with the cursor moved past them, fenced by its token and by the cursor it
read after (``Topics.expand_topic_batch``); each batch renews the lease. A worker
that dies mid-fan-out leaves the cursor of its last committed batch: once its lease
expires, another worker takes the event over from there. A batch it had read but not
committed is read again by the next, and its deliveries' keys (``default_key``) make
a batch done twice add nothing. Nothing holds more than one batch in memory.

An event of a workflow type (one with ``steps``) fans out the same way into runs, one
per subscriber (``plan``: ``kirim.workflows.plan_runs``), started in the batch's
transaction with its progress, keyed ``run_key(type, event_id, recipient_id)``: the
runs take their steps afterwards, as a direct event's (``kirim.worker.flows``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from kirim.clock import Clock
from kirim.errors import KirimError
from kirim.store.base import Topics
from kirim.store.event_writes import TopicBatch, Written
from kirim.topics import TopicEvent

__all__ = ["BATCH", "Plan", "TopicExpander"]

#: subscribers per batch (one transaction each); with a type's channels, at most
#: ``kirim.notify.fanout.MAX_DELIVERIES`` deliveries
BATCH = 500

#: the deliveries (or a workflow type's runs) of one batch of subscribers
#: (``Kirim.plan_topic_batch``)
Plan = Callable[[TopicEvent, Sequence[str]], Awaitable[TopicBatch]]


class TopicExpander:
    """Expands topic events, one at a time, batch by batch (see the module's text)."""

    def __init__(
        self,
        store: Topics,
        plan: Plan,
        *,
        worker_id: str,
        clock: Clock,
        lease: float,
        poll_interval: float,
        log: Any,
        batch: int = BATCH,
    ) -> None:
        self.store = store
        self.plan = plan
        self.worker_id = worker_id
        self.clock = clock
        self.lease = lease
        self.poll_interval = poll_interval
        self.log = log
        self.batch = batch
        #: called with each batch read, before it is planned and recorded (tests and
        #: the explorer pause, change subscriptions or fail here)
        self.before_batch: Callable[[TopicEvent, Sequence[str]], Awaitable[None]] | None = None

    async def step(self) -> bool:
        """Lease one topic event and expand it to its end (or until the lease is
        lost); False when none was waiting. A read first: a worker with no topic event
        to expand takes no write lock (SQLite's is the database's)."""
        if not await self.store.topic_events_expanding():
            return False
        event = await self.store.claim_topic_event(
            worker_id=self.worker_id, now=self.clock.now(), lease=self.lease
        )
        if event is None:
            return False
        token = event.lease_token
        assert token is not None
        self.log.info("topic_fanout_claimed", topic=event.topic, topic_event=event.id)
        while True:
            recipients = await self.store.topic_batch(event, limit=self.batch)
            last = len(recipients) < self.batch
            if self.before_batch is not None:
                await self.before_batch(event, recipients)
            items = await self.plan(event, recipients) if recipients else TopicBatch()
            written = await self._record(event, token, recipients, items, last=last)
            if written is None:
                self.log.warning("topic_fanout_lost", topic=event.topic, topic_event=event.id)
                return True
            created = sum(1 for d in written.deliveries if d.created)
            created += sum(1 for r in written.runs if r.created)
            self.log.info(
                "topic_fanout_batch",
                topic=event.topic,
                topic_event=event.id,
                recipients=len(recipients),
                created=created,
                done=last,
            )
            if last:
                return True
            cursor = recipients[-1]
            event = _advanced(event, cursor, len(recipients))

    async def _record(
        self,
        event: TopicEvent,
        token: str,
        recipients: Sequence[str],
        items: TopicBatch,
        *,
        last: bool,
    ) -> Written | None:
        """The batch, its progress and its deliveries or runs, in one transaction (the
        explorer's mutation check splits them: ``tests/explore/test_topic_workload.py``)."""
        return await self.store.expand_topic_batch(
            event, token, recipients, items, last=last, now=self.clock.now(), lease=self.lease
        )

    async def step_safely(self) -> bool:
        """``step``; a failing event (a store error, a type no longer configured) is
        logged and left to its lease, to be tried again (False)."""
        try:
            return await self.step()
        except KirimError as exc:
            self.log.error("topic_fanout_failed", error=str(exc))
            return False

    async def run(self, stopping: asyncio.Event) -> None:
        """Expand topic events until ``stopping`` is set; idle for the poll interval
        when none waits (``step_safely``)."""
        while not stopping.is_set():
            if not await self.step_safely():
                await asyncio.sleep(self.poll_interval)  # as the reaper waits

    async def nothing_left(self) -> bool:
        """Whether no topic event is expanding (a burst worker waits for them)."""
        return await self.store.topic_events_expanding() == 0


def _advanced(event: TopicEvent, cursor: str, n: int) -> TopicEvent:
    """``event`` as a committed batch left it."""
    return replace(event, cursor=cursor, batches=event.batches + 1, recipients=event.recipients + n)
