"""The ``full`` workload: a drawn ``World`` driven through real apps and workers.

``Full`` builds the world's channels (one ``ProviderModel`` each, with its dedup
window, failure meanings, bounces and callbacks), its notification types, and each
worker's own view of them (a worker may lack the types or a channel). The driver
(``drive``) sets every recipient's first preferences before the workers start, then,
each at its virtual time: the application's sends (a plain ``notify``, or an event of
a type through ``notify_event``), the preference changes, and the operator's actions
through the engine's verbs (retry every dead letter, cancel, reconcile, prune). The
providers' callbacks come in on a host of their own (``H``, the HTTP service) through
``Kirim.confirm``. After the run, ``probe`` asks again for every delivery that prune
removed while its key's tombstone lasts, and records the answer.

Everything that happened goes into the ground truth (``FullTruth``) for the
invariants of ``kirim.explore.checks``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kirim.addresses import Address
from kirim.channels import Channel
from kirim.engine import Kirim
from kirim.errors import KirimError, NotSettled
from kirim.explore.loop import WORKER_NAMES, Host
from kirim.explore.provider import CallbackRecord, GroundTruth, ProviderModel
from kirim.explore.streams import Readers
from kirim.explore.topics import TopicDriver
from kirim.explore.trace import Trace
from kirim.explore.world import ChannelPlan, World
from kirim.model import OnUnknown
from kirim.preferences import Preferences
from kirim.providers.inbox import InboxProvider


@dataclass(slots=True)
class SendRecord:
    """One send of the driver and what kirim answered (per delivery)."""

    event_id: str
    type: str | None
    at: float
    #: (recipient, channel, delivery id, key, status, reason, run_at, digest, created)
    outcomes: list[tuple[str, str, int, str, str, str | None, float | None, str | None, bool]] = (
        field(default_factory=list)
    )


@dataclass(slots=True)
class PrefsRecord:
    recipient: str
    prefs: Preferences | None
    started: float
    committed: float | None = None
    #: the order of the driver's steps (``FullTruth.tick``) when the write began and
    #: when it returned: two writes in one virtual instant are told apart by these
    begun: int = 0
    ended: int | None = None


@dataclass(slots=True)
class ActionRecord:
    kind: str
    delivery: int | None
    at: float
    done: bool
    detail: str = ""
    #: a retry: the answer said a second copy is possible (``second_copy_possible``)
    warned: bool | None = None
    #: a reconcile: the status its answer gave, and whether its job had attempts left
    answered: str | None = None
    attempts_left: bool | None = None


@dataclass(slots=True)
class ProbeRecord:
    """A pruned delivery asked for again while its tombstone lasts."""

    delivery: int
    key: str
    status: str
    doubt: str | None
    created: bool


@dataclass(slots=True)
class FullTruth:
    sends: list[SendRecord] = field(default_factory=list)
    prefs: list[PrefsRecord] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)
    probes: list[ProbeRecord] = field(default_factory=list)
    #: every recipient's addresses at the end (retired ones marked)
    addresses: list[Address] = field(default_factory=list)
    ticks: int = 0

    def tick(self) -> int:
        """The next step of the driver's own order (virtual time can stand still)."""
        self.ticks += 1
        return self.ticks


