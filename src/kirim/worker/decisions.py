"""What an outcome means for a delivery and its job (docs/design.md, steps 4 and 7).

Pure decisions: each returns the ``Finish`` a worker commits, fenced by its token.
Statuses never claim more certainty than kirim has: attempts that run out while an
earlier request may have arrived end ``in_doubt`` (held), never a plain ``failed``.
Text from outside (errors, provider answers) is made fit for the ledger here.

- ``Decisions.after_request``: what a provider's answer means (step 7);
- ``Decisions.in_doubt``: the in-doubt policy, before a request is sent again while an
  earlier one may have reached the provider (step 4); the worker asks the provider
  first when ``asks_provider`` (its answer is a ``Lookup``), and logs the ``InDoubt``;
- ``route``: which channel of ``[channel, *fallback]`` the next attempt goes to, read
  from the delivery's attempts (failover only after a definite non-acceptance; after
  an uncertain one, only the provider that may have it);
- ``final``, ``hold``, ``retry``, ``wait_until_settled``: the ``Finish`` of each end.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kirim.channels import Channel
from kirim.clock import Clock
from kirim.errors import TransientFailure
from kirim.frozen import quick_init
from kirim.model import Attempt, AttemptStatus, DeliveryStatus, Doubt, JobStatus, OnUnknown
from kirim.providers.base import Reconcilable, Sent
from kirim.store import rules
from kirim.store.base import AttemptOutcome, Claim, Finish
from kirim.text import stored_message_id, stored_text
from kirim.worker.settings import WorkerSettings

#: where a retry that has run out of attempts leaves its delivery
Exhausted = Literal[DeliveryStatus.FAILED, DeliveryStatus.IN_DOUBT]

#: the in-doubt policy's choice, as the ``in_doubt`` log line names it
InDoubtDecision = Literal[
    "lookup_failed",  # the provider could not be asked: retry later
    "reconciled_sent",  # the provider has it: sent
    "wait_until_settled",  # "not found" proves nothing yet: wait for the earlier requests
    "lookup_not_found_send",  # the provider has not got it: send
    "lookup_not_found_withheld",  # ... and the recipient's preferences refuse it now
    "unwritten_send",  # the earlier requests' effect was a commit that never came: send
    "unwritten_withheld",  # ... and the recipient's preferences refuse it now
    "resend_same_key",  # the provider deduplicates by key: send again, safely
    "resend_at_least_once",  # ``on_unknown = "retry"``: send again
    "hold",  # ``on_unknown = "hold"``: in doubt, for an operator
    "assume_sent",  # ``on_unknown = "assume_sent"``: sent (at most once)
]


@dataclass(frozen=True, slots=True)
class Lookup:
    """The provider's answer to ``lookup(key)``: what it found (None: not found), or
    the failure that stopped the question."""

    found: Sent | None = None
    error: Exception | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InDoubt:
    """The in-doubt policy's choice: the ``Finish`` to commit (None: send now), and
    what the ``in_doubt`` log line says about it."""

    decision: InDoubtDecision
    finish: Finish | None
    #: logged as a warning (else as info)
    warn: bool
    #: the log line's fields after ``decision``
    fields: dict[str, Any] = field(default_factory=dict)
    #: an idempotent provider's dedup window is over: it forgot the key (said first)
    key_forgotten: bool = False
    #: the earlier requests the provider, asked once they had settled, does not have
    #: (or, ``recorded_as`` ``rules.UNWRITTEN``, whose in-commit effect never committed): no
    #: longer in doubt (the worker records them, ``Queue.not_found``, then sends)
    not_found: tuple[str, ...] = ()
    #: what ``not_found`` is recorded as (None: the lookup's answer)
    recorded_as: str | None = None

    def tell(self, log: Any) -> None:
        """Write the ``in_doubt`` log lines of this choice to ``log``."""
        if self.key_forgotten:
            log.warning(
                "in_doubt",
                decision="key_forgotten",
                earlier_requests=self.fields["earlier_requests"],
            )
        say = log.warning if self.warn else log.info
        say("in_doubt", decision=self.decision, **self.fields)


#: the outcomes that say the provider certainly did not accept the message
REFUSED = (AttemptStatus.FAILED_TRANSIENT, AttemptStatus.FAILED_PERMANENT)


@quick_init
@dataclass(frozen=True, slots=True)
class Route:
    """Where the next attempt of a delivery goes, and why."""

    #: the channel whose provider gets the request
    to: str
    #: ``first``: the first of the chain that has not refused it for good; ``pinned``:
    #: an earlier request to ``to`` may have arrived, so only ``to`` may get it;
    #: ``failover``: ``previous`` certainly did not accept it, ``to`` is next in the
    #: chain; ``again``: the chain's end refused it for now, it starts over (after a
    #: backoff) from the first that has not refused it for good; ``exhausted``: every
    #: channel of the chain refused it for good (the delivery fails, nothing is sent)
    why: Literal["first", "pinned", "failover", "again", "exhausted"]
    #: the channel of the attempt before, when the route moved on from it
    previous: str | None = None


def route(chain: Sequence[str], history: Sequence[Attempt], doubtful: Sequence[Attempt]) -> Route:
    """The channel of ``chain`` (the delivery's own, then its fallbacks) that the next
    attempt goes to, from the delivery's attempts since the operator's last release
    (``history``, oldest first) and those of them that may have arrived (``doubtful``).

    The ledger decides, not a worker's memory, so the route is the same on any worker
    and after any crash. An attempt without a provider (written before schema 6) went to
    the delivery's own channel.
    """
    home = chain[0]
    if doubtful:  # never a second provider while the first one may have it
        return Route(doubtful[-1].provider or home, "pinned")
    gone = _refused_for_good(chain, history)  # read once: a route asks it up to thrice
    left = _open(chain, gone) if gone else chain
    if not left:  # every one refused for good: nothing to send
        return Route(home, "exhausted")
    last = history[-1] if history else None
    if last is not None and last.status in REFUSED:
        previous = last.provider or home
        following = _after(chain, gone, previous)
        if following is not None:
            return Route(following, "failover", previous)
        return Route(left[0], "again", previous)
    return Route(left[0], "first")


def still_open(
    chain: Sequence[str], history: Sequence[Attempt], refused: str | None = None
) -> list[str]:
    """The channels of ``chain`` that have not refused for good (``refused``: one that
    has just done so too)."""
    gone = _refused_for_good(chain, history)
    if refused is not None:
        gone.add(refused)
    return _open(chain, gone)


def _open(chain: Sequence[str], gone: set[str]) -> list[str]:
    """The channels of ``chain`` not in ``gone``, in order."""
    return [c for c in chain if c not in gone]


def next_provider(
    chain: Sequence[str], history: Sequence[Attempt], after: str, *, refused: bool = False
) -> str | None:
    """The channel after ``after`` in ``chain`` that has not refused for good (a
    permanent failure in ``history``; ``refused``: ``after`` has just done so too);
    None at the chain's end."""
    gone = _refused_for_good(chain, history)
    if refused:
        gone.add(after)
    return _after(chain, gone, after)


def _after(chain: Sequence[str], gone: set[str], after: str) -> str | None:
    """The channel after ``after`` in ``chain`` not in ``gone`` (None: none is)."""
    rest = chain[chain.index(after) + 1 :] if after in chain else chain
    return next((c for c in rest if c not in gone), None)


def _refused_for_good(chain: Sequence[str], history: Sequence[Attempt]) -> set[str]:
    if not history:  # a first attempt: no comprehension to run
        return set()
    return {a.provider or chain[0] for a in history if a.status is AttemptStatus.FAILED_PERMANENT}


def request_timeout(channel: Channel, settings: WorkerSettings) -> float:
    """How long one request of ``channel`` may take: its provider's ``timeout`` if it
    names one, else the worker's ``request_timeout``."""
    named = getattr(channel.provider, "timeout", None)
    if isinstance(named, int | float) and not isinstance(named, bool) and named > 0:
        return float(named)
    return settings.request_timeout


def asks_provider(channel: Channel) -> bool:
    """Whether the in-doubt policy asks the provider (``lookup``) before it decides."""
    return bool(channel.lookup) and isinstance(channel.provider, Reconcilable)


@dataclass(slots=True, kw_only=True)
class Decisions:
    settings: WorkerSettings
    clock: Clock
    rng: random.Random
    #: the channels whose effect is written in the finish's own commit (``Channel.
    #: in_commit``): an earlier attempt on one of them that never committed had none
    in_commit: frozenset[str] = frozenset()

    def after_request(
        self,
        claim: Claim,
        channel: Channel,
        outcome: AttemptOutcome,
        error: Exception | None,
        chain: Sequence[str] = (),
    ) -> Finish:
        """docs/design.md, step 7: what the outcome means for the delivery and the job.

        ``channel``: the one the request went to; ``chain``: the delivery's channel and
        its fallbacks. A definite non-acceptance with a next channel in the chain, and
        no earlier request in doubt, fails over: the next attempt, at once.
        """
        if outcome.status in REFUSED and not claim.doubtful and channel.name in chain:
            permanent = outcome.status is AttemptStatus.FAILED_PERMANENT
            following = next_provider(chain, claim.history, channel.name, refused=permanent)
            if following is not None:
                return self.retry(
                    claim,
                    outcome,
                    f"not accepted by {channel.name}, failing over to {following}: {outcome.error}",
                    immediate=True,
                )
            left = still_open(chain, claim.history, channel.name if permanent else None)
            if permanent and left:  # the chain's end refused for good, an earlier one for now
                return self.retry(
                    claim,
                    outcome,
                    f"refused for good by {channel.name}, {left[0]} again after a backoff: "
                    f"{outcome.error}",
                )
        if outcome.status is AttemptStatus.SUCCEEDED:
            return self.final(
                claim, DeliveryStatus.SENT, outcome=outcome, message_id=outcome.provider_message_id
            )
        if outcome.status is AttemptStatus.FAILED_PERMANENT:
            if claim.doubtful:  # this one was refused; an earlier one may have arrived
                return self.hold(
                    claim,
                    f"refused, after an earlier request in doubt: {outcome.error}",
                    outcome=outcome,
                )
            return self.final(
                claim,
                DeliveryStatus.FAILED,
                outcome=outcome,
                job=JobStatus.DEAD,
                error=outcome.error,
            )
        if outcome.status is AttemptStatus.FAILED_TRANSIENT:
            after = error.retry_after if isinstance(error, TransientFailure) else None
            return self.retry(claim, outcome, outcome.error, retry_after=after)
        # Unknown: the provider may have acted on it.
        if channel.idempotent or channel.lookup or channel.on_unknown is OnUnknown.RETRY:
            return self.retry(claim, outcome, outcome.error, exhausted=DeliveryStatus.IN_DOUBT)
        if channel.on_unknown is OnUnknown.HOLD:
            return self.hold(claim, f"held: {outcome.error}", outcome=outcome)
        return self.final(
            claim,
            DeliveryStatus.SENT,
            outcome=outcome,
            doubt=Doubt.ASSUMED_SENT,
            error=outcome.error,
        )

    def in_doubt(self, claim: Claim, channel: Channel, lookup: Lookup | None) -> InDoubt:
        """docs/design.md, step 4: an earlier request may have reached the provider.
        ``lookup``: the provider's answer when it was asked (``asks_provider``), else None.

        A claim the recipient's preferences withhold (``Claim.withheld``) sends
        nothing more whatever the policy: the provider's answer settles it (found:
        sent; not found, once no earlier request can land: suppressed), else the
        channel's choice between assuming it sent and holding it for an operator (a
        policy that would send again holds it). Earlier requests that all went to
        in-commit channels (the inbox) are no doubt at all (``_unwritten``)."""
        earlier = [a.provider_request_id for a in claim.doubtful]
        if not self.may_have_arrived(claim):
            return self._unwritten(claim, earlier)
        if lookup is not None:
            return self._after_lookup(claim, lookup, earlier)
        said: dict[str, Any] = {"earlier_requests": earlier}
        forgotten = self.forgotten(claim, channel)
        forgot = channel.idempotent and forgotten
        if claim.withheld is not None:
            said["withheld"] = claim.withheld
            if channel.on_unknown is OnUnknown.ASSUME_SENT:
                assumed = self.final(claim, DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT)
                return InDoubt(decision="assume_sent", finish=assumed, warn=True, fields=said)
            held = self.hold(
                claim,
                f"held: {claim.withheld} while an earlier request may have been delivered",
            )
            return InDoubt(decision="hold", finish=held, warn=True, fields=said)
        if channel.idempotent and not forgotten:
            return InDoubt(decision="resend_same_key", finish=None, warn=False, fields=said)
        # past its dedup window an idempotent provider forgot the key: as if it had none
        if channel.on_unknown is OnUnknown.RETRY:
            return InDoubt(
                decision="resend_at_least_once",
                finish=None,
                warn=True,
                fields=said,
                key_forgotten=forgot,
            )
        if channel.on_unknown is OnUnknown.HOLD:
            held = self.hold(claim, "held: an earlier request may have been delivered")
            return InDoubt(
                decision="hold", finish=held, warn=True, fields=said, key_forgotten=forgot
            )
        assumed = self.final(claim, DeliveryStatus.SENT, doubt=Doubt.ASSUMED_SENT)
        return InDoubt(
            decision="assume_sent", finish=assumed, warn=True, fields=said, key_forgotten=forgot
        )

    def forgotten(self, claim: Claim, channel: Channel) -> bool:
        """Whether a resend of this claim could reach the provider after it forgot an
        earlier request's key (its ``dedup_window``, counted from the earliest moment
        it can have seen that request): the resend may leave until the claim's send
        deadline and land until the request timeout after that."""
        window = channel.dedup_window
        if window is None:
            return False
        lands_by = claim.now + self.settings.send_within + request_timeout(channel, self.settings)
        return any(a.requested_at + window <= lands_by for a in claim.doubtful)

    def may_have_arrived(self, claim: Claim) -> list[Attempt]:
        """The claim's earlier requests that may have had an effect (``rules.
        may_have_arrived``: not those of an in-commit channel, whose commit never came)."""
        return rules.may_have_arrived(claim.doubtful, claim.delivery.channel, self.in_commit)

    def _unwritten(self, claim: Claim, earlier: list[str]) -> InDoubt:
        """Every earlier request went to a channel whose effect is written by its
        finish's own commit (the inbox) and that commit never came: nothing arrived,
        whatever the policy (a commit whose claim no longer holds writes nothing, so
        none can come now). They are recorded as not written (``rules.UNWRITTEN``)."""
        return self._none_arrived(
            claim,
            earlier,
            send="unwritten_send",
            withheld="unwritten_withheld",
            why="no earlier request was written",
            recorded_as=rules.UNWRITTEN,
        )

    def _none_arrived(
        self,
        claim: Claim,
        earlier: list[str],
        *,
        send: InDoubtDecision,
        withheld: InDoubtDecision,
        why: str,
        doubt: Doubt | None = None,
        recorded_as: str | None = None,
    ) -> InDoubt:
        """None of the earlier requests arrived (``why``): they are recorded so
        (``not_found``, as ``recorded_as``), and the delivery goes on out of doubt: sent
        (``send``), or suppressed where the preferences now refuse it (``withheld``, its
        record's doubt ``doubt``)."""
        said: dict[str, Any] = {"earlier_requests": earlier}
        if claim.withheld is None:
            return InDoubt(
                decision=send,
                finish=None,
                warn=False,
                fields=said,
                not_found=tuple(earlier),
                recorded_as=recorded_as,
            )
        return InDoubt(
            decision=withheld,
            finish=self.final(
                claim,
                DeliveryStatus.SUPPRESSED,
                doubt=doubt,
                reason=claim.withheld,
                error=f"suppressed: {claim.withheld} ({why})",
            ),
            warn=False,
            fields={**said, "withheld": claim.withheld},
            not_found=tuple(earlier),
            recorded_as=recorded_as,
        )

    def _after_lookup(self, claim: Claim, lookup: Lookup, earlier: list[str]) -> InDoubt:
        """The in-doubt policy of a provider that was asked whether it has the key."""
        if lookup.error is not None:
            return InDoubt(
                decision="lookup_failed",
                finish=self.retry(claim, None, f"lookup failed: {lookup.error}"),
                warn=True,
                fields={"error": str(lookup.error)},
            )
        if lookup.found is not None:
            message_id = lookup.found.provider_message_id
            return InDoubt(
                decision="reconciled_sent",
                finish=self.final(
                    claim, DeliveryStatus.SENT, doubt=Doubt.RESOLVED, message_id=message_id
                ),
                warn=False,
                fields={"earlier_requests": earlier, "provider_message_id": message_id},
            )
        if claim.unsettled_until is not None:
            # "Not found" proves nothing while an earlier request may still land.
            return InDoubt(
                decision="wait_until_settled",
                finish=self.wait_until_settled(claim, claim.unsettled_until),
                warn=False,
                fields={"earlier_requests": earlier, "until": round(claim.unsettled_until, 3)},
            )
        # settled and not found: it never arrived
        return self._none_arrived(
            claim,
            earlier,
            send="lookup_not_found_send",
            withheld="lookup_not_found_withheld",
            why="the provider has no earlier request",
            doubt=Doubt.RESOLVED,
        )

    def final(
        self,
        claim: Claim,
        status: DeliveryStatus,
        *,
        outcome: AttemptOutcome | None = None,
        doubt: Doubt | None = None,
        message_id: str | None = None,
        job: JobStatus = JobStatus.COMPLETED,
        error: str | None = None,
        reason: str | None = None,
    ) -> Finish:
        return Finish(
            reason=reason,
            delivery_id=claim.delivery.id,
            job_id=claim.job.id,
            token=claim.token,
            now=self.clock.now(),
            attempt=outcome,
            delivery_status=status,
            doubt=doubt,
            provider_message_id=stored_message_id(message_id),
            error=stored_text(error),
            job_status=job,
        )

    def hold(self, claim: Claim, error: str, *, outcome: AttemptOutcome | None = None) -> Finish:
        return self.final(
            claim,
            DeliveryStatus.IN_DOUBT,
            outcome=outcome,
            doubt=Doubt.HELD,
            job=JobStatus.DEAD,
            error=error,
        )

    def retry(
        self,
        claim: Claim,
        outcome: AttemptOutcome | None,
        error: str | None,
        *,
        retry_after: float | None = None,
        exhausted: Exhausted = DeliveryStatus.FAILED,
        immediate: bool = False,
    ) -> Finish:
        """Try again after a backoff (``immediate``: at once); when the attempts are
        over, a dead letter: held in doubt if this or an earlier request may have arrived
        (or ``exhausted`` says so), else failed."""
        job = claim.job
        if job.attempts >= job.max_attempts:
            doubtful = bool(self.may_have_arrived(claim)) or (
                outcome is not None and outcome.status is AttemptStatus.UNKNOWN
            )
            if exhausted is DeliveryStatus.IN_DOUBT or doubtful:
                return self.hold(claim, f"attempts exhausted: {error}", outcome=outcome)
            return self.final(
                claim,
                DeliveryStatus.FAILED,
                outcome=outcome,
                job=JobStatus.DEAD,
                error=f"attempts exhausted: {error}",
            )
        delay = 0.0 if immediate else self.backoff(job.attempts)  # immediate: a failover
        if retry_after is not None and not immediate:
            delay = max(delay, retry_after)
        return Finish(
            delivery_id=claim.delivery.id,
            job_id=job.id,
            token=claim.token,
            now=self.clock.now(),
            attempt=outcome,
            delivery_status=DeliveryStatus.PENDING,
            error=stored_text(error),
            job_status=JobStatus.RETRY_SCHEDULED,
            delay=delay,  # from the commit, in the store's time
        )

    def put_back(
        self, claim: Claim, outcome: AttemptOutcome | None, error: str | None, *, delay: float
    ) -> Finish:
        """Try again in ``delay`` seconds, the claim not counted as an attempt (nothing
        was sent for a reason of kirim's own, such as a missed rate slot)."""
        return Finish(
            delivery_id=claim.delivery.id,
            job_id=claim.job.id,
            token=claim.token,
            now=self.clock.now(),
            attempt=outcome,
            delivery_status=DeliveryStatus.PENDING,
            error=stored_text(error),
            job_status=JobStatus.RETRY_SCHEDULED,
            delay=delay,
            refund_attempt=True,
        )

    def wait_until_settled(self, claim: Claim, until: float) -> Finish:
        """Put the job back until ``until`` (store time), when no earlier request can
        still land; the claim does not count as an attempt."""
        return Finish(
            delivery_id=claim.delivery.id,
            job_id=claim.job.id,
            token=claim.token,
            now=self.clock.now(),
            attempt=None,
            delivery_status=DeliveryStatus.PENDING,
            error="waiting until no earlier request can still land",
            job_status=JobStatus.RETRY_SCHEDULED,
            run_at=until,
            refund_attempt=True,
        )

    def backoff(self, attempts: int) -> float:
        """Exponential backoff with full jitter."""
        cap = min(self.settings.backoff_max, self.settings.backoff_base * 2 ** (attempts - 1))
        return self.rng.uniform(0, cap)
