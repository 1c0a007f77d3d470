"""The worker's rounds beside its deliveries: the heartbeat and the reaper.

- ``Heartbeat``: renews the job lease and the delivery claim of all work in flight
  (docs/design.md, step 5), so a slow provider never looks like a dead worker; a lease found
  taken over marks its job lost (a request that has not left then never will), and
  while renewals fail the worker claims nothing new (``renewal_ok``).
- ``Reaper``: returns jobs whose lease expired to the queue (step 8), refreshes the
  store-wide metrics gauges every few seconds, and prunes the ledger (``[retention]``)
  once in a while.

Both use the store's time; the worker owns one of each, and each takes the worker's
context (``kirim.worker.context``): the heartbeat renews the leases of its work in
flight and marks the jobs taken over through ``InFlight``.
"""

from __future__ import annotations

import asyncio

from kirim.errors import StoreError
from kirim.store.base import QueueStats
from kirim.store.retention import PruneResult
from kirim.worker.context import WorkerContext

#: the reaper prunes (``[retention] keep``) this often, at most this many batches a round
PRUNE_EVERY = 60.0
PRUNE_BATCHES = 4


class Heartbeat:
    """Renews the leases of the work in flight, every ``heartbeat_every`` seconds."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        #: False while renewals fail: the worker then claims no new work
        self.renewal_ok = True

    async def beat(self) -> list[int]:
        """Renew every lease in flight; return the job ids whose lease was lost."""
        leases = self.context.in_flight.leases()
        if not leases:
            return []
        held = await self.context.store.heartbeat(
            leases, now=self.context.clock.now(), lease=self.context.settings.lease
        )
        lost = []
        for lease, ok in zip(leases, held, strict=True):
            # renewed, or gone because its job completed: not a takeover; a job taken
            # over is lost: a request of it that has not left now never will
            if ok or not self.context.in_flight.taken_over(lease):
                continue
            lost.append(lease.job_id)
            self.context.log.warning("claim_lost", job_id=lease.job_id, reason="lease taken over")
        return lost

    async def run(self) -> None:
        """Beat until cancelled; say when renewals start failing, and when they are back."""
        last_ok = self.context.clock.now()
        while True:
            await asyncio.sleep(self.context.settings.heartbeat_every)
            try:
                # A store that does not answer within a heartbeat period (the pool
                # waiting for a server that is down) fails the renewal like an error.
                async with asyncio.timeout(self.context.settings.heartbeat_every):
                    if self.context.in_flight.leases() or self.renewal_ok:
                        await self.beat()
                    else:  # nothing left to renew: does the store answer again?
                        await self.context.store.ping()
                last_ok = self.context.clock.now()
                if not self.renewal_ok:
                    self.context.log.info("lease_renewal_restored")
                self.renewal_ok = True
            except (StoreError, TimeoutError) as exc:
                if (
                    self.context.clock.now() - last_ok > self.context.settings.lease / 2
                    and self.renewal_ok
                ):
                    self.renewal_ok = False
                    self.context.log.error(
                        "lease_renewal_failing",
                        error=str(exc) or "no answer within the heartbeat interval",
                        reason="not claiming new work until the store answers",
                    )


class Reaper:
    """Expired leases back to the queue, the gauges, and the ledger's retention."""

    def __init__(self, context: WorkerContext) -> None:
        """The context's monotonic clock (its clock's, when it has one: the explorer's
        virtual time) paces the gauges and the prunes. The channels whose effect is
        written in the finish's own commit (the inbox, ``Decisions.in_commit``): the
        store does not count their uncommitted attempts as doubt."""
        self.context = context
        #: monotonic time of the last gauge refresh
        self._stats_at = float("-inf")
        #: when the reaper prunes next (monotonic time), with ``retention_keep`` set
        self._prune_at = float("-inf")

    async def run(self) -> None:
        """A round every ``reap_every`` seconds until cancelled: reap, apply the kept
        callbacks, then retain."""
        while True:
            await asyncio.sleep(self.context.settings.reap_every)
            await self.reap()
            await self.apply_callbacks()
            await self.retain()

    async def apply_callbacks(self) -> int:
        """Apply the providers' callbacks that came before kirim had recorded their
        message (``Operator.apply_kept_callbacks``); how many were applied."""
        apply = getattr(self.context.store, "apply_kept_callbacks", None)
        if apply is None:
            return 0
        try:
            applied = await apply(now=self.context.clock.now())
        except StoreError as exc:
            self.context.log.error("callbacks_failed", error=str(exc))
            return 0
        for r in applied:
            self.context.log.info(
                "callback_applied",
                notification_id=r.delivery_id,
                outcome=str(r.outcome),
                status=None if r.status is None else str(r.status),
                kept=True,
            )
        return len(applied)

    async def reap(self) -> int:
        """Return the jobs whose lease expired to the queue (or the dead letters)."""
        try:
            reaped = await self.context.store.reap(
                now=self.context.clock.now(), in_commit=self.context.decide.in_commit
            )
        except StoreError as exc:
            self.context.log.error("reap_failed", error=str(exc))
            return 0
        for r in reaped:
            self.context.stats.leases_expired += 1
            self.context.log.warning(
                "lease_expired",
                job_id=r.job_id,
                notification_id=r.delivery_id,
                attempt=r.attempt,
                lease_owner=r.owner,
                dead=r.dead,
            )
        metrics = self.context.metrics
        if metrics is not None:
            for r in reaped:
                metrics.lease_expired()
                if r.dead:
                    metrics.dead_letter(r.channel)
                else:
                    metrics.retry(r.channel, "lease_expired")
            if self.context.monotonic() - self._stats_at >= metrics.stats_interval:
                await self.refresh_stats()
        return len(reaped)

    async def refresh_stats(self) -> QueueStats | None:
        """Set the gauges from ``Store.queue_stats`` (the reaper does, every few seconds)."""
        if self.context.metrics is None:
            return None
        self._stats_at = self.context.monotonic()
        try:
            stats = await self.context.store.queue_stats(now=self.context.clock.now())
        except Exception as exc:  # gauges are not worth stopping the reaper for
            self.context.log.warning("queue_stats_failed", error=str(exc))
            return None
        self.context.metrics.set_queue_stats(stats)
        return stats

    async def retain(self) -> PruneResult | None:
        """Prune the ledger (``[retention]``) once every ``PRUNE_EVERY`` seconds: a few
        bounded batches, each its own transaction; None when it was not time, or there
        is no ``retention_keep``."""
        keep = self.context.settings.retention_keep
        store = self.context.store
        if keep is None or self.context.monotonic() < self._prune_at:
            return None
        self._prune_at = self.context.monotonic() + PRUNE_EVERY
        total = PruneResult()
        try:
            for _ in range(PRUNE_BATCHES):
                done = await store.prune(
                    now=self.context.clock.now(),
                    keep=keep,
                    keys=self.context.settings.retention_keys,
                    archived=self.context.settings.retention_archived,
                )
                total += done
                if not done.more or not done.removed_anything:
                    break
        except StoreError as exc:
            self.context.log.error("prune_failed", error=str(exc))
        if total.removed_anything:
            self.context.log.info("pruned", **total.as_dict())
        return total
