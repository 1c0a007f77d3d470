"""Apple Push Notification service over HTTP/2 with token (JWT) authentication.

Library: httpx with HTTP/2 (``h2``) and PyJWT (ES256 through ``cryptography``), the
``apns`` extra. Not aioapns: its connection pool sends a request again by itself when
its connection closes after the request was written (a second notification kirim
cannot see), and its ``MaxAttemptsExceeded`` does not say whether any request left;
httpx gives kirim the seam it classifies every other HTTP provider at.

Each request of one delivery carries the same ``apns-id`` (a UUIDv5 of the
idempotency key, echoed by Apple) and the same ``apns-collapse-id`` (from the key):
a second notification with the collapse id of one the device still shows *replaces*
it, so a resend after a lost answer shows one notification, not two. The provider is
``idempotent`` in that sense; APNs itself keeps no key (docs/channels.md).

The provider token (``authorization: bearer <JWT>``, ES256 over ``iss`` = team id,
``iat``; header ``kid`` = key id) is made here and renewed every 40 minutes (Apple:
not more often than every 20, not less than every 60), and at once after Apple
answers ``ExpiredProviderToken``.

Apple's answers (``{"reason": ...}``) are classified:

- 200: ``Sent`` (the message id: the ``apns-id`` echoed)
- 410 ``Unregistered`` / ``ExpiredToken``, 400 ``BadDeviceToken``: the token is dead
  → ``DeadAddress`` (the worker retires it; ``BadDeviceToken`` is also what a sandbox
  token sent to production gets: check ``environment`` before you see many)
- 403 ``ExpiredProviderToken``: refused before processing → ``TransientFailure``
  (the token is made again)
- 429 ``TooManyRequests`` / ``TooManyProviderTokenUpdates``: ``TransientFailure``
  with ``Retry-After``
- 500 ``InternalServerError``, 503 ``ServiceUnavailable`` / ``Shutdown``: may have
  been acted on → ``AmbiguousFailure`` (a resend replaces, by the collapse id)
- any other 4xx (``BadTopic``, ``DeviceTokenNotForTopic``, ``PayloadTooLarge``,
  ``InvalidProviderToken``, ``MissingTopic``...): ``PermanentFailure``
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from kirim.errors import AmbiguousFailure, DeadAddress, NotSent, PermanentFailure, TransientFailure
from kirim.providers.base import Message, Sent
from kirim.providers.exchange import (
    apns_id,
    build,
    collapse_id,
    exchange,
    json_of,
    rate_limited,
    said,
    user_agent_header,
)
from kirim.providers.shaping import apns_payload
from kirim.providers.webhook import json_body

URLS = {"production": "https://api.push.apple.com", "sandbox": "https://api.sandbox.push.apple.com"}
PUSH_TYPES = ("alert", "background", "voip", "complication", "fileprovider", "mdm", "liveactivity")
#: Apple's limit of a notification's payload (VoIP: 5120)
MAX_PAYLOAD = 4096
TOKEN_LIFETIME = 40 * 60.0
DEAD = frozenset({"Unregistered", "ExpiredToken", "BadDeviceToken"})
_TOKEN = re.compile(r"[0-9a-fA-F]{32,200}")


def address_problem(address: str) -> str | None:
    """Why ``address`` is not an APNs device token (hexadecimal), or None."""
    if not _TOKEN.fullmatch(address):
        return "an APNs device token is 32 to 200 hexadecimal digits"
    return None


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset(
    {"team_id", "key_id", "private_key", "private_key_file", "topic", "environment"}
    | {"push_type", "priority", "expiration", "ca_file", "url", "user_agent"}
)


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with an apns channel's options, or None."""
    if options.get("lookup"):
        return "lookup: the apns provider has no lookup"
    for name in ("team_id", "key_id", "topic"):
        if not isinstance(options.get(name), str) or not options[name]:
            return f"{name} is required for an apns channel"
    key, path = options.get("private_key"), options.get("private_key_file")
    if (key is None) == (path is None):
        return "give private_key (the .p8 key's PEM text) or private_key_file, one of them"
    if options.get("environment", "production") not in URLS:
        return "environment must be production or sandbox"
    if options.get("push_type", "alert") not in PUSH_TYPES:
        return f"push_type must be one of {', '.join(PUSH_TYPES)}"
    url = options.get("url")
    if url is not None and (not isinstance(url, str) or not url.startswith("https://")):
        return "url must be an https:// URL (APNs speaks HTTP/2 over TLS only)"
    return None


def from_table(options: Mapping[str, Any]) -> ApnsProvider:
    """The provider of a checked ``[channels.NAME]`` table (ImportError: kirim[apns])."""
    return ApnsProvider(
        team_id=options["team_id"],
        key_id=options["key_id"],
        private_key=read_text(options, "private_key", "private_key_file"),
        topic=options["topic"],
        environment=options.get("environment", "production"),
        url=options.get("url"),
        push_type=options.get("push_type", "alert"),
        priority=options.get("priority"),
        expiration=options.get("expiration"),
        timeout=float(options.get("timeout", 10)),
        user_agent=options.get("user_agent"),
        ca_file=options.get("ca_file"),
    )


