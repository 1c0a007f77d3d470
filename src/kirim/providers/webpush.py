"""Web Push (RFC 8030) with VAPID (RFC 8292) and message encryption (RFC 8291).

Libraries: ``http_ece`` encrypts the payload (``aes128gcm``, RFC 8188, against the
subscription's ``p256dh`` key and ``auth`` secret) and ``py_vapid`` signs the VAPID
JWT, the ``webpush`` extra; the request goes over httpx. Not pywebpush: it is a thin
layer over those two whose sends go through requests or a fresh aiohttp session per
call and fold every failure into one ``WebPushException``, so a refused connection
and a lost answer look alike (kirim must tell them apart).

A recipient's address is its subscription, the JSON a browser's
``PushSubscription.toJSON()`` gives: ``{"endpoint": "https://…", "keys": {"p256dh":
…, "auth": …}}`` (an ``http://`` endpoint only on a loopback host, for local tests).

``Topic`` (from the idempotency key) makes the push service replace a message with
the same topic that it still holds for an offline device; ``tag`` in the message (the
same id) makes the service worker's ``showNotification`` replace a shown one: a
resend shows once. Answers:

- 201 (or 200/202): ``Sent`` (the message's ``Location``)
- 404, 410: the subscription expired or was removed → ``DeadAddress`` (retired)
- 429: ``TransientFailure`` with ``Retry-After``
- 5xx: ``AmbiguousFailure``
- 400, 401/403 (a VAPID signature the service refuses), 413, any other 4xx:
  ``PermanentFailure``
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from kirim.errors import AmbiguousFailure, DeadAddress, NotSent, PermanentFailure
from kirim.providers.base import Message, Sent
from kirim.providers.exchange import (
    build,
    collapse_id,
    exchange,
    rate_limited,
    said,
    user_agent_header,
)
from kirim.providers.shaping import webpush_message
from kirim.providers.webhook import json_body

LOOPBACK = ("127.0.0.1", "localhost", "::1")
URGENCY = ("very-low", "low", "normal", "high")
#: the VAPID token's lifetime (RFC 8292 allows at most 24 hours) and its renewal
VAPID_LIFETIME = 12 * 3600
#: the largest encrypted body push services must take (RFC 8030: 4096 bytes)
MAX_BODY = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    endpoint: str
    p256dh: bytes
    auth: bytes


def _b64(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def subscription(address: str) -> Subscription:
    """The subscription an address holds; ValueError saying what is wrong."""
    try:
        data = json.loads(address)
    except ValueError:
        raise ValueError(
            "a Web Push subscription is the JSON of PushSubscription.toJSON()"
        ) from None
    keys = data.get("keys") if isinstance(data, dict) else None
    endpoint = data.get("endpoint") if isinstance(data, dict) else None
    if not isinstance(endpoint, str) or not isinstance(keys, dict):
        raise ValueError("a Web Push subscription has an endpoint and keys (p256dh, auth)")
    parts = urlsplit(endpoint)
    if not (parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in LOOPBACK)):
        raise ValueError("a Web Push endpoint is an https:// URL")
    try:
        p256dh, auth = _b64(str(keys["p256dh"])), _b64(str(keys["auth"]))
    except (KeyError, ValueError):
        raise ValueError("a Web Push subscription's keys are base64url p256dh and auth") from None
    if len(p256dh) != 65 or p256dh[0] != 4 or len(auth) != 16:
        raise ValueError("p256dh must be a P-256 public key (65 bytes), auth 16 bytes")
    return Subscription(endpoint=endpoint, p256dh=p256dh, auth=auth)


def address_problem(address: str) -> str | None:
    try:
        subscription(address)
    except ValueError as exc:
        return str(exc)
    return None


def vapid_key(options: Mapping[str, Any]) -> str:
    """The VAPID private key's text (``vapid_private_key``, or the file's)."""
    key, path = options.get("vapid_private_key"), options.get("vapid_private_key_file")
    if (key is None) == (path is None):
        raise ValueError("give vapid_private_key or vapid_private_key_file, one of them")
    if path is not None:
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"vapid_private_key_file cannot be read: {exc.strerror}") from None
    return str(key)


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset(
    {"vapid_private_key", "vapid_private_key_file", "vapid_subject", "ttl", "urgency"}
    | {"user_agent"}
)


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with a webpush channel's options, or None."""
    if options.get("lookup"):
        return "lookup: the webpush provider has no lookup"
    subject = options.get("vapid_subject")
    if not isinstance(subject, str) or not subject.startswith(("mailto:", "https://")):
        return "vapid_subject is required: a mailto: or https:// contact of the sender"
    try:
        vapid_key(options)
    except ValueError as exc:
        return str(exc)
    if options.get("urgency", "normal") not in URGENCY:
        return f"urgency must be one of {', '.join(URGENCY)}"
    return None


