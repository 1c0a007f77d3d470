"""An HTTP webhook provider on httpx, sending ``Idempotency-Key`` and ``X-Request-Id``.

Failures are classified at this seam:

- connection refused or not established, pool exhausted, 408, 429: the request was
  certainly not processed → ``TransientFailure`` (429/503 ``Retry-After`` honoured)
- 409 (an earlier request with this idempotency key is still being processed),
  timeouts and broken connections after the request was written, 5xx →
  ``AmbiguousFailure``: the provider may have acted on it (or will)
- any other 4xx → ``PermanentFailure``

With ``lookup_url`` (``http://…/lookup/{key}``, the key URL-quoted into ``{key}``)
it can also say whether it accepted a key (``lookup``): 200 → accepted (the message
id from the body's ``id`` or ``X-Message-Id``), 404 → not accepted, anything else
raises, so the worker keeps the delivery in doubt. ``lookup_lag``: seconds after a
request lands before the lookup is sure to see it (the worker adds them to the
time an attempt takes to settle).
"""

from __future__ import annotations

import email.utils
import math
import time
from typing import Any
from urllib.parse import quote

import httpx

from kirim.errors import AmbiguousFailure, PermanentFailure, TransientFailure
from kirim.providers.base import Message, Sent

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class WebhookProvider:
    """POST the message as JSON to ``url``."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        idempotent: bool = False,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        lookup_url: str | None = None,
        lookup_lag: float = 0.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        if lookup_url is not None and "{key}" not in lookup_url:
            raise ValueError(f"lookup_url {lookup_url!r} must contain {{key}}")
        if not math.isfinite(lookup_lag) or lookup_lag < 0:
            raise ValueError(f"lookup_lag must be a number of seconds >= 0, not {lookup_lag!r}")
        self.url = url
        self.idempotent = idempotent
        self.lookup_url = lookup_url
        #: seconds until a landed request shows in ``lookup`` (part of the settle bound)
        self.lookup_lag = float(lookup_lag)
        #: the longest one request may take: the worker's settle bound relies on it
        self.timeout = timeout
        self._headers = dict(headers or {})
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._client = client or httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_connections=100)
        )

    def __repr__(self) -> str:  # never show the headers: they may hold credentials
        return f"WebhookProvider(url={self.url!r}, idempotent={self.idempotent})"

    async def send(self, message: Message) -> Sent:
        body: dict[str, Any] = {
            "delivery_id": message.delivery_id,
            "event_id": message.event_id,
            "recipient": message.recipient,
            "channel": message.channel,
            "payload": message.payload,
            "attempt": message.attempt,
        }
        headers = {
            **self._headers,
            "Idempotency-Key": message.idempotency_key,
            "X-Request-Id": message.provider_request_id,
        }
        try:
            response = await self._client.post(self.url, json=body, headers=headers)
        except _NOT_SENT as exc:
            raise TransientFailure(f"not sent: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise AmbiguousFailure(f"no answer: {type(exc).__name__}: {exc}") from exc
        return self._classify(response)

    async def lookup(self, idempotency_key: str) -> Sent | None:
        """Whether the provider accepted ``idempotency_key``: ``Sent`` if so, None if it
        says not (404). Any other answer, or none, raises: the question stays open."""
        if self.lookup_url is None:
            raise RuntimeError(f"{self!r} has no lookup_url to ask")
        url = self.lookup_url.replace("{key}", quote(idempotency_key, safe=""))
        try:
            response = await self._client.get(url, headers=self._headers)
        except httpx.HTTPError as exc:
            raise AmbiguousFailure(f"lookup: no answer: {type(exc).__name__}: {exc}") from exc
        code = response.status_code
        if code == 200:
            return Sent(provider_message_id=_message_id(response))
        if code == 404:
            return None
        raise AmbiguousFailure(f"lookup: HTTP {code}: {response.text[:200]}", status_code=code)

    def _classify(self, response: httpx.Response) -> Sent:
        code = response.status_code
        if 200 <= code < 300:
            return Sent(provider_message_id=_message_id(response))
        text = response.text[:200]
        if code in (408, 429):
            raise TransientFailure(
                f"HTTP {code}: {text}",
                status_code=code,
                retry_after=retry_after(response.headers.get("Retry-After")),
            )
        if code == 409:  # "in progress" for this key: the earlier request may still land
            raise AmbiguousFailure(f"HTTP {code}: {text}", status_code=code)
        if 400 <= code < 500:
            raise PermanentFailure(f"HTTP {code}: {text}", status_code=code)
        raise AmbiguousFailure(f"HTTP {code}: {text}", status_code=code)

    async def aclose(self) -> None:
        await self._client.aclose()


def _message_id(response: httpx.Response) -> str | None:
    """The provider's id of the message: ``X-Message-Id``, else the JSON body's ``id``."""
    message_id: str | None = response.headers.get("X-Message-Id")
    if message_id is None:
        try:
            data = response.json()
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("id") is not None:
            message_id = str(data["id"])
    return message_id
