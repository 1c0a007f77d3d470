"""``POST /v1/notifications`` with the IETF ``Idempotency-Key`` semantics, on kirim.

The key (the ``Idempotency-Key`` header, else the body's ``key``, else kirim's
default key) is the delivery's idempotency key. A request goes through two
transactions, both in the database so that any number of servers agree:

1. *begin*: take the key (a ``kirim_requests`` row *in progress*, held for ``hold``
   seconds), or find who has it. In progress with the same body: 409; completed
   with the same body: replay the stored response; a different body (another
   fingerprint, the sha256 of the canonical body): 422.
2. *enqueue*: record the delivery and its job and, in the same transaction,
   complete the row with the response to replay.

A server that dies between the two leaves the key in progress until its hold
expires; the next request with the key then takes it over.

Concurrent requests of one server share transactions (group commit), and one
transaction (``Store.handle_requests``) carries the second step of the requests
that began in the previous one and the first step of those that arrived since: a
request costs a share of one commit, not two. A transaction that fails is written
again request by request (``Batcher``), so that a request whose row the store
refuses fails alone. The key is taken before the notification is checked against
today's configuration, so that a replay answers its first response however the
channels changed since; what ``Kirim.prepare`` then refuses (an unknown channel, NUL
or a lone surrogate in the payload…) gives the key back and writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kirim.engine import Kirim, NotifyRequest, reused_field
from kirim.errors import InvalidNotification, PayloadTooLarge, UnknownChannel
from kirim.http.errors import ApiError, detail
from kirim.http.models import NotificationIn, parse_when
from kirim.keys import canonical_json, default_key
from kirim.model import EnqueueResult
from kirim.store.base import (
    NewDelivery,
    RequestBegin,
    RequestedDelivery,
    RequestSlot,
    RequestState,
    StoredResponse,
)
from kirim.views import Record, delivery_json
from kirim.worker.batching import Batcher

#: seconds a request holds its key before another server may take it over
HOLD = 10.0


@dataclass(frozen=True, slots=True)
class Answer:
    status_code: int
    body: str
    replayed: bool = False
    delivery_id: int | None = None


def fingerprint(body: Any) -> str:
    """sha256 of the canonical JSON of a request body (key order and spacing ignored).
    A body that has none (a number past a float: ``1e999``; nested too deeply) is a
    422, before its key is taken."""
    try:
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()
    except (ValueError, TypeError, RecursionError):
        raise ApiError(
            422,
            "validation_error",
            "the body holds a value JSON cannot keep (a number too large for a float, "
            "or nesting too deep)",
            details=[detail("body", "no canonical JSON", "value_error")],
        ) from None


def one_header(values: Sequence[str]) -> str | None:
    """The one ``Idempotency-Key`` header of a request (None without one); two are
    refused (400) rather than reduced to one of them: which one would be a guess."""
    if len(values) > 1:
        raise _bad_header("must be sent once, not several times")
    return values[0] if values else None


def header_key(value: str | None) -> str | None:
    """The ``Idempotency-Key`` header: a structured-field string (``"abc"``), or bare."""
    if value is None:
        return None
    text = value.strip()
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        inner, out, i = text[1:-1], [], 0
        while i < len(inner):
            c = inner[i]
            if c == "\\" and i + 1 < len(inner) and inner[i + 1] in '"\\':
                out.append(inner[i + 1])
                i += 2
                continue
            if c in '"\\':
                raise _bad_header("is not a valid structured-field string")
            out.append(c)
            i += 1
        text = "".join(out)
    if not text:
        raise _bad_header("must not be empty")
    if len(text) > 255:
        raise _bad_header("is longer than 255 characters")
    if not all(" " <= c <= "~" for c in text):
        raise _bad_header("must be printable ASCII")
    return text


#: the body's fields that ``Kirim.prepare`` names first in its refusals
_FIELDS = ("event_id", "recipient", "channel", "payload", "key", "send_after")


def invalid_details(
    exc: InvalidNotification, fields: Sequence[str] = _FIELDS
) -> list[dict[str, str]]:
    """The ``details`` of a refusal by ``Kirim.prepare`` (or ``prepare_event``): the
    field it names (its ``field``, such as a missing variable's ``data.total``, else
    the first word of "payload[0] must not …", "recipients[1]: …" or "data.group …"),
    if it is one of the body's ``fields``; its ``kind`` (``missing``) is the type."""
    message = str(exc)
    named = getattr(exc, "field", None)
    path = named if isinstance(named, str) else message.split(" ", 1)[0].rstrip(":")
    head = path.split("[", 1)[0].split(".", 1)[0]
    kind = getattr(exc, "kind", "value_error")
    if head not in fields:
        return []
    return [detail(f"body.{path if isinstance(named, str) else head}", message, str(kind))]


