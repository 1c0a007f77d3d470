"""The one HTTP exchange of the service providers (APNs, FCM, Web Push, Twilio, Slack),
with its failures classified by where they happened.

- building the request (a body that cannot be encoded, a header that cannot be
  written, a signature or token that cannot be made here): nothing left this host →
  ``NotSent``
- the connection cannot be made (refused, not established in time, no free
  connection in the pool, a TLS handshake that fails): the request never left →
  ``TransientFailure``
- once the request was handed to the connection, no answer (a timeout, a reset, a
  closed HTTP/2 stream): the service may have acted on it → ``AmbiguousFailure``
- an answer: the provider classifies it from the service's own documented error
  (its status and error body); ``rate_limited`` turns a 429 into a
  ``TransientFailure`` that carries the service's ``Retry-After``.

Every service provider also has ``collapse_id``: what a resend carries so that the
device shows one notification however often it is sent (APNs ``apns-collapse-id``,
FCM ``collapse_key`` and the Android notification's ``tag``, Web Push ``Topic``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from kirim.errors import AmbiguousFailure, NotSent, TransientFailure
from kirim.providers.webhook import retry_after

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
#: the namespace of the APNs ``apns-id`` derived from an idempotency key (UUIDv5)
APNS_NAMESPACE = uuid.UUID("3f7c6a52-3c1e-5b8a-9d0e-6b6972696d00")


def collapse_id(key: str) -> str:
    """32 hexadecimal digits of sha256(key): an APNs ``apns-collapse-id`` (at most 64
    bytes), an FCM ``collapse_key`` and notification ``tag``, and an RFC 8030
    ``Topic`` (at most 32 characters of the URL-safe base64 alphabet) at once."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def apns_id(key: str) -> str:
    """The ``apns-id`` of every request of one delivery: a UUIDv5 of its key (APNs
    echoes it, so the answer names the delivery)."""
    return str(uuid.uuid5(APNS_NAMESPACE, key))


def user_agent_header(user_agent: str | None) -> dict[str, str]:
    """The ``User-Agent`` of a provider's requests: ``kirim/VERSION`` and, when the
    channel says one (``user_agent``), what it says after it."""
    from kirim.version import __version__

    own = f"kirim/{__version__}"
    return {"User-Agent": own if not user_agent else f"{own} {user_agent}"}


def build(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    service: str,
    make: Callable[[], Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> httpx.Request:
    """The request, or ``NotSent`` (nothing has left this host yet). ``make``: more
    arguments made now (a token, a signature, an encrypted body), inside the same
    guard."""
    try:
        extra = dict(make()) if make is not None else {}
        return client.build_request(method, url, **kwargs, **extra)
    except (NotSent, TransientFailure):
        raise
    except Exception as exc:
        raise NotSent(f"not sent: {service}: the request cannot be built: {exc}") from exc


async def exchange(
    client: httpx.AsyncClient, request: httpx.Request, *, service: str
) -> httpx.Response:
    """Send ``request``: its response, ``TransientFailure`` when it never left,
    ``AmbiguousFailure`` when it left and no answer came."""
    try:
        return await client.send(request)
    except _NOT_SENT as exc:
        raise TransientFailure(f"not sent: {service}: {type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise AmbiguousFailure(f"no answer: {service}: {type(exc).__name__}: {exc}") from exc


def rate_limited(response: httpx.Response, text: str) -> TransientFailure:
    """A 429 (or a service's own "slow down"): not processed, retried no sooner than
    its ``Retry-After``."""
    return TransientFailure(
        text,
        status_code=response.status_code,
        retry_after=retry_after(response.headers.get("Retry-After")),
    )


def json_of(response: httpx.Response) -> Any:
    """The response's JSON body, or None when it has none."""
    try:
        return response.json()
    except ValueError:
        return None


def said(response: httpx.Response, limit: int = 200) -> str:
    """``HTTP 410: {"reason":"Unregistered"}``: the answer in words, cut."""
    return f"HTTP {response.status_code}: {response.text[:limit]}"
