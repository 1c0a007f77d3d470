"""Idempotency keys and request ids."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any


def default_key(event_id: str, recipient: str, channel: str) -> str:
    """The key of one business action: one event, one recipient, one channel."""
    raw = f"event:{event_id}:user:{recipient}:channel:{channel}"
    return hashlib.sha256(raw.encode()).hexdigest()


def canonical_json(payload: Any) -> str:
    """Stable JSON text of a payload (sorted keys, no spaces); raises TypeError/ValueError."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)


def payload_hash(payload_json: str) -> str:
    return hashlib.sha256(payload_json.encode()).hexdigest()


def new_token() -> str:
    """A fresh fencing token for one claim."""
    return uuid.uuid4().hex


def new_request_id() -> str:
    """Our id for one outbound provider request."""
    return "req-" + uuid.uuid4().hex
