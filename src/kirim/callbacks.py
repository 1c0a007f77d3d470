"""Delivery callbacks: how a provider's word on its messages is verified.

A channel turns callbacks on with one of two keys (``[channels.NAME]``):

- ``callback_secret = "whsec_…"`` (or a list, during a rotation): the callback is
  signed per Standard Webhooks (``webhook-id``, ``webhook-timestamp``,
  ``webhook-signature``: ``v1,`` HMAC-SHA256 of ``{id}.{timestamp}.{body}``), with a
  timestamp no further than ``TOLERANCE`` seconds from this host's clock;
- ``callback_token = "…"``: the callback carries ``Authorization: Bearer TOKEN``,
  compared in constant time.

``verify`` answers only True or False: a caller never learns which check failed.
Secrets and tokens are never shown (not in ``repr``, not in an error).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable, Mapping, Sequence

from kirim.providers.signing import decode_secret, signature

#: seconds a signed callback's timestamp may be off this host's clock (either way), as
#: in the Standard Webhooks reference libraries: a replay later than this is refused
TOLERANCE = 300
#: a callback token's shortest length
MIN_TOKEN = 16


def token_problem(token: object) -> str | None:
    """Why ``token`` cannot be a channel's ``callback_token`` (never showing it), or None."""
    if not isinstance(token, str):
        return "callback_token must be a string"
    if len(token) < MIN_TOKEN or len(token) > 512 or not token.isascii() or not token.isprintable():
        return f"callback_token must be {MIN_TOKEN} to 512 printable ASCII characters"
    if " " in token:
        return "callback_token must not contain spaces"
    return None


class CallbackAuth:
    """Verifies a channel's callbacks: a Standard Webhooks signature or a bearer token."""

    def __init__(
        self,
        *,
        secrets: str | Sequence[str] = (),
        token: str | None = None,
        tolerance: float = TOLERANCE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        listed = [secrets] if isinstance(secrets, str) else list(secrets)
        if bool(listed) == (token is not None):
            raise ValueError("give callback_secret or callback_token (one of them)")
        self._keys = [decode_secret(s) for s in listed]
        if token is not None and (problem := token_problem(token)) is not None:
            raise ValueError(problem)
        self._token = None if token is None else hashlib.sha256(token.encode()).digest()
        self.tolerance = tolerance
        self._clock = clock

    @property
    def kind(self) -> str:
        """``signature`` or ``token``."""
        return "signature" if self._keys else "token"

    def __repr__(self) -> str:  # never the secrets
        return f"CallbackAuth({self.kind})"

    def verify(self, headers: Mapping[str, str], body: bytes) -> bool:
        """Whether the request (its headers, with lower-case names, and raw body) is
        the provider's."""
        if self._token is not None:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            digest = hashlib.sha256(given.strip().encode("utf-8", "replace")).digest()
            return hmac.compare_digest(digest, self._token) and scheme.lower() == "bearer"
        msg_id = headers.get("webhook-id", "")
        stamp = headers.get("webhook-timestamp", "")
        signed = headers.get("webhook-signature", "")
        if not msg_id or not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
            return False
        timestamp = int(stamp)
        if not math.isfinite(self._clock()) or abs(self._clock() - timestamp) > self.tolerance:
            return False
        offered = {p.encode() for p in signed.split(" ") if p.startswith("v1,") and p.isascii()}
        ok = False
        for key in self._keys:
            expected = signature([key], msg_id, timestamp, body).encode()
            for candidate in offered:
                ok |= hmac.compare_digest(candidate, expected)
        return ok


__all__ = ["MIN_TOKEN", "TOLERANCE", "CallbackAuth", "token_problem"]