def read_text(options: Mapping[str, Any], inline: str, file: str) -> str:
    """The option ``inline``'s text, or the text of the file ``file`` names."""
    if options.get(file) is not None:
        try:
            return Path(options[file]).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{file} cannot be read: {exc.strerror}") from None
    return str(options[inline])


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The TLS context of the connection: the system's roots, or ``ca_file``'s."""
    return ssl.create_default_context(cafile=ca_file)


class ApnsProvider:
    """Send each delivery to its device token (the delivery's recipient)."""

    idempotent = True  # a resend carries the same apns-collapse-id: it replaces
    #: the kind of address a recipient has on this channel (``kirim.addresses``)
    address_kind = "apns"

    def __init__(
        self,
        *,
        team_id: str,
        key_id: str,
        private_key: str,
        topic: str,
        environment: str = "production",
        url: str | None = None,
        push_type: str = "alert",
        priority: int | None = None,
        expiration: int | None = None,
        timeout: float = 10.0,
        ca_file: str | None = None,
        clock: Callable[[], float] = time.time,
        user_agent: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        import jwt  # the apns extra: fail when the channel is built, not at the first send

        self._jwt = jwt
        self.team_id = team_id
        self.key_id = key_id
        self._key = private_key
        self.topic = topic
        self.url = (url or URLS[environment]).rstrip("/")
        self.push_type = push_type
        self.priority = priority
        self.expiration = expiration
        self.timeout = timeout
        self._clock = clock
        self._token: tuple[float, str] | None = None
        self._bearer()  # a key that cannot sign fails here, at start
        self._client = client or httpx.AsyncClient(
            headers=user_agent_header(user_agent),
            http2=True,
            timeout=timeout,
            verify=tls_context(ca_file),
        )

    def __repr__(self) -> str:  # never the key
        return f"ApnsProvider(url={self.url!r}, topic={self.topic!r}, key_id={self.key_id!r})"

    def _bearer(self, *, fresh: bool = False) -> str:
        now = self._clock()
        if fresh or self._token is None or now - self._token[0] >= TOKEN_LIFETIME:
            try:
                token = self._jwt.encode(
                    {"iss": self.team_id, "iat": int(now)},
                    self._key,
                    algorithm="ES256",
                    headers={"kid": self.key_id},
                )
            except Exception as exc:  # never the key itself
                what = type(exc).__name__
                raise ValueError(f"private_key cannot sign an ES256 token: {what}") from None
            self._token = (now, token)
        return self._token[1]

    def headers(self, message: Message) -> dict[str, str]:
        """The request's headers (the authorization last: made at sending time)."""
        headers = {
            "apns-id": apns_id(message.idempotency_key),
            "apns-topic": self.topic,
            "apns-push-type": self.push_type,
            "apns-collapse-id": collapse_id(message.idempotency_key),
        }
        if self.priority is not None:
            headers["apns-priority"] = str(self.priority)
        if self.expiration is not None:
            headers["apns-expiration"] = str(int(self._clock()) + self.expiration)
        return headers

    async def send(self, message: Message) -> Sent:
        token = message.recipient
        if (problem := address_problem(token)) is not None:
            raise NotSent(f"not sent: apns: {problem}")

        def made() -> dict[str, Any]:
            body = apns_payload(message.payload)
            content = json_body(body)
            if len(content) > MAX_PAYLOAD:
                raise ValueError(f"the payload is {len(content)} bytes, over APNs' {MAX_PAYLOAD}")
            headers = {**self.headers(message), "authorization": f"bearer {self._bearer()}"}
            return {"content": content, "headers": headers}

        request = build(
            self._client, "POST", f"{self.url}/3/device/{token}", service="apns", make=made
        )
        response = await exchange(self._client, request, service="apns")
        return self._classify(response, token)

    def _classify(self, response: httpx.Response, token: str) -> Sent:
        code = response.status_code
        if code == 200:
            return Sent(provider_message_id=response.headers.get("apns-id"))
        body = json_of(response)
        reason = body.get("reason") if isinstance(body, dict) else None
        text = f"apns: {said(response)}"
        if reason in DEAD or code == 410:
            raise DeadAddress(text, address=token, status_code=code)
        if reason == "ExpiredProviderToken":
            self._token = None
            raise TransientFailure(text, status_code=code)
        if code == 429:
            raise rate_limited(response, text)
        if code >= 500:
            raise AmbiguousFailure(text, status_code=code)
        raise PermanentFailure(text, status_code=code)

    async def aclose(self) -> None:
        await self._client.aclose()
