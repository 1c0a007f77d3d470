"""A loopback Web Push service (RFC 8030) that decrypts what it is sent.

``subscribe()`` makes a subscription as a browser would (a P-256 key pair and an
auth secret kept here, the public half and the endpoint given out as the JSON of
``PushSubscription.toJSON()``). ``POST /push/{id}`` then checks what a push service
checks and what the browser would: the VAPID ``Authorization`` (``vapid t=JWT,k=KEY``:
the ES256 signature verifies with ``k``, ``aud`` is this origin, ``exp`` in the next
24 hours, ``sub`` a mailto: or https: contact; else 401/403), ``TTL`` present (else
400), ``Content-Encoding: aes128gcm``, and the body decrypted with the subscription's
private key and auth secret (RFC 8291; one that does not decrypt is a 400): so the
encryption is verified, not assumed. A subscription in ``dead`` answers 410 (the
autopush error body). The device shows the decrypted message by its ``tag``.

``with WebPushFake() as push: sub = push.subscribe()``.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any

import http_ece
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kirim.devtools.services.base import Answer, HttpFake


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def gone(status: int, errno: int, message: str) -> Answer:
    """An autopush-style error body."""
    return Answer(status, {"code": status, "errno": errno, "error": "Gone", "message": message})


class WebPushFake(HttpFake):
    """A push service on 127.0.0.1 (see the module's text)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._keys: dict[str, tuple[ec.EllipticCurvePrivateKey, bytes]] = {}
        self.subjects: list[str] = []  # the VAPID sub of every accepted message
        self.topics: list[str | None] = []

    def subscribe(self) -> str:
        """A new subscription's JSON (the address a recipient registers)."""
        key = ec.generate_private_key(ec.SECP256R1())
        auth = secrets.token_bytes(16)
        sid = secrets.token_hex(8)
        self._keys[sid] = (key, auth)
        public = key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return json.dumps(
            {
                "endpoint": f"{self.base_url}/push/{sid}",
                "keys": {"p256dh": _b64(public), "auth": _b64(auth)},
            },
            separators=(",", ":"),
        )

    def kill(self, subscription: str) -> None:
        """The browser dropped ``subscription``: the service answers 410 from now on."""
        self.dead.add(json.loads(subscription)["endpoint"].rsplit("/", 1)[1])

    def _vapid(self, header: str) -> str | None:
        """Why a VAPID Authorization is refused, or None."""
        if not header.lower().startswith("vapid "):
            return "no VAPID authorization"
        parts = dict(p.split("=", 1) for p in header[6:].split(",") if "=" in p)
        try:
            point = _unb64(parts["k"].strip())
            public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
            claims = jwt.decode(
                parts["t"].strip(), public, algorithms=["ES256"], audience=self.base_url
            )
        except (KeyError, ValueError, jwt.PyJWTError) as exc:
            return f"bad VAPID token: {exc}"
        if not 0 < claims.get("exp", 0) - time.time() <= 24 * 3600:
            return "the VAPID token's exp is not within 24 hours"
        if not str(claims.get("sub", "")).startswith(("mailto:", "https:")):
            return "the VAPID token has no sub contact"
        self.subjects.append(str(claims["sub"]))
        return None

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        sid = path.removeprefix("/push/")
        if method != "POST" or not path.startswith("/push/") or sid not in self._keys:
            return Answer(
                404,
                {
                    "code": 404,
                    "errno": 102,
                    "error": "Not Found",
                    "message": "no such subscription",
                },
            )
        if (why := self._vapid(headers.get("authorization", ""))) is not None:
            self.refuse("vapid")
            return Answer(401, {"code": 401, "errno": 109, "error": "Unauthorized", "message": why})
        if "ttl" not in headers:
            self.refuse("ttl")
            return Answer(
                400,
                {
                    "code": 400,
                    "errno": 111,
                    "error": "Bad Request",
                    "message": "Missing TTL header",
                },
            )
        if sid in self.dead:
            self.refuse("gone")
            return gone(410, 106, "Request did not validate: subscription expired")
        if headers.get("content-encoding") != "aes128gcm":
            self.refuse("encoding")
            return Answer(
                400,
                {
                    "code": 400,
                    "errno": 110,
                    "error": "Bad Request",
                    "message": "Unknown Content-Encoding",
                },
            )
        key, auth = self._keys[sid]
        try:
            message = json.loads(
                http_ece.decrypt(body, private_key=key, auth_secret=auth, version="aes128gcm")
            )
        except Exception as exc:  # the encryption is wrong: the browser could not read it
            self.refuse("decrypt")
            return Answer(
                400,
                {
                    "code": 400,
                    "errno": 110,
                    "error": "Bad Request",
                    "message": f"cannot decrypt: {type(exc).__name__}",
                },
            )
        topic = headers.get("topic")

        def act() -> Answer:
            tag = message.get("tag") if isinstance(message, dict) else None
            self.show(self._address(sid), dict(message), tag)
            with self._lock:
                self.topics.append(topic)
                n = len(self.topics)
            return Answer(
                201, None, {"Location": f"{self.base_url}/message/{n}", "TTL": headers["ttl"]}
            )

        return self.deliver(act)

    def _address(self, sid: str) -> str:
        return f"{self.base_url}/push/{sid}"

    def unavailable(self) -> Answer:
        return Answer(
            503,
            {
                "code": 503,
                "errno": 202,
                "error": "Service Unavailable",
                "message": "temporarily unavailable",
            },
        )

    def limited(self) -> Answer:
        return Answer(
            429,
            {"code": 429, "errno": 900, "error": "Too Many Requests", "message": "slow down"},
            {"Retry-After": "1"},
        )
