"""What the notification layer adds between a claim and its intent (``Deliverer``):
the digest a delivery carries is sealed, and its channel's request rate is kept.

- ``seal``: a delivery whose type is a digest type gets its payload from its events
  (``Notifications.seal_digest``, fenced by the claim token) before anything can be
  sent; a later claim of it (a retry) finds the payload recorded. A compose function
  that fails is the delivery's failure (nothing was sent): it is dead-lettered, for an
  operator to retry once the template is fixed.
- ``pace``: a channel with a ``rate`` takes its next request slot, shared by every
  worker on the database, and waits for it. A slot further away than half of what
  the claim has left before its send deadline is not taken (``kirim.store.rates``):
  the job is put back until the slot comes within reach of a claim (the claim is not
  counted as an attempt), so every slot taken is used and the channel keeps its rate
  whatever its backlog.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kirim.channels import Channel
from kirim.model import Delivery, DeliveryStatus, JobStatus
from kirim.store.base import Claim, Compose, Finish, Notifications

if TYPE_CHECKING:
    from kirim.worker.context import WorkerContext

__all__ = ["LATE_TRIES", "Prepare"]

#: how many slots a worker that keeps waking late takes before it puts the job back
LATE_TRIES = 3
#: the longest round trip of a rate slot's answer after which the slot's time is still
#: known closely enough (the slot is placed at the answer: off by at most this)
ROUND_TRIP = 0.05


class Prepare:
    """The digest seal and the rate slot of one worker's claims."""

    def __init__(self, context: WorkerContext, *, digests: Mapping[str, Compose]) -> None:
        """``digests``: the compose function of each digest type, by type name; the
        context's metrics observe the rate waits (``kirim_rate_wait_seconds``)."""
        self.context = context
        self.digests = dict(digests)

    def _notifications(self) -> Notifications:
        return self.context.store

    def carries_digest(self, claim: Claim) -> bool:
        return claim.delivery.type is not None and claim.delivery.type in self.digests

    async def seal(self, claim: Claim) -> Claim | Finish | None:
        """The claim with its digest sealed and its payload composed; a ``Finish`` that
        dead-letters it when its events cannot be composed; None when the claim no
        longer holds (nothing is sent)."""
        compose = self.digests[claim.delivery.type or ""]
        failed: list[Exception] = []

        def guarded(delivery: Delivery, events: list[dict[str, Any]]) -> Any:
            try:
                return compose(delivery, events)
            except Exception as exc:
                failed.append(exc)
                raise

        try:
            sealed = await self._notifications().seal_digest(
                claim.delivery.id, claim.token, now=self.context.clock.now(), compose=guarded
            )
        except Exception as exc:
            if not failed:
                raise
            return self.context.decide.final(
                claim,
                DeliveryStatus.FAILED,
                job=JobStatus.DEAD,
                error=f"the digest's events could not be composed: {exc}",
            )
        if sealed is None:
            return None
        return dataclasses.replace(claim, delivery=sealed)

    async def pace(self, claim: Claim, channel: Channel, deadline: float) -> Finish | None:
        """Wait for a request slot of ``channel`` (when it has a ``rate``); a ``Finish``
        that puts the job back until the slot when it is too far for this claim
        (``deadline``: the claim's local send deadline, monotonic). A worker that wakes
        late after its slot (a stall: later than a tenth of the interval, or a quarter
        of a second) takes a new one: sending then would crowd the next slot's
        request. So does one whose answer took longer than ``ROUND_TRIP`` (or that
        slack) to come back: where in that time the store placed the slot is unknown."""
        if channel.rate is None:
            return None
        interval = 1.0 / channel.rate
        wait = 0.0
        slack = min(0.1 * interval, 0.25)
        for _ in range(LATE_TRIES):
            asked = self.context.monotonic()
            within = (deadline - asked) / 2
            wait = await self._notifications().take_rate_slot(
                channel.name, channel.rate, now=self.context.clock.now(), within=within
            )
            if wait > within:  # not taken: back when a claim can reach it
                break
            answered = self.context.monotonic()
            if answered - asked > max(slack, ROUND_TRIP):
                # the store chose the slot somewhere in a long round trip (a stall, a
                # slow store): when it is here is unknown, and a request sent now may
                # crowd the next one
                continue
            if wait <= 0:
                return None
            if self.context.metrics is not None:
                self.context.metrics.rate_wait(channel.name, wait)
            slot = answered + wait
            await self.context.clock.sleep(wait)
            if self.context.monotonic() - slot <= slack:
                return None
        reach = self.context.decide.settings.send_within / 2
        return Finish(
            delivery_id=claim.delivery.id,
            job_id=claim.job.id,
            token=claim.token,
            now=self.context.clock.now(),
            attempt=None,
            delivery_status=DeliveryStatus.PENDING,
            error=f"waiting {wait:.3g} s for channel {channel.name!r}'s request rate",
            job_status=JobStatus.RETRY_SCHEDULED,
            delay=max(interval, wait - reach),
            refund_attempt=True,
        )