def _delivery_id(body: str) -> int | None:
    """The delivery's id in a kept response (the delivery's JSON), for its Location."""
    try:
        found = json.loads(body).get("id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def _bad_header(why: str) -> ApiError:
    return ApiError(
        400,
        "bad_request",
        f"the Idempotency-Key header {why}",
        details=[detail("header.idempotency-key", why, "invalid_header")],
    )


def _respond(result: EnqueueResult) -> StoredResponse | None:
    """The response kept for a new delivery; None (keep nothing) for an existing one."""
    if not result.created:
        return None
    record = Record(result.delivery, result.job, [])
    return StoredResponse(
        status_code=201, body=json.dumps(delivery_json(record), ensure_ascii=False)
    )


def in_progress() -> ApiError:
    """409 ``request_in_progress``: another request holds the key and has not answered."""
    return ApiError(
        409,
        "request_in_progress",
        "a request with this idempotency key is still being processed; retry in a moment",
        headers={"Retry-After": "1"},
    )


def reused(key: str, field: str | None = None) -> ApiError:
    """422 ``idempotency_key_reused``; ``field`` names the body's field that differs from
    the delivery the key names (None: the body differs, the delivery is not known yet)."""
    if field is None:
        return ApiError(
            422,
            "idempotency_key_reused",
            f"idempotency key {key!r} was already used with a different request body; "
            "use a new key for a new notification",
            details=[detail("header.idempotency-key", "used with another body", "key_reused")],
        )
    return ApiError(
        422,
        "idempotency_key_reused",
        f"idempotency key {key!r} already names a notification with a different {field}; "
        "use a new key for a new notification",
        details=[detail(f"body.{field}", "differs from the key's notification", "key_reused")],
    )


def notify_request(body: NotificationIn, key: str | None) -> NotifyRequest:
    """The notification a request body asks for; ``key``: its ``Idempotency-Key``
    header (parsed), which the body's ``key``, when given too, must equal (else 422)."""
    if key is not None and body.key is not None and body.key != key:
        raise ApiError(
            422,
            "validation_error",
            "the Idempotency-Key header and the body's key differ; send one, or both equal",
            details=[detail("body.key", "differs from the Idempotency-Key header", "key")],
        )
    send_after: datetime | None = None
    if body.send_after is not None:
        send_after = parse_when(body.send_after)
    return NotifyRequest(
        event_id=body.event_id,
        recipient=body.recipient,
        channel=body.channel,
        payload=body.payload,
        key=key if key is not None else body.key,
        send_after=send_after,
    )


Step = RequestBegin | RequestedDelivery
Done = tuple[EnqueueResult, StoredResponse | None]


class Intake:
    """Accepts notifications for one server (see the module's docstring)."""

    def __init__(self, kirim: Kirim, *, hold: float = HOLD) -> None:
        self.kirim = kirim
        self.hold = hold
        self._steps: Batcher[Step, RequestSlot | Done] = Batcher(self._write)

    async def _write(self, items: Sequence[Step]) -> list[RequestSlot | Done]:
        begin = [it for it in items if isinstance(it, RequestBegin)]
        enqueue = [it for it in items if isinstance(it, RequestedDelivery)]
        slots, done = await self.kirim.handle_requests(
            begin, enqueue, hold=self.hold, respond=_respond
        )
        next_slot, next_done = iter(slots), iter(done)
        return [
            next(next_slot) if isinstance(it, RequestBegin) else next(next_done) for it in items
        ]

    async def accept(self, body: NotificationIn, raw: Any, key_header: str | None) -> Answer:
        """The answer to one ``POST /v1/notifications``: its key taken (step 1; ``_taken``
        when another request has it: a replay answers its first response whatever
        today's configuration says), then the notification checked and made a delivery
        (``_prepare``; a refusal gives the key back), and recorded with the response
        kept for replays (step 2; ``_enqueued``)."""
        request = notify_request(body, header_key(key_header))
        key = request.key or default_key(request.event_id, request.recipient, request.channel)
        try:
            print_ = fingerprint(raw)
        except ApiError:
            self._prepare(request)  # the refusal that names the field (payload: 1e999)
            raise
        token = secrets.token_hex(16)
        slot = await self._steps.submit(
            RequestBegin(idempotency_key=key, fingerprint=print_, lock_token=token)
        )
        assert isinstance(slot, RequestSlot)
        if slot.state is not RequestState.ACQUIRED:
            return await self._taken(slot, request, key, print_)
        try:
            item = self._prepare(request)
        except BaseException:
            await self._give_back(key, token)
            raise
        done = await self._steps.submit(
            RequestedDelivery(delivery=item, lock_token=token, fingerprint=print_)
        )
        assert not isinstance(done, RequestSlot)
        result, kept = done
        return await self._enqueued(item, result, kept)

    async def _give_back(self, key: str, token: str) -> None:
        """Release a request's key: it was refused, and an error is not replayed."""
        await self.kirim.give_back_request(key, token)

    def _prepare(self, request: NotifyRequest) -> NewDelivery:
        """The delivery ``Kirim.prepare`` makes of ``request``; its refusals as API errors."""
        try:
            return self.kirim.prepare(request)
        except UnknownChannel as exc:
            raise ApiError(
                422,
                "unknown_channel",
                str(exc),
                details=[detail("body.channel", str(exc), "unknown_channel")],
            ) from None
        except PayloadTooLarge as exc:
            raise ApiError(
                413,
                "payload_too_large",
                str(exc),
                details=[detail("body.payload", str(exc), "payload_too_large")],
            ) from None
        except InvalidNotification as exc:
            raise ApiError(
                422, "validation_error", str(exc), details=invalid_details(exc)
            ) from None
        except RecursionError:
            raise ApiError(422, "validation_error", "the payload is nested too deeply") from None

    async def _taken(
        self, slot: RequestSlot, request: NotifyRequest, key: str, print_: str
    ) -> Answer:
        """Another request has the key: its kept response replayed (same body, done),
        409 (same body, in progress), or 422 (another body)."""
        if slot.fingerprint != print_:
            raise await self._reused(request, key)
        if slot.state is RequestState.IN_PROGRESS:
            raise in_progress()
        stored = slot.response or ""
        return Answer(slot.status_code or 200, stored, True, _delivery_id(stored))

    async def _enqueued(
        self, item: NewDelivery, result: EnqueueResult, kept: StoredResponse | None
    ) -> Answer:
        """The answer once the delivery is recorded: the kept response of a new one, else
        the delivery the key already names (recorded outside the API, or pruned), or 422
        when that delivery differs from this body."""
        d = result.delivery  # counted and logged by the engine (Kirim.handle_requests)
        if kept is not None:
            return Answer(kept.status_code, kept.body, delivery_id=d.id)
        if result.pruned:  # its fields went with it: the tombstone's id, key and status
            shown = json.dumps(delivery_json(Record(d, None, [])), ensure_ascii=False)
            return Answer(200, shown, delivery_id=d.id)
        if (field := reused_field(d, item)) is not None:
            raise reused(item.idempotency_key, field)
        # recorded before, by kirim itself (notify, the CLI): this answer is not kept
        record = await self.kirim.get(d.id)
        assert record is not None
        return Answer(200, json.dumps(delivery_json(record), ensure_ascii=False), delivery_id=d.id)

    async def _reused(self, request: NotifyRequest, key: str) -> ApiError:
        """The refusal of a body other than the key's first one, naming the field that
        differs when the key's delivery exists (and this body is one kirim takes)."""
        record = await self.kirim.get(key, by="key")
        if record is None:
            return reused(key)
        found = record.delivery
        try:
            item = self.kirim.prepare(request)
        except (InvalidNotification, RecursionError):
            return reused(key)
        return reused(key, reused_field(found, item))
