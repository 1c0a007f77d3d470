"""Idempotency keys and request ids."""

from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Any

# one text rule for every door (re-exported: the stores and the HTTP layer import it here)
from kirim.validation import text_problem as text_problem


def default_key(event_id: str, recipient: str, channel: str) -> str:
    """The key of one business action: one event, one recipient, one channel.

    sha256 of :func:`default_key_text`: distinct triples give distinct texts, so two
    business actions share a default key only if sha256 collides.
    """
    return hashlib.sha256(default_key_text(event_id, recipient, channel).encode()).hexdigest()


def default_key_text(event_id: str, recipient: str, channel: str) -> str:
    """What :func:`default_key` hashes: ``event:{e}:user:{r}:channel:{c}``, each field
    with ``%`` written ``%25`` and ``:`` written ``%3A``.

    An escaped field holds no ``:``, so the text splits back into exactly its three
    fields, and the escaping is undone unambiguously: the encoding is injective. A
    field without ``%`` or ``:`` is written as it is (the key of kirim's first
    releases).
    """
    return f"event:{_escaped(event_id)}:user:{_escaped(recipient)}:channel:{_escaped(channel)}"


def device_key(event_id: str, recipient: str, channel: str, address: str) -> str:
    """The key of one business action on one of the recipient's addresses (a device of
    a fan-out): sha256 of :func:`default_key_text` and ``:device:`` and the address's
    tag, so each device's delivery has a key of its own, the same for every replay."""
    text = f"{default_key_text(event_id, recipient, channel)}:device:{device_tag(address)}"
    return hashlib.sha256(text.encode()).hexdigest()


def device_tag(address: str) -> str:
    """A short stable name of an address (32 hexadecimal digits of its sha256): what
    a key, a stream or a scope says of a device, never the token itself."""
    return hashlib.sha256(address.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _escaped(field: str) -> str:
    return field.replace("%", "%25").replace(":", "%3A")


def canonical_json(payload: Any) -> str:
    """Stable JSON text of a payload (sorted keys, no spaces); raises TypeError/ValueError."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)


def payload_hash(payload_json: str) -> str:
    return hashlib.sha256(payload_json.encode()).hexdigest()


def uuid4_hex() -> str:
    """``uuid.uuid4().hex`` (16 random bytes from ``os.urandom``, the version and
    variant bits set), a few times cheaper: no ``UUID`` object is made (a claim and
    a request take one each)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # variant: RFC 4122
    return raw.hex()


def new_token() -> str:
    """A fresh fencing token for one claim."""
    return uuid4_hex()


#: the bits of a 128-bit UUID's integer that say version 4, variant RFC 4122
_VERSION_4 = (0xF << 76) | (0x3 << 62), (0x4 << 76) | (0x2 << 62)
#: where request ids come from: seeded from ``os.urandom``, again in a forked child, and
#: kirim's own, so that an application's ``random.seed()`` never makes two processes
#: draw the same ids
_REQUEST_IDS = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REQUEST_IDS.seed)


def new_request_id() -> str:
    """Our id for one outbound provider request: a version-4 UUID's hex after ``req-``,
    unique, not secret. Its 122 random bits come from a generator of kirim's own
    (``_REQUEST_IDS``), not from a system call per id: ``os.urandom`` lets go of the
    GIL, and a worker on SQLite then waits for its driver's thread to hand it back, once
    per delivery."""
    clear, set_ = _VERSION_4
    return f"req-{_REQUEST_IDS.getrandbits(128) & ~clear | set_:032x}"
