"""The engine's verbs on workflow runs (``kirim.runs``, docs/workflows.md): what
``notify_event`` does for a type with ``steps``, ``kirim run`` and the dashboard call.

An event of a type with steps starts one run per recipient (``start``) instead of
one delivery per channel: every send step's message is rendered then, so a template
error is raised before anything is written, and a run's deliveries are those
messages, made by a worker when their steps come (``kirim.worker.flows``). An event
whose name is in a type's ``cancel_on`` cancels that type's waiting runs whose event
had the same value of its ``cancel_key`` (``cancel_by_event``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kirim.errors import NotFound
from kirim.keys import canonical_json, payload_hash
from kirim.notify.steps import Send
from kirim.runs import EventRun, Run, cancel_value, run_key
from kirim.store.event_writes import CancelBy, EventWrite
from kirim.store.flows import Canceled, NewRun, Started
from kirim.views import iso

if TYPE_CHECKING:
    from kirim.clock import Clock
    from kirim.config import Config
    from kirim.notify.fanout import Event
    from kirim.notify.types import NotificationType
    from kirim.store.base import Store


def plan_runs(event: Event, max_attempts: int) -> list[NewRun]:
    """One ``NewRun`` per recipient of ``event`` (its type has steps)."""
    ntype = event.type
    channels = {s.channel for s in ntype.steps if isinstance(s, Send)}
    steps_json = canonical_json([s.to_json() for s in ntype.steps])
    value = cancel_value(event.data, ntype.cancel_key)
    out = []
    for r in event.recipients:
        messages: dict[str, Mapping[str, str]] = {}
        for ch in sorted(channels):
            text = event.rendered[(r.id, ch)]
            messages[ch] = {
                "recipient": r.address(ch),
                "payload": text,
                "payload_hash": payload_hash(text),
                "locale": r.locale or "",  # a digest's later send renders in it again
            }
        out.append(
            NewRun(
                key=run_key(ntype.name, event.event_id, r.id),
                type=ntype.name,
                event_id=event.event_id,
                recipient_id=r.id,
                steps_json=steps_json,
                data_json=event.data_json,
                messages=messages,
                max_attempts=max_attempts,
                cancel_value=value,
            )
        )
    return out


def event_runs(started: Sequence[Started]) -> tuple[EventRun, ...]:
    return tuple(
        EventRun(
            recipient_id=s.run.recipient_id,
            run_id=s.run.id,
            key=s.run.key,
            created=s.created,
            status=s.run.status,
        )
        for s in started
    )


class Runs:
    """Mixed into ``Kirim``: its store, clock, configuration and types."""

    if TYPE_CHECKING:
        config: Config
        store: Store
        clock: Clock
        types: Mapping[str, NotificationType]

    def _cancels_of(self, event: str, data: Mapping[str, Any]) -> list[CancelBy]:
        """What an event named ``event`` cancels: the waiting runs of every type whose
        ``cancel_on`` names it, with the value ``data`` has for the type's
        ``cancel_key``."""
        out = []
        for ntype in self.types.values():
            key, value = ntype.cancel_key, cancel_value(data, ntype.cancel_key)
            if event not in ntype.cancel_on or key is None or value is None:
                continue
            why = f"event {event} ({key} = {data[key]})"
            out.append(CancelBy(type=ntype.name, key=key, value=value, why=why))
        return out

    async def cancel_by_event(self, event: str, data: Mapping[str, Any]) -> list[Canceled]:
        """Cancel, in one transaction, what an event named ``event`` with ``data``
        cancels (``_cancels_of``; ``notify_event`` does it in the event's own)."""
        cancels = self._cancels_of(event, data)
        if not cancels:
            return []
        written = await self.store.record_event(EventWrite(cancels=cancels), now=self.clock.now())
        return list(written.canceled)

    async def get_run(self, run_id: int) -> Run | None:
        return await self.store.get_run(run_id)

    async def must_get_run(self, run_id: int) -> Run:
        found = await self.store.get_run(run_id)
        if found is None:
            raise NotFound(f"no run {run_id}")
        return found

    async def cancel_run(self, run_id: int, *, why: str = "canceled by an operator") -> Canceled:
        """Cancel one run (``kirim run cancel``): ``NotFound`` when there is none."""
        done = await self.store.cancel_run(run_id, why=why, now=self.clock.now())
        if done is None:
            raise NotFound(f"no run {run_id}")
        return done


def canceled_json(c: Canceled) -> dict[str, Any]:
    return {
        "run_id": c.run.id,
        "changed": c.changed,
        "status": str(c.run.status),
        "canceled": list(c.canceled),
        "held": list(c.held),
        "left": {str(k): v for k, v in c.left.items()},
        "why": c.run.why,
        "at": iso(c.run.updated_at),
        **({} if c.too_late is None else {"too_late": c.too_late}),
    }


__all__ = ["EventRun", "Runs", "canceled_json", "event_runs", "plan_runs"]
