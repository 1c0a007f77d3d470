"""Firebase Cloud Messaging, HTTP v1, with a service account's OAuth2 tokens.

Library: google-auth (the ``fcm`` extra, with its ``requests`` transport) makes and
renews the access token: it signs the service account's JWT assertion and trades it
at the account's ``token_uri``, in a thread (its API is synchronous), once for all
the sends that wait for it. The send itself is httpx (``POST
{url}/v1/projects/{project}/messages:send``), so its failures are classified at the
same seam as every other provider's. Not firebase-admin: it brings its own HTTP
client and retries, which would resend out of kirim's sight.

FCM keeps no idempotency key. What makes a resend safe is on the device: the
message's Android ``collapse_key`` and notification ``tag`` (a notification with the
tag of one the tray shows replaces it), the ``apns-collapse-id`` for iOS devices and
the ``Topic`` for web ones, all from the idempotency key.

A failure to get a token happened before any request to FCM: ``TransientFailure``
when google-auth says it may pass (a 5xx of the token endpoint, no connection),
``NotSent`` otherwise (a key the endpoint refuses: fix the account, then retry the
dead letters; nothing was sent). FCM's answers (``error.status`` and the
``FcmError`` code in ``error.details``):

- 200: ``Sent`` (the message's ``name``)
- ``UNREGISTERED`` (404), ``SENDER_ID_MISMATCH`` (403): the token is not ours to use
  any more → ``DeadAddress`` (retired)
- ``QUOTA_EXCEEDED`` (429): ``TransientFailure`` with ``Retry-After``
- ``UNAUTHENTICATED`` (401, an access token that expired): ``TransientFailure``; the
  token is made again
- ``UNAVAILABLE`` (503), ``INTERNAL`` (500), any 5xx: ``AmbiguousFailure`` (FCM may
  have queued the message; a resend collapses on the device)
- ``INVALID_ARGUMENT`` (400), ``THIRD_PARTY_AUTH_ERROR`` (401: the APNs or web push
  credentials in Firebase), ``PERMISSION_DENIED``, any other 4xx: ``PermanentFailure``
"""

from __future__ import annotations

import asyncio
import calendar
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from kirim.errors import (
    AmbiguousFailure,
    DeadAddress,
    NotSent,
    PermanentFailure,
    TransientFailure,
)
from kirim.providers.base import Message, Sent
from kirim.providers.exchange import (
    build,
    collapse_id,
    exchange,
    json_of,
    rate_limited,
    said,
    user_agent_header,
)
from kirim.providers.shaping import fcm_message

URL = "https://fcm.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
DEAD = frozenset({"UNREGISTERED", "SENDER_ID_MISMATCH"})
#: seconds before its expiry that a token is made again
EARLY = 300.0


def address_problem(address: str) -> str | None:
    """Why ``address`` is not an FCM registration token, or None."""
    if not 20 <= len(address) <= 4096 or not address.isascii() or not address.isprintable():
        return "an FCM registration token is 20 to 4096 printable ASCII characters"
    if any(c in address for c in " /?#"):
        return "an FCM registration token has no spaces, '/', '?' or '#'"
    return None


def read_account(options: Mapping[str, Any]) -> dict[str, Any]:
    """The service account's JSON (``service_account_file``, or ``service_account``:
    the JSON text); ValueError that never shows the key."""
    path, text = options.get("service_account_file"), options.get("service_account")
    if (path is None) == (text is None):
        raise ValueError("give service_account_file (the key's JSON file) or service_account")
    try:
        raw = Path(path).read_text(encoding="utf-8") if path is not None else str(text)
        info = json.loads(raw)
    except OSError as exc:
        raise ValueError(f"service_account_file cannot be read: {exc.strerror}") from None
    except ValueError:
        raise ValueError("the service account is not JSON") from None
    missing = [k for k in ("client_email", "private_key", "token_uri") if not info.get(k)]
    if not isinstance(info, dict) or missing:
        raise ValueError(f"the service account lacks {', '.join(missing) or 'its fields'}")
    return info


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset({"service_account_file", "service_account", "project_id", "url", "user_agent"})


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with an fcm channel's options, or None."""
    if options.get("lookup"):
        return "lookup: the fcm provider has no lookup"
    try:
        info = read_account(options)
    except ValueError as exc:
        return str(exc)
    if not (options.get("project_id") or info.get("project_id")):
        return "project_id is required (the service account has none)"
    url = options.get("url")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("https://", "http://"))
    ):
        return "url must be an http:// or https:// URL"
    return None


