"""A loopback FCM HTTP v1 endpoint and the OAuth2 token endpoint google-auth talks to.

``POST /token`` takes the JWT bearer grant google-auth sends (RFC 7523): the
assertion must verify with the service account's public key (RS256), name the
account (``iss``), Google's token endpoint (``aud``: google-auth signs for it whatever
``token_uri`` says) and the ``firebase.messaging`` scope; it
answers ``{"access_token", "expires_in", "token_type"}`` or ``{"error":
"invalid_grant"}``. ``POST /v1/projects/{project}/messages:send`` needs one of the
access tokens it issued (else 401 ``UNAUTHENTICATED``) and answers as FCM does:
``{"name": "projects/…/messages/…"}``, or ``{"error": {"code", "message", "status",
"details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
"errorCode": …}]}}`` with ``INVALID_ARGUMENT`` (400), ``UNREGISTERED`` (404, a token
in ``dead``), ``QUOTA_EXCEEDED`` (429, ``Retry-After``), ``UNAVAILABLE`` (503).
The device shows a notification by its Android ``tag``: a resend with the tag of a
shown one replaces it.

``with FcmFake() as fcm:`` — ``fcm.url``, ``fcm.account`` (a service account's JSON
whose ``token_uri`` is this fake's).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kirim.devtools.services.base import Answer, HttpFake
from kirim.providers.fcm import SCOPE, address_problem

#: the ``aud`` google-auth signs every assertion for (whatever ``token_uri`` says), and
#: Google's token endpoint checks
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
_FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
_STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "SENDER_ID_MISMATCH": 403,
    "UNREGISTERED": 404,
    "QUOTA_EXCEEDED": 429,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
}


def fcm_error(code: str, message: str, headers: dict[str, str] | None = None) -> Answer:
    """An FCM v1 error answer (its google.rpc.Status body)."""
    status = _STATUS[code]
    rpc = {
        400: "INVALID_ARGUMENT",
        401: "UNAUTHENTICATED",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        429: "RESOURCE_EXHAUSTED",
        500: "INTERNAL",
        503: "UNAVAILABLE",
    }
    body = {
        "error": {
            "code": status,
            "message": message,
            "status": rpc[status],
            "details": [{"@type": _FCM_ERROR, "errorCode": code}],
        }
    }
    return Answer(status, body, headers or {})


class FcmFake(HttpFake):
    """FCM and its token endpoint on 127.0.0.1 (see the module's text)."""

    def __init__(self, *, project_id: str = "kirim-test", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._public = key.public_key()
        self._pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        self.email = f"kirim@{project_id}.iam.gserviceaccount.com"
        self.issued: dict[str, float] = {}  # access token -> expiry
        self.grants = 0  # tokens issued
        self.messages: list[dict[str, Any]] = []  # every message FCM accepted

    @property
    def url(self) -> str:
        return self.base_url

    @property
    def account(self) -> dict[str, Any]:
        """A service account key file's JSON, pointing at this fake's token endpoint."""
        return {
            "type": "service_account",
            "project_id": self.project_id,
            "private_key_id": "kirim-test-key",
            "private_key": self._pem,
            "client_email": self.email,
            "client_id": "1",
            "token_uri": f"{self.base_url}/token",
        }

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        if method == "POST" and path == "/token":
            return self._token(body)
        if method == "POST" and path == f"/v1/projects/{self.project_id}/messages:send":
            return self._send(headers, body)
        return Answer(404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}})

    def _token(self, body: bytes) -> Answer:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return Answer(400, {"error": "unsupported_grant_type"})
        try:
            claims = jwt.decode(
                form.get("assertion", ""),
                self._public,
                algorithms=["RS256"],
                audience=GOOGLE_TOKEN_AUDIENCE,
            )
        except jwt.PyJWTError as exc:
            self.refuse("invalid_grant")
            return Answer(400, {"error": "invalid_grant", "error_description": str(exc)})
        if claims.get("iss") != self.email or SCOPE not in str(claims.get("scope", "")).split():
            self.refuse("invalid_scope")
            return Answer(400, {"error": "invalid_scope", "error_description": "scope"})
        token = "ya29." + secrets.token_urlsafe(24)
        with self._lock:
            self.issued[token] = time.time() + 3600
            self.grants += 1
        return Answer(200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    def _send(self, headers: dict[str, str], body: bytes) -> Any:
        bearer = headers.get("authorization", "").removeprefix("Bearer ")
        if self.issued.get(bearer, 0.0) < time.time():
            self.refuse("UNAUTHENTICATED")
            return Answer(
                401,
                {
                    "error": {
                        "code": 401,
                        "message": "Request had invalid authentication credentials.",
                        "status": "UNAUTHENTICATED",
                    }
                },
            )
        try:
            message = json.loads(body)["message"]
            token = message["token"]
        except (ValueError, KeyError, TypeError):
            self.refuse("INVALID_ARGUMENT")
            return fcm_error("INVALID_ARGUMENT", "Invalid JSON payload received.")
        if not isinstance(token, str) or address_problem(token) is not None:
            self.refuse("INVALID_ARGUMENT")
            return fcm_error(
                "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token"
            )
        if token in self.dead:
            self.refuse("UNREGISTERED")
            return fcm_error("UNREGISTERED", "Requested entity was not found.")

        def act() -> Answer:
            android = message.get("android") or {}
            tag = (android.get("notification") or {}).get("tag")
            shown = dict(message.get("notification") or {})
            self.show(token, shown, tag)
            with self._lock:
                self.messages.append(message)
                name = f"projects/{self.project_id}/messages/{len(self.messages)}"
            return Answer(200, {"name": name})

        return self.deliver(act)

    def unavailable(self) -> Answer:
        return fcm_error("UNAVAILABLE", "The service is currently unavailable.")

    def limited(self) -> Answer:
        return fcm_error(
            "QUOTA_EXCEEDED", "Quota exceeded for sending messages.", {"Retry-After": "1"}
        )
