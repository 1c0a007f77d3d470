"""What a worker's roles share: one ``WorkerContext``, made by the ``Worker``.

The ``Worker`` makes the context once and hands it to each of its roles (the
``Deliverer``, the ``Heartbeat``, the ``Reaper``, the ``Prepare`` step), as River's
services share an archetype: the store, the channels, the settings, the worker's id,
its clocks, its decisions, its counters and observers (log, metrics, spans, the feed
listener told of each inbox message written), and its work in flight.

The work in flight has one owner, ``InFlight``: the roles change it only through its
verbs, so who writes what can be read here.

- the ``Worker`` records each claim (``start``) and forgets it when its task ends
  (``done``);
- the ``Deliverer`` marks a job being committed (``finishing``: a lease gone now is
  its own commit, not a takeover) and a job whose claim it found revoked (``lose``),
  and reads when a claim was asked for (``claimed_at``) and whether it was lost
  (``is_lost``);
- the ``Heartbeat`` renews the ``leases`` and marks a job whose lease was taken over
  (``taken_over``): a request that has not left then never will.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kirim.channels import Channel
from kirim.clock import Clock
from kirim.observe.tracing import Spans
from kirim.store.base import Claim, ClaimKind, Lease, WorkerStore
from kirim.worker.decisions import Decisions
from kirim.worker.settings import WorkerSettings
from kirim.worker.stats import WorkerStats

if TYPE_CHECKING:
    from kirim.observe.metrics import Metrics

__all__ = ["FeedListener", "InFlight", "WorkerContext"]

#: told of each feed change a commit made: (recipient id, kind, feed item id)
FeedListener = Callable[[str, str, int], None]


class InFlight:
    """A worker's work in flight, by job id: the lease of each claim it holds, when
    each claim was asked for, the jobs being committed and the jobs lost."""

    def __init__(self) -> None:
        self._leases: dict[int, Lease] = {}
        #: this host's monotonic time just before each job's claim was asked for
        self._claimed_at: dict[int, float] = {}
        #: jobs whose outcome is being committed (a lease gone now is not a takeover)
        self._finishing: set[int] = set()
        #: jobs whose lease was taken over or revoked: they must send nothing more
        self._lost: set[int] = set()

    # -- the worker ----------------------------------------------------------------

    def start(self, claim: Claim, asked: float) -> None:
        """A claim the worker starts, asked for at ``asked`` (monotonic); a claimed
        job's lease is renewed from now on."""
        job_id = claim.job.id
        self._claimed_at[job_id] = asked
        if claim.kind is ClaimKind.CLAIMED:
            self._leases[job_id] = Lease(
                job_id=job_id, delivery_id=claim.delivery.id, token=claim.token
            )

    def done(self, job_id: int) -> None:
        """The job's task ended: nothing of it is in flight any more."""
        self._leases.pop(job_id, None)
        self._finishing.discard(job_id)
        self._lost.discard(job_id)
        self._claimed_at.pop(job_id, None)

    def leases(self) -> list[Lease]:
        """The leases held now."""
        return list(self._leases.values())

    # -- the deliverer -------------------------------------------------------------

    def claimed_at(self, job_id: int, default: float) -> float:
        """When the job's claim was asked for (monotonic), or ``default``."""
        return self._claimed_at.get(job_id, default)

    def finishing(self, job_id: int) -> None:
        """The job's outcome is being committed."""
        self._finishing.add(job_id)

    def lose(self, job_id: int) -> None:
        """The job's claim was found revoked: it sends nothing more."""
        self._lost.add(job_id)

    def is_lost(self, job_id: int) -> bool:
        return job_id in self._lost

    # -- the heartbeat -------------------------------------------------------------

    def taken_over(self, lease: Lease) -> bool:
        """A renewal of ``lease`` failed: whether that is a takeover (then the job is
        lost and its lease no longer renewed), not a job that completed meanwhile."""
        job_id = lease.job_id
        if self._leases.get(job_id) is not lease or job_id in self._finishing:
            return False
        self._leases.pop(job_id, None)
        self._lost.add(job_id)
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerContext:
    """What a worker's roles share (see the module docstring)."""

    store: WorkerStore
    channels: Mapping[str, Channel]
    settings: WorkerSettings
    worker_id: str
    clock: Clock
    #: this host's monotonic time (the clock's, when it has one: the explorer's)
    monotonic: Callable[[], float]
    decide: Decisions
    stats: WorkerStats
    #: the worker's logger (structlog, bound to its id)
    log: Any
    #: None: no metrics are recorded
    metrics: Metrics | None
    #: the tracing spans (``kirim.observe.tracing.NO_SPANS`` when tracing is off)
    spans: Spans
    in_flight: InFlight
    #: called with (recipient id, "new", item id) after a commit that wrote an inbox
    #: message into a feed (``Kirim.on_feed_change``); None: nobody is told
    on_feed: FeedListener | None = None
