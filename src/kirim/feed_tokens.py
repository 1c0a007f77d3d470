"""Feed tokens: what lets a browser read its own recipient's feed, and nothing else.

An application's backend asks kirim for one (``Kirim.feed_token``, or ``POST
/v1/recipients/{id}/feed-token`` with an operator token) and hands it to the
recipient's page. It is ``kfeed_`` + base64url(JSON ``{"r": recipient id, "e": expiry
in epoch seconds}``) + ``.`` + base64url(HMAC-SHA256 of that text with the server's
``[inbox] secret``), in the way Novu's subscriber hash and Knock's user tokens work:
kirim stores nothing, so any ``kirim serve`` with the same secret checks it. A forged
or altered token fails the MAC; an old one its expiry. Made with the standard
library's ``hmac`` (kirim has no ``itsdangerous`` among its dependencies, and the
format is ten lines).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

#: the start of every feed token (an operator token starts ``kirim_``)
PREFIX = "kfeed_"
#: the longest life a feed token may be given (seconds): 30 days
MAX_TTL = 30 * 86400.0


class BadFeedToken(Exception):
    """A feed token that is not one of ours (forged, altered, malformed) or has expired."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, body: str) -> bytes:
    return hmac.new(secret.encode("utf-8"), body.encode("ascii"), hashlib.sha256).digest()


def sign(secret: str, recipient_id: str, expires_at: float) -> str:
    """A token for ``recipient_id``'s feed, good until ``expires_at``."""
    claims = json.dumps({"r": recipient_id, "e": int(expires_at)}, separators=(",", ":"))
    body = _b64(claims.encode("utf-8"))
    return f"{PREFIX}{body}.{_b64(_mac(secret, body))}"


def verify(secret: str, token: str, now: float) -> tuple[str, float]:
    """The recipient id and expiry ``token`` carries; ``BadFeedToken`` when it is not a
    token of ``secret``'s or it has expired."""
    if not token.startswith(PREFIX) or not token.isascii():
        raise BadFeedToken("not a feed token")
    body, dot, mac = token[len(PREFIX) :].partition(".")
    try:
        given = _unb64(mac)
    except ValueError:
        raise BadFeedToken("not a feed token") from None
    if not dot or not hmac.compare_digest(given, _mac(secret, body)):
        raise BadFeedToken("the feed token's signature does not hold")
    try:
        claims = json.loads(_unb64(body))
        recipient_id, expires_at = claims["r"], float(claims["e"])
    except (ValueError, KeyError, TypeError):
        raise BadFeedToken("the feed token is malformed") from None
    if not isinstance(recipient_id, str):
        raise BadFeedToken("the feed token is malformed")
    if expires_at <= now:
        raise BadFeedToken("the feed token has expired")
    return recipient_id, expires_at


def is_feed_token(token: str) -> bool:
    """Whether ``token`` is meant as a feed token (else an operator's)."""
    return token.startswith(PREFIX)
