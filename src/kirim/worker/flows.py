"""The worker's part of workflow runs (``kirim.runs``, docs/workflows.md): claim the
due runs, each with a lease and a fencing token, and advance each under its claim
(``Store.advance_run``: every step recorded once, in the transaction that checks the
token). A run whose claim is lost (its lease expired and another worker took it, or
it was canceled) records nothing: the other worker, or nobody, takes its next step.
"""

from __future__ import annotations

from kirim.errors import StoreError
from kirim.worker.context import WorkerContext

#: the most runs one tick claims
BATCH = 50


class RunAdvancer:
    """Advances due runs; ``tick`` once per turn of the worker's loop."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self._last: float | None = None

    async def tick(self, *, force: bool = False) -> int:
        """Claim the due runs and advance each: how many were claimed (0 when the store
        does not answer; the next turn tries again). At most once per poll interval
        (a claim is a write: a busy worker's turns must not each take the write lock),
        unless ``force`` (``run_once``)."""
        ctx = self.context
        now = ctx.monotonic()
        if not force and self._last is not None and now - self._last < ctx.settings.poll_interval:
            return 0
        self._last = now
        try:
            claims = await ctx.store.claim_runs(
                worker_id=ctx.worker_id,
                now=ctx.clock.now(),
                lease=ctx.settings.lease,
                limit=BATCH,
            )
            for claim in claims:
                try:
                    done = await ctx.store.advance_run(
                        claim.run.id, claim.token, now=ctx.clock.now()
                    )
                except StoreError:
                    raise
                except Exception as exc:  # one run's fault stops neither the worker nor others
                    ctx.log.error("run_advance_failed", run_id=claim.run.id, error=repr(exc))
                    continue
                if done is None:
                    ctx.log.warning("run_claim_lost", run_id=claim.run.id)
                    continue
                for step in done.recorded:
                    ctx.log.info(
                        "run_step",
                        run_id=claim.run.id,
                        step=step.index,
                        outcome=str(step.outcome),
                        delivery_id=step.delivery_id,
                    )
        except StoreError as exc:
            ctx.log.error("store_unavailable", error=str(exc))
            return 0
        return len(claims)
