"""Standard Webhooks signatures (standardwebhooks.com), for the webhook provider.

A signed request carries three headers:

- ``webhook-id``: kirim's idempotency key, the same on every resend of one
  notification (what a receiver deduplicates on);
- ``webhook-timestamp``: integer seconds since the epoch, taken when the request is
  about to leave (after the worker's send-deadline check);
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256>`` of ``{id}.{timestamp}.{body}``
  with each secret, space-separated: with several secrets (rotation) a receiver
  that knows any one of them verifies the request.

A secret is ``whsec_`` and the base64 of its key bytes. A receiver that refuses
timestamps older than its tolerance (5 minutes in the reference libraries) acts on
no request later than that after it was signed: docs/channels.md
relates this to kirim's intent bound. Secrets are never shown: not in ``repr``, not
in an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import time
from collections.abc import Callable, Sequence

PREFIX = "whsec_"


def decode_secret(secret: str) -> bytes:
    """The key bytes of a ``whsec_…`` secret; ValueError (without the secret) if it is not one."""
    if not isinstance(secret, str) or not secret.startswith(PREFIX):
        raise ValueError("a signing secret starts with whsec_ (Standard Webhooks)")
    text = secret[len(PREFIX) :]
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a signing secret is whsec_ and then base64") from None
    if not key:
        raise ValueError("a signing secret must not be empty")
    return key


def signature(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64>`` per key, space-separated."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
        for key in keys
    )


class Signer:
    """Signs request bodies with one or more secrets (the first is the current one)."""

    def __init__(
        self, secrets: str | Sequence[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        listed = [secrets] if isinstance(secrets, str) else list(secrets)
        if not listed:
            raise ValueError("secret: give at least one whsec_ secret")
        self._keys = [decode_secret(s) for s in listed]
        self._clock = clock

    def __repr__(self) -> str:  # never the secrets
        return f"Signer({len(self._keys)} secret{'s' if len(self._keys) != 1 else ''})"

    def headers(self, msg_id: str, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers of one request, signed now."""
        timestamp = math.floor(self._clock())
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(self._keys, msg_id, timestamp, body),
        }
