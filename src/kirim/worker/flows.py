"""The worker's part of workflow runs (``kirim.runs``, docs/workflows.md): claim the
due runs, each with a lease and a fencing token, and advance each under its claim
(``Store.advance_run``: every step recorded once, in the transaction that checks the
token). A run whose claim is lost (its lease expired and another worker took it, or
it was canceled) records nothing: the other worker, or nobody, takes its next step.
"""

from __future__ import annotations

from collections.abc import Sequence

from kirim.errors import StoreError
from kirim.runs import RenderGathered, RunClaim
from kirim.store.flows import Advanced
from kirim.worker.context import WorkerContext

#: the most runs one tick claims
BATCH = 50


class RunAdvancer:
    """Advances due runs; ``tick`` once per turn of the worker's loop."""

    def __init__(self, context: WorkerContext, render: RenderGathered | None = None) -> None:
        """``render``: a digest holder's later sends (``kirim.runs.RenderGathered``,
        from the worker's types)."""
        self.context = context
        self.render = render
        self._last: float | None = None
        #: the last tick claimed a full batch: more runs may be due, the next turn
        #: claims again at once instead of after the poll interval
        self.more = False

    async def tick(self, *, force: bool = False) -> int:
        """Claim the due runs and advance each: how many were claimed (0 when the store
        does not answer; the next turn tries again). At most once per poll interval
        (a claim is a write: a busy worker's turns must not each take the write lock),
        unless ``force`` (``run_once``) or the last tick claimed a full batch
        (``more``)."""
        ctx = self.context
        now = ctx.monotonic()
        too_soon = self._last is not None and now - self._last < ctx.settings.poll_interval
        if not force and not self.more and too_soon:
            return 0
        self._last = now
        self.more = False
        try:
            claims = await ctx.store.claim_runs(
                worker_id=ctx.worker_id,
                now=ctx.clock.now(),
                lease=ctx.settings.lease,
                limit=BATCH,
            )
            for claim, done in zip(claims, await self._advance(claims), strict=True):
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
        except Exception as exc:  # runs' trouble never stops the worker's deliveries
            ctx.log.error("run_claim_failed", error=repr(exc))
            return 0
        self.more = len(claims) >= BATCH
        return len(claims)

    async def _advance(self, claims: Sequence[RunClaim]) -> list[Advanced | None]:
        """Advance the claimed runs in one transaction; when that fails for a reason
        of one run's (not the store's), each in its own, so that the fault of one
        stops neither the worker nor the others (that one is logged and left to its
        lease)."""
        ctx = self.context
        pairs = [(c.run.id, c.token) for c in claims]
        try:
            return await ctx.store.advance_runs(pairs, now=ctx.clock.now(), render=self.render)
        except StoreError:
            raise
        except Exception as exc:  # one run's fault rolled the batch back: each alone
            ctx.log.warning("run_batch_failed", runs=len(pairs), error=repr(exc))
        out: list[Advanced | None] = []
        for run_id, token in pairs:
            try:
                out.append(
                    await ctx.store.advance_run(
                        run_id, token, now=ctx.clock.now(), render=self.render
                    )
                )
            except StoreError:
                raise
            except Exception as exc:  # one run's fault stops neither the worker nor others
                ctx.log.error("run_advance_failed", run_id=run_id, error=repr(exc))
                out.append(None)
        return out