def from_table(options: Mapping[str, Any]) -> FcmProvider:
    """The provider of a checked ``[channels.NAME]`` table (ImportError: kirim[fcm])."""
    return FcmProvider(
        account=read_account(options),
        project_id=options.get("project_id"),
        url=options.get("url", URL),
        timeout=float(options.get("timeout", 10)),
        user_agent=options.get("user_agent"),
    )


class FcmProvider:
    """Send each delivery to its registration token (the delivery's recipient)."""

    idempotent = True  # a resend carries the same collapse key and tag: it replaces
    address_kind = "fcm"

    def __init__(
        self,
        *,
        account: Mapping[str, Any],
        project_id: str | None = None,
        url: str = URL,
        timeout: float = 10.0,
        user_agent: str | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        from google.auth.transport.requests import Request  # the fcm extra
        from google.oauth2 import service_account

        try:
            self._credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
                dict(account), scopes=[SCOPE]
            )
        except Exception as exc:  # never the key
            raise ValueError(f"the service account cannot be used: {type(exc).__name__}") from None
        self._request = Request()
        self.project_id = str(project_id or account.get("project_id") or "")
        if not self.project_id:
            raise ValueError("project_id is required (the service account has none)")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._lock = asyncio.Lock()
        self._token: tuple[float, str] | None = None  # (expires at, token)
        self._client = client or httpx.AsyncClient(
            headers=user_agent_header(user_agent), timeout=timeout
        )

    def __repr__(self) -> str:  # never the account's key
        return f"FcmProvider(url={self.url!r}, project_id={self.project_id!r})"

    async def _access_token(self) -> str:
        async with self._lock:
            if self._token is not None and time.time() < self._token[0] - EARLY:
                return self._token[1]
            try:
                await asyncio.wait_for(
                    asyncio.to_thread(self._credentials.refresh, self._request), self.timeout
                )
            except TimeoutError:
                raise TransientFailure("not sent: fcm: no OAuth token in time") from None
            except Exception as exc:
                retry = bool(getattr(exc, "retryable", False)) or "Transport" in type(exc).__name__
                kind = TransientFailure if retry else NotSent
                raise kind(f"not sent: fcm: no OAuth token: {type(exc).__name__}: {exc}") from exc
            expiry = self._credentials.expiry  # google-auth's: a naive UTC datetime
            until = calendar.timegm(expiry.timetuple()) if expiry else time.time() + 3000
            self._token = (until, str(self._credentials.token))
            return self._token[1]

    async def send(self, message: Message) -> Sent:
        token = message.recipient
        if (problem := address_problem(token)) is not None:
            raise NotSent(f"not sent: fcm: {problem}")
        try:
            body = {
                "message": fcm_message(message.payload, token, collapse_id(message.idempotency_key))
            }
        except ValueError as exc:
            raise NotSent(f"not sent: fcm: {exc}") from exc
        access = await self._access_token()  # before any request to FCM
        request = build(
            self._client,
            "POST",
            f"{self.url}/v1/projects/{self.project_id}/messages:send",
            service="fcm",
            json=body,
            headers={"Authorization": f"Bearer {access}"},
        )
        response = await exchange(self._client, request, service="fcm")
        return self._classify(response, token)

    def _classify(self, response: httpx.Response, token: str) -> Sent:
        code = response.status_code
        data = json_of(response)
        if code == 200:
            name = data.get("name") if isinstance(data, dict) else None
            return Sent(provider_message_id=None if name is None else str(name))
        status, detail = error_codes(data)
        fcm = detail or status
        text = f"fcm: {fcm or 'error'}: {said(response)}"
        if fcm in DEAD:
            raise DeadAddress(text, address=token, status_code=code)
        if code == 429 or fcm == "QUOTA_EXCEEDED":
            raise rate_limited(response, text)
        if code == 401 and fcm != "THIRD_PARTY_AUTH_ERROR":
            self._token = None
            raise TransientFailure(text, status_code=code)
        if code >= 500:
            raise AmbiguousFailure(text, status_code=code)
        raise PermanentFailure(text, status_code=code)

    async def aclose(self) -> None:
        await self._client.aclose()


def error_codes(data: Any) -> tuple[str | None, str | None]:
    """(``error.status``, the ``FcmError`` code of ``error.details``) of an answer."""
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None, None
    fcm = None
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("FcmError"):
            fcm = detail.get("errorCode")
    status = error.get("status")
    return (None if status is None else str(status)), (None if fcm is None else str(fcm))