def from_table(options: Mapping[str, Any]) -> WebPushProvider:
    """The provider of a checked ``[channels.NAME]`` table (ImportError: kirim[webpush])."""
    return WebPushProvider(
        vapid_private_key=vapid_key(options),
        vapid_subject=options["vapid_subject"],
        ttl=int(options.get("ttl", 86400)),
        urgency=options.get("urgency", "normal"),
        timeout=float(options.get("timeout", 10)),
        user_agent=options.get("user_agent"),
    )


class WebPushProvider:
    """Encrypt each delivery for its subscription (the delivery's recipient) and post it
    to the subscription's push service."""

    idempotent = True  # a resend carries the same Topic and tag: it replaces
    address_kind = "webpush"

    def __init__(
        self,
        *,
        vapid_private_key: str,
        vapid_subject: str,
        ttl: int = 86400,
        urgency: str = "normal",
        timeout: float = 10.0,
        user_agent: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        import http_ece  # the webpush extra
        from py_vapid import Vapid02

        self._ece = http_ece
        text = vapid_private_key.strip()
        try:
            if text.startswith("-----BEGIN"):
                self._vapid = Vapid02.from_pem(text.encode())
            else:
                self._vapid = Vapid02.from_string(text)
        except Exception as exc:  # never the key
            raise ValueError(f"vapid_private_key cannot be read: {type(exc).__name__}") from None
        self.subject = vapid_subject
        self.ttl = int(ttl)
        self.urgency = urgency
        self.timeout = timeout
        self._signed: dict[str, tuple[float, str]] = {}  # audience -> (made at, header)
        self._client = client or httpx.AsyncClient(
            headers=user_agent_header(user_agent), timeout=timeout
        )

    def __repr__(self) -> str:
        return f"WebPushProvider(subject={self.subject!r})"

    def _authorization(self, endpoint: str) -> str:
        parts = urlsplit(endpoint)
        audience = f"{parts.scheme}://{parts.netloc}"
        now = time.time()
        known = self._signed.get(audience)
        if known is None or now - known[0] > VAPID_LIFETIME / 2:
            claims = {"sub": self.subject, "aud": audience, "exp": int(now) + VAPID_LIFETIME}
            header = self._vapid.sign(claims)["Authorization"]
            known = self._signed[audience] = (now, str(header))
        return known[1]

    def encrypt(self, sub: Subscription, data: bytes) -> bytes:
        """``data`` encrypted for ``sub`` (RFC 8291: an ephemeral ECDH key each time)."""
        from cryptography.hazmat.primitives.asymmetric import ec

        ephemeral = ec.generate_private_key(ec.SECP256R1())
        body: bytes = self._ece.encrypt(
            data, private_key=ephemeral, dh=sub.p256dh, auth_secret=sub.auth, version="aes128gcm"
        )
        return body

    async def send(self, message: Message) -> Sent:
        try:
            sub = subscription(message.recipient)
        except ValueError as exc:
            raise NotSent(f"not sent: webpush: {exc}") from exc
        topic = collapse_id(message.idempotency_key)

        def made() -> dict[str, Any]:
            content = self.encrypt(sub, json_body(webpush_message(message.payload, topic)))
            if len(content) > MAX_BODY:
                raise ValueError(f"the encrypted message is {len(content)} bytes, over {MAX_BODY}")
            headers = {
                "TTL": str(self.ttl),
                "Urgency": self.urgency,
                "Topic": topic,
                "Content-Encoding": "aes128gcm",
                "Content-Type": "application/octet-stream",
                "Authorization": self._authorization(sub.endpoint),
            }
            return {"content": content, "headers": headers}

        request = build(self._client, "POST", sub.endpoint, service="webpush", make=made)
        response = await exchange(self._client, request, service="webpush")
        code = response.status_code
        text = f"webpush: {said(response)}"
        if code in (200, 201, 202):
            return Sent(provider_message_id=response.headers.get("Location"))
        if code in (404, 410):
            raise DeadAddress(text, address=message.recipient, status_code=code)
        if code == 429:
            raise rate_limited(response, text)
        if code >= 500:
            raise AmbiguousFailure(text, status_code=code)
        raise PermanentFailure(text, status_code=code)

    async def aclose(self) -> None:
        await self._client.aclose()
