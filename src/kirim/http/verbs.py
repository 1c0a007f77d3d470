"""The operator's verbs the dashboard offers, on one row and on a selection of rows.

Each verb is one entry of ``VERBS``: its name (the form's ``action``, the button's
class), its label, which rows offer it, how it runs (a ``Kirim`` method, the same as
the CLI's and the API's), and what it may do to the user: the confirmation of a bulk
action says, for each notification, whether a second copy is possible. Adding a verb
(``reconcile`` was) is adding one ``Verb`` to the tuple.

Whether a retry may make a second copy is the engine's rule
(``Kirim.second_copy_possible``, the same for the API and the CLI): an earlier request
may have reached the provider, the worker will not ask the provider first (no
lookup), and no idempotency key will keep the resend from being a second message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from kirim import machine, operations
from kirim.engine import Kirim
from kirim.model import Attempt, AttemptStatus, DeliveryStatus
from kirim.views import Record, iso


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """What a verb may do to one notification, in words; ``twice``: a second copy of
    it may reach the user."""

    text: str
    twice: bool = False
    #: an earlier request may still land until then: the verb is refused before it
    wait_until: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verb:
    name: str
    label: str
    #: the flash message codes of one row's button (kept: links and tests name them)
    done_code: str
    refused_code: str
    #: what was done, and why it was refused, after "notification N"
    done_text: str
    refused_text: str
    #: whether a row in this state offers it
    offered: Callable[[Record], bool]
    run: Callable[[Kirim, int], Awaitable[object]]
    #: what it may do, by the engine's rules, at the time given
    effect: Callable[[Kirim, Record, float], Effect]


def _retry_offered(record: Record) -> bool:
    return machine.can_retry(record.delivery, [record.job])


def _cancel_offered(record: Record) -> bool:
    return machine.can_cancel(record.delivery)


def _pending(attempts: Sequence[Attempt], now: float) -> float | None:
    """Until when an earlier request may still land (None: every attempt is settled)."""
    later = [a.settles_at for a in attempts if not a.settled(now) and a.settles_at is not None]
    return max(later) if later else None


def _retry_effect(app: Kirim, record: Record, now: float) -> Effect:
    found = _copies(app, record, now)
    until = _pending(record.attempts, now)
    if until is None:
        return found
    return Effect(
        text=f"{found.text}; refused until {iso(until)}: an earlier request may still land "
        "until then",
        twice=found.twice,
        wait_until=until,
    )


def _copies(app: Kirim, record: Record, now: float) -> Effect:
    """Whether a retry may make a second copy (``Kirim.second_copy_possible``, the rule
    the API and the CLI use too), in words."""
    d, attempts = record.delivery, record.attempts
    channels = app.known_channels()
    if app.second_copy_possible(record):
        why = "an earlier request may have reached the provider"
        if d.channel not in channels:
            return Effect(
                text=f"may arrive twice: {why}, and {d.channel} is not configured here",
                twice=True,
            )
        others = [c for c in channels[d.channel].chain if c != d.channel]
        if others:
            return Effect(
                text=f"may arrive twice: {why}, and the retry may go on to "
                f"{', '.join(others)}, whose provider has no copy of it to deduplicate",
                twice=True,
            )
        return Effect(
            text=f"may arrive twice: {why}, and neither a lookup nor {d.channel}'s "
            "idempotency key keeps the resend from being a second message",
            twice=True,
        )
    if not operations.doubtful(record):
        if attempts:
            return Effect(text="no second copy: no request may have reached the provider")
        return Effect(text="no second copy: no request was sent")
    if operations.asks_first(record, channels):
        return Effect(text="no second copy: the worker asks the provider first (lookup)")
    return Effect(
        text=f"no second copy: {d.channel} honours idempotency keys, and the same key goes again"
    )


def _cancel_effect(app: Kirim, record: Record, now: float) -> Effect:
    d, attempts = record.delivery, record.attempts
    until = _pending(attempts, now)
    if until is not None:
        return Effect(
            text=f"refused until {iso(until)}: an earlier request may still land until then",
            wait_until=until,
        )
    if d.status is DeliveryStatus.IN_DOUBT or any(
        a.status in (AttemptStatus.REQUESTED, AttemptStatus.UNKNOWN) for a in attempts
    ):
        return Effect(
            text="nothing more is sent; an earlier request may still have reached the user"
        )
    return Effect(text="nothing more is sent")


def _reconcile_offered(record: Record) -> bool:
    """A delivery in doubt (held, or sent under an assumption): whether its provider can
    be asked, the verb says when it runs."""
    return machine.can_reconcile(record.delivery)


def _reconcile_effect(app: Kirim, record: Record, now: float) -> Effect:
    until = _pending(record.attempts, now)
    if until is not None:
        return Effect(
            text=f"refused until {iso(until)}: an earlier request may still land until then",
            wait_until=until,
        )
    return Effect(
        text="nothing is sent now: the provider is asked whether it has it, and the doubt "
        "settled either way (sent; or, not found, queued again while it has attempts "
        "left, else failed so that a retry sends no second copy)"
    )


async def _reconcile(app: Kirim, delivery_id: int) -> object:
    return await app.reconcile(delivery_id, by="id")


async def _retry(app: Kirim, delivery_id: int) -> object:
    return await app.retry(delivery_id, by="id")


async def _cancel(app: Kirim, delivery_id: int) -> object:
    return await app.cancel(delivery_id, by="id")


# fmt: off
VERBS: Mapping[str, Verb] = {
    v.name: v
    for v in (
        Verb(name="retry", label="Retry", done_code="retried", refused_code="not_retried",
             done_text="requeued with a fresh job",
             refused_text="is not dead-lettered: nothing to retry",
             offered=_retry_offered, run=_retry, effect=_retry_effect),
        Verb(name="cancel", label="Cancel", done_code="canceled", refused_code="not_canceled",
             done_text="canceled", refused_text="cannot be canceled in its current state",
             offered=_cancel_offered, run=_cancel, effect=_cancel_effect),
        Verb(name="reconcile", label="Reconcile", done_code="reconciled",
             refused_code="not_reconciled",
             done_text="settled by asking its provider",
             refused_text="cannot be reconciled: its provider cannot be asked (no lookup), "
             "does not answer, or it is not in doubt",
             offered=_reconcile_offered, run=_reconcile, effect=_reconcile_effect),
    )
}
# fmt: on


__all__ = ["VERBS", "Effect", "Verb"]
