"""The ``takeover`` fault: a stale finish that lands while another worker holds the claim.

A ``pause`` stalls a worker for a drawn time; when it ends, the delivery it held has
usually been reaped and already finished by whoever claimed it next (a claim decides
its doubt and commits in one instant), so the late finish finds it ``pending`` or
final. The one case a finish's token fence is for, a stale finish arriving while the
delivery is ``processing`` under *another* worker's token, is then left to chance,
and on the PostgreSQL lane no seed drew it: its fenced statement
(``transitions.finish_fenced``) could drop its token checks unnoticed.

So the interleaving is forced, not hoped for. At its ``nth`` ``before_commit`` (it has
the provider's answer and is about to finish) the worker stops, as SIGSTOP, until
another worker claims the same delivery (its lease expired meanwhile and the reaper
requeued the job; ``duration`` bounds the wait when none does). The claimant is then
stopped at its ``after_claim`` for ``HOLD`` seconds, holding the claim, while the
stalled worker resumes and sends its finish: stale, against a delivery processing
under the claimant's token. ``finish_by_claim`` (``kirim.explore.finishes``) judges
what that finish wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kirim.explore.faults import Fault
from kirim.explore.loop import DeterministicLoop, Host

#: seconds the claimant is held at ``after_claim`` (well within any drawn lease: its
#: own claim stays valid) while the stalled worker's finish is written
HOLD = 2.0


@dataclass(slots=True)
class _Stalled:
    host: Host
    worker_id: str
    fault: Fault


class Takeovers:
    """The plan's ``takeover`` faults, shared by every worker host of a schedule (the
    stalled worker and its claimant are two hosts)."""

    def __init__(
        self, loop: DeterministicLoop, plan: Sequence[Fault], note: Callable[..., None]
    ) -> None:
        self.loop = loop
        self.faults = [f for f in plan if f.kind == "takeover"]
        self.note = note
        self._count: dict[str, int] = {}
        self._fired: list[Fault] = []
        #: delivery id -> the worker stalled at its finish, waiting for a claimant
        self._stalled: dict[int, _Stalled] = {}

    def __bool__(self) -> bool:
        return bool(self.faults)

    async def hit(self, host: Host, name: str, *, worker_id: str, delivery_id: int) -> None:
        """A worker of ``host`` reached checkpoint ``name`` for ``delivery_id``."""
        if name == "before_commit":
            self._count[host.label] = self._count.get(host.label, 0) + 1
            for fault in self.faults:
                if (
                    fault.host == host.label
                    and fault.nth == self._count[host.label]
                    and fault not in self._fired
                ):
                    self._fired.append(fault)
                    self._stalled[delivery_id] = _Stalled(host, worker_id, fault)
                    self.note(
                        f"fault takeover at before_commit delivery={delivery_id}: stopped "
                        f"until another worker claims it (at most {fault.duration:.1f}s)"
                    )
                    self.loop.stall(host, self.loop.time() + fault.duration)
                    await asyncio.sleep(0)
                    return
        elif name == "after_claim":
            stalled = self._stalled.get(delivery_id)
            if stalled is None or stalled.worker_id == worker_id:
                return
            del self._stalled[delivery_id]
            now = self.loop.time()
            if stalled.host.dead or stalled.host.stalled_until <= now:
                return  # its wait ran out (or it crashed): nothing to race
            self.note(
                f"takeover delivery={delivery_id} claimed by {worker_id}: "
                f"{stalled.worker_id} resumes its finish, {worker_id} holds {HOLD:g}s"
            )
            stalled.host.stalled_until = now  # SIGCONT
            self.loop.stall(host, now + HOLD)
            await asyncio.sleep(0)
