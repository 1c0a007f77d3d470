"""``POST /v1/events`` with the ``Idempotency-Key`` semantics of ``/v1/notifications``.

One request is one event of a notification type (``Kirim.notify_event``): one
delivery per recipient x channel. The request's key is the ``Idempotency-Key``
header, else the event's type and id; the event's id is the body's ``event_id``,
else the header's key. Like a notification, an event goes through two transactions:

1. *begin*: take the key (a ``kirim_requests`` row in progress), or find who has it:
   in progress with the same body, 409; completed with the same body, the stored
   response replayed; another body, 422.
2. *record*: the event's deliveries and, in the same transaction, the response kept
   for replays (``Kirim.record_event`` with the request's hold).

The key is looked up before the event is checked and rendered, so that a replay
answers its first response whatever today's configuration says; a request that is
then refused (a template error, a missing variable: 422) gives its key back. The
rendering runs off the event loop, within the sandbox's bounds (one budget for the
event, ``kirim.notify.sandbox``). Each delivery's own key comes from the event id, so the
same event sent again under another ``Idempotency-Key`` still makes no delivery
twice: its answer lists them with ``created: false``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from typing import Any

from kirim.engine import Kirim
from kirim.errors import IdempotencyKeyReused, InvalidNotification, PayloadTooLarge
from kirim.http.errors import ApiError, detail
from kirim.http.idempotency import (
    fingerprint,
    header_key,
    in_progress,
    invalid_details,
    reused,
)
from kirim.notify.fanout import Event, EventResult
from kirim.store.base import RequestBegin, RequestState

#: a request key of an event (no Idempotency-Key header) is kept under this prefix,
#: so that it never meets a delivery's key in the requests table
EVENT_KEY_PREFIX = "event\x1f"
#: the body's fields that ``Kirim.prepare_event`` names first in its refusals
_FIELDS = ("type", "recipients", "data", "event_id")


@dataclass(frozen=True, slots=True)
class EventAnswer:
    status_code: int
    body: str
    replayed: bool = False


def response_of(result: EventResult) -> tuple[int, str]:
    """201 when the event made a delivery (a workflow type's: a run), 200 when every
    one existed before."""
    created = any(d.created for d in result.deliveries) or any(r.created for r in result.runs)
    return (201 if created else 200), json.dumps(result.to_json(), ensure_ascii=False)


def request_key(key_header: str | None, type_: str, event_id: str) -> str:
    if key_header is not None:
        return key_header
    return f"{EVENT_KEY_PREFIX}{type_}\x1f{event_id}"


class EventIntake:
    """Accepts events for one server (see the module's docstring)."""

    def __init__(self, kirim: Kirim, *, hold: float) -> None:
        self.kirim = kirim
        self.hold = hold

    def prepare(self, body: dict[str, Any], event_id: str) -> Event:
        """The event checked and rendered (today's configuration); refusals as 413/422."""
        try:
            return self.kirim.prepare_event(
                body["type"], body["recipients"], body["data"], event_id=event_id
            )
        except PayloadTooLarge as exc:
            raise ApiError(
                413,
                "payload_too_large",
                str(exc),
                details=[detail("body.data", str(exc), "payload_too_large")],
            ) from None
        except InvalidNotification as exc:
            raise ApiError(
                422, "validation_error", str(exc), details=invalid_details(exc, _FIELDS)
            ) from None

    async def accept(self, body: dict[str, Any], raw: Any, key_header: str | None) -> EventAnswer:
        """The answer to one request: ``body`` the checked call's arguments, ``raw`` the
        JSON as sent (its fingerprint tells a replay from another body).

        The key is looked up first, so that a replay answers its first response
        whatever the configuration says today (a template that gained a variable, a
        channel removed); only a request that holds the key is then rendered, off the
        event loop (``asyncio.to_thread``: a heavy template never stalls the server),
        and gives its key back when it is refused."""
        given = header_key(key_header)
        event_id = body.get("event_id")
        if event_id is None:
            if given is None:
                raise ApiError(
                    422,
                    "validation_error",
                    "send the event's id as event_id, or an Idempotency-Key header",
                    details=[
                        detail("body.event_id", "required without Idempotency-Key", "missing")
                    ],
                )
            event_id = given
        key = request_key(given, body["type"], event_id)
        try:
            print_ = fingerprint(raw)
        except ApiError:
            await asyncio.to_thread(self.prepare, body, event_id)  # names the field
            raise
        token = secrets.token_hex(16)
        begin = RequestBegin(idempotency_key=key, fingerprint=print_, lock_token=token)
        slots, _ = await self.kirim.store.handle_requests(
            [begin], [], now=self.kirim.clock.now(), hold=self.hold, respond=_nothing
        )
        slot = slots[0]
        if slot.state is not RequestState.ACQUIRED:
            if slot.fingerprint != print_:
                raise reused(key if given is not None else event_id)
            if slot.state is RequestState.IN_PROGRESS:
                raise in_progress()
            return EventAnswer(slot.status_code or 200, slot.response or "", True)
        try:
            event = await asyncio.to_thread(self.prepare, body, event_id)
        except BaseException:
            await self._give_back(key, token)
            raise
        try:
            result = await self.kirim.record_event(
                event, request=(key, token), respond=response_of, fingerprint=print_
            )
        except IdempotencyKeyReused as exc:
            # the event was rolled back whole; the key is given back for a new body
            await self._give_back(key, token)
            raise ApiError(
                422,
                "idempotency_key_reused",
                f"event {event.event_id!r} was recorded before with a different {exc.field}; "
                "use a new event id for a new event",
                details=[detail(f"body.{_body_field(exc.field)}", "differs", "key_reused")],
            ) from None
        status, text = response_of(result)
        return EventAnswer(status, text)

    async def _give_back(self, key: str, token: str) -> None:
        """Release the request's key (it answered with an error: nothing is replayed)."""
        await self.kirim.store.enqueue_request(
            [], key=key, token=token, now=self.kirim.clock.now(), respond=_nothing
        )


def _nothing(_: Any) -> None:
    return None


def _body_field(field: str) -> str:
    """The body's field a delivery's differing field comes from."""
    return {"payload": "data", "recipient": "recipients"}.get(field, field)
