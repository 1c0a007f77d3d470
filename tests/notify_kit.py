"""Deliveries of the notification layer as the fan-out makes them, for the store's
tests (the digest of one stream, a typed delivery with or without a throttle)."""

from __future__ import annotations

from typing import Any

from kirim.keys import canonical_json, payload_hash
from kirim.store.base import DigestEvent, Intent, NewDelivery, Throttle

#: the digests' window in these tests, and their stream (type|recipient|channel|key)
WINDOW = 600.0
STREAM = "liked|u1|email|u1"


def event(
    event_id: str,
    *,
    stream: str = STREAM,
    window: float = WINDOW,
    throttle: Throttle | None = None,
    **data: Any,
) -> NewDelivery:
    """One event (``data``) for the digest of ``stream``, with the placeholder payload
    the fan-out gives a digest until it is sealed."""
    placeholder = canonical_json({"type": "liked", "digest": stream, "events": []})
    return NewDelivery(
        idempotency_key=f"unused-{event_id}",
        event_id=event_id,
        recipient="u1@example.com",
        channel="email",
        payload_json=placeholder,
        payload_hash=payload_hash(placeholder),
        run_at=None,
        max_attempts=3,
        type="liked",
        recipient_id="u1",
        throttle=throttle,
        digest=DigestEvent(
            stream=stream, window=window, event_id=event_id, data_json=canonical_json(data)
        ),
    )


def typed(
    key: str, *, type: str = "t", throttle: Throttle | None = None, event_id: str | None = None
) -> NewDelivery:
    """A delivery of a notification type for u1 (throttled by ``throttle``, if given)."""
    text = canonical_json({"key": key})
    return NewDelivery(
        idempotency_key=key,
        event_id=event_id or f"e-{key}",
        recipient="u1@example.com",
        channel="email",
        payload_json=text,
        payload_hash=payload_hash(text),
        run_at=None,
        max_attempts=3,
        type=type,
        recipient_id="u1",
        throttle=throttle,
    )


def numbered(
    n: int, *, run_at: float = 0.0, max_attempts: int = 3, type: str | None = None
) -> NewDelivery:
    """Delivery ``n`` (key ``key-n``, event ``en``, to ``un`` on push), due at ``run_at``;
    of ``type`` for recipient ``rn`` when a type is given."""
    text = canonical_json({"n": n})
    return NewDelivery(
        idempotency_key=f"key-{n}",
        event_id=f"e{n}",
        recipient=f"u{n}",
        channel="push",
        payload_json=text,
        payload_hash=payload_hash(text),
        run_at=run_at,
        max_attempts=max_attempts,
        type=type,
        recipient_id=None if type is None else f"r{n}",
    )


def intent_of(c: Any, request_id: str = "req-1", worker: str = "w1") -> Intent:
    """The attempt intent of claim ``c``: request ``request_id`` by ``worker``, at the
    claim's time."""
    return Intent(
        delivery_id=c.delivery.id,
        job_id=c.job.id,
        token=c.token,
        number=c.job.attempts,
        provider_request_id=request_id,
        worker_id=worker,
        requested_at=c.job.updated_at,
    )