class Full:
    """The world's channels, types and drivers, for one schedule."""

    def __init__(
        self,
        world: World,
        *,
        truth: GroundTruth,
        trace: Trace,
        seed: int,
        time: Callable[[], float],
    ) -> None:
        self.world = world
        self.truth = truth
        self.full = FullTruth()
        self.trace = trace
        self.time = time
        self.http = Host("H")
        self.readers = Readers(world, trace, time)
        self.ops: Kirim | None = None
        horizon = max(p.settings.request_timeout for p in world.workers)
        lease = min(p.settings.lease for p in world.workers)
        self.models = {
            c.name: ProviderModel(
                truth=truth,
                trace=trace,
                host=Host("P"),
                seed=seed,
                idempotent=c.idempotent,
                lease=lease,
                timeout=c.timeout,
                lookup_lag=c.lookup_lag,
                name=c.name,
                dedup_window=c.dedup_window,
                bounce=c.bounce,
                meaning_503=c.meaning_503,
                meaning_400=c.meaning_400,
                classes=c.classes(),
                horizon=horizon,
                horizons={
                    WORKER_NAMES[i]: p.settings.request_timeout for i, p in enumerate(world.workers)
                },
                post=self.post if c.callbacks else None,
                callback_key=c.callback_key,
                callback_host=self.http,
                collapse=c.collapse,
                collapse_window=c.collapse_window,
                dead=frozenset(
                    a.address for a in world.addresses if a.channel == c.name and a.dead
                ),
                address_kind="apns" if c.devices else None,
            )
            for c in world.channels
        }
        self.channels = {c.name: self._channel(c) for c in world.channels}
        #: the operator's channels: ``lookup`` also where only it asks (``operator_lookup``)
        self.operator_channels = {
            c.name: replace(self.channels[c.name], lookup=True)
            if c.operator_lookup
            else self.channels[c.name]
            for c in world.channels
        }
        self.types = world.notification_types()
        self.topics = None if world.topics is None else TopicDriver(world.topics, trace.add)

    def _channel(self, plan: ChannelPlan) -> Channel:
        from kirim.callbacks import CallbackAuth

        if plan.inbox:  # the real provider: the feed write is kirim's own (checks.feed)
            return Channel(
                name=plan.name,
                provider=InboxProvider(),
                on_unknown=OnUnknown(plan.on_unknown),
                fallback=plan.fallback,
                rate=plan.rate,
            )
        return Channel(
            name=plan.name,
            provider=self.models[plan.name],
            on_unknown=OnUnknown(plan.on_unknown),
            lookup=plan.lookup,
            # a collapse provider's resend is safe while the device shows the first
            dedup_window=plan.collapse_window if plan.collapse else plan.dedup_window,
            fallback=plan.fallback,
            callback=CallbackAuth(token="explore-callback-token") if plan.callbacks else None,
            rate=plan.rate,
        )

    def channels_of(self, index: int) -> dict[str, Channel]:
        """The channels worker ``index`` has."""
        has = self.world.workers[index].channels
        return {n: c for n, c in self.channels.items() if has is None or n in has}

    def types_of(self, index: int) -> list[Any]:
        return list(self.types) if self.world.workers[index].types else []

    # -- the driver --------------------------------------------------------------------

    async def first_preferences(self, app: Kirim) -> None:
        """The preferences of the world set before the run (their changes come later),
        and the recipients' device addresses."""
        for change in self.world.prefs:
            if change.at < 0:
                await self._prefs(app, change.recipient, change.prefs)
        for a in self.world.addresses:
            await app.add_address(a.recipient, a.channel, a.address)

    async def settle_addresses(self, app: Kirim) -> None:
        """After the run: every recipient's addresses as the store keeps them."""
        for person in self.world.recipients:
            self.full.addresses += await app.addresses(person)

    async def drive(self, app: Kirim) -> None:
        """Each send, preference change and operator action at its virtual time."""
        self.ops = app
        steps: list[tuple[float, int, Any]] = []
        steps += [(s.at, i, s) for i, s in enumerate(self.world.sends)]
        steps += [(c.at, 100 + i, c) for i, c in enumerate(self.world.prefs) if c.at >= 0]
        steps += [(a.at, 200 + i, a) for i, a in enumerate(self.world.actions)]
        steps += [(a.at, 300 + i, a) for i, a in enumerate(self.world.feed_acts)]
        if app.store.dialect == "sqlite":  # on PostgreSQL a hub LISTENs: not on this loop
            self.readers.start(app)
        if self.topics is not None:
            steps += [(s.at, 400 + i, s) for i, s in enumerate(self.topics.plan.steps)]
        for at, _, step in sorted(steps, key=lambda s: (s[0], s[1])):
            await asyncio.sleep(max(0.0, at - self.time()))
            kind = type(step).__name__
            if kind == "Send":
                await self._send(app, step)
            elif kind == "PrefsChange":
                await self._prefs(app, step.recipient, step.prefs)
            elif kind == "FeedAct":
                await self.readers.act(app, step)
            elif self.topics is not None and kind in ("SubStep", "TopicSend", "TopicCancel"):
                await self.topics.step(app, step)
            else:
                await self._act(app, step)
        if self.topics is not None:
            await self.topics.wait_done(app)

    async def _send(self, app: Kirim, send: Any) -> None:
        record = SendRecord(event_id=send.event_id, type=send.type, at=self.time())
        if send.type is None:
            made = await app.notify(
                send.event_id, send.recipients[0], send.channel, dict(send.data)
            )
            record.outcomes.append(
                (
                    send.recipients[0],
                    send.channel,
                    made.delivery_id,
                    made.idempotency_key,
                    str(made.status),
                    None,
                    None,
                    None,
                    made.created,
                )
            )
        else:
            result = await app.notify_event(
                send.type, list(send.recipients), dict(send.data), event_id=send.event_id
            )
            for d in result.deliveries:
                record.outcomes.append(
                    (
                        d.recipient_id,
                        d.channel,
                        d.delivery_id,
                        d.idempotency_key,
                        str(d.status),
                        d.reason,
                        d.run_at,
                        d.digest,
                        d.created,
                    )
                )
        self.full.sends.append(record)
        shown = " ".join(
            f"{o[0]}:{o[2]}:{o[4]}{'' if o[8] else '(again)'}" for o in record.outcomes
        )
        self.trace.add(f"send {send.event_id} {send.type or send.channel} {shown}", host="S")

    async def _prefs(self, app: Kirim, recipient: str, prefs: Preferences | None) -> None:
        record = PrefsRecord(
            recipient=recipient, prefs=prefs, started=self.time(), begun=self.full.tick()
        )
        self.full.prefs.append(record)
        if prefs is None:
            await app.delete_preferences(recipient)
        else:
            await app.set_preferences(prefs)
        record.committed = self.time()
        record.ended = self.full.tick()
        shown = "deleted" if prefs is None else _shown(prefs)
        self.trace.add(f"prefs {recipient} {shown}", host="S")

    def delivery_ids(self) -> list[int]:
        """The deliveries made so far, in the order they were made."""
        seen: list[int] = []
        for s in self.full.sends:
            for o in s.outcomes:
                if o[2] not in seen:
                    seen.append(o[2])
        return seen

    async def _act(self, app: Kirim, action: Any) -> None:
        made = self.delivery_ids()
        if action.kind == "prune":
            await self._prune(app)
            return
        if action.kind == "retry":
            targets = [r.delivery.id for r in await app.dead_letters()]
        else:
            targets = [made[(action.target - 1) % len(made)]] if made else []
        for did in targets:
            await self._one(app, action.kind, did)

    async def act_on(self, app: Kirim, kind: str, did: int) -> None:
        """One operator action on one delivery (the fault plan's cancels and retries)."""
        await self._one(app, kind, did)

    async def _one(self, app: Kirim, kind: str, did: int, tries: int = 5) -> None:
        for _ in range(tries):
            record = ActionRecord(kind=kind, delivery=did, at=self.time(), done=False)
            try:
                if kind == "retry":
                    before = await app.get(did, by="id")
                    if before is not None:
                        record.warned = _second_copy(app, before)
                    await app.retry(did, by="id")
                elif kind == "cancel":
                    await app.cancel(did, by="id")
                else:
                    verb = getattr(app, "reconcile", None)
                    if verb is None:
                        record.detail = "no reconcile verb"
                        self.full.actions.append(record)
                        return
                    answer = await verb(did, by="id")
                    job = answer.job
                    record.answered = str(answer.delivery.status)
                    record.attempts_left = job is not None and job.attempts < job.max_attempts
            except NotSettled as exc:
                record.detail = f"not settled until {exc.retry_at:.3f}"
                self.full.actions.append(record)
                self.trace.add(f"operator_{kind} delivery={did} {record.detail}", host="O")
                await asyncio.sleep(min(120.0, max(0.1, exc.retry_at - app.clock.now())))
                continue
            except KirimError as exc:
                record.detail = f"refused: {exc}"
            else:
                record.done = True
                record.at = self.time()
            self.full.actions.append(record)
            self.trace.add(
                f"operator_{kind} delivery={did} done={record.done} {record.detail}".rstrip(),
                host="O",
            )
            if record.done and kind == "cancel":
                self.truth.cancels.setdefault(did, record.at)
            elif record.done and kind == "retry":
                self.truth.retries.setdefault(did, []).append(record.at)
            return

    async def _prune(self, app: Kirim) -> None:
        prune = getattr(app.store, "prune", None)
        if prune is None:
            return
        keep = min((p.settings.retention_keep or 30.0 for p in self.world.workers), default=30.0)
        result = await prune(now=app.clock.now(), keep=keep, keys=self.world.keys)
        self.full.actions.append(
            ActionRecord(
                kind="prune",
                delivery=None,
                at=self.time(),
                done=True,
                detail=f"deliveries={result.deliveries}",
            )
        )
        self.trace.add(f"operator_prune deliveries={result.deliveries}", host="O")

    # -- the providers' callbacks --------------------------------------------------------

    async def post(self, record: CallbackRecord) -> None:
        """kirim's callback endpoint, as ``POST /v1/callbacks/{channel}`` calls it."""
        app = self.ops
        self.truth.callbacks.append(record)
        if app is None:
            record.outcome = "no_app"
            return
        try:
            result = await app.confirm(
                record.copy.provider,
                record.copy.message_id,
                record.status,
                key=record.key,
                at=record.copy.at + 1.0,
            )
        except KirimError as exc:
            record.outcome = f"error: {exc}"
            return
        record.answered_at = self.time()
        record.outcome = str(result.outcome)
        record.delivery_id = result.delivery_id
        record.result_status = None if result.status is None else str(result.status)
        record.duplicate = result.duplicate
        self.trace.add(
            f"callback {record.copy.provider} {record.copy.message_id} {record.status} "
            f"outcome={record.outcome} delivery={record.delivery_id}",
            host="H",
        )

    # -- after the run -------------------------------------------------------------------

    async def probe(self, app: Kirim, pruned: list[dict[str, Any]]) -> None:
        """Ask again for every pruned delivery, as its application would."""
        for row in pruned:
            send = next((s for s in self.full.sends for o in s.outcomes if o[2] == row["id"]), None)
            if send is None:
                continue
            with contextlib.suppress(KirimError):
                if send.type is None:
                    made = await app.notify(
                        send.event_id,
                        row["recipient"],
                        row["channel"],
                        _payload(self.world, send.event_id),
                    )
                    self.full.probes.append(
                        ProbeRecord(
                            delivery=row["id"],
                            key=made.idempotency_key,
                            status=str(made.status),
                            doubt=_doubt(made),
                            created=made.created,
                        )
                    )


def _payload(world: World, event_id: str) -> dict[str, Any]:
    send = next(s for s in world.sends if s.event_id == event_id)
    return dict(send.data)


def _doubt(made: Any) -> str | None:
    doubt = getattr(made, "doubt", None)
    return None if doubt is None else str(doubt)


def _second_copy(app: Kirim, record: Any) -> bool | None:
    """What the engine says of a retry: may it give the user a second copy (None: the
    engine does not say)."""
    says = getattr(app, "second_copy_possible", None)
    return None if says is None else bool(says(record))


def _shown(prefs: Preferences) -> str:
    parts = []
    if prefs.opt_out:
        parts.append("opt_out")
    parts += [f"{k}={'on' if v else 'off'}" for k, v in sorted(prefs.channels.items())]
    if prefs.quiet_hours is not None:
        parts.append(f"quiet={prefs.quiet_hours}")
    parts.append(f"tz={prefs.timezone or 'UTC'}")
    return " ".join(parts)
