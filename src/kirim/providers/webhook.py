"""An HTTP webhook provider on httpx, sending ``Idempotency-Key`` and ``X-Request-Id``.

Failures are classified at this seam:

- the request cannot be built (a header or body that cannot be encoded): nothing
  left this host → ``NotSent`` (a ``PermanentFailure``: it would fail again)
- connection refused or not established, pool exhausted, 408, 429: the request was
  certainly not processed → ``TransientFailure`` (its ``Retry-After`` honoured)
- 409 (an earlier request with this idempotency key is still being processed),
  timeouts and broken connections after the request was written, 5xx →
  ``AmbiguousFailure``: the provider may have acted on it (or will)
- any other 4xx → ``PermanentFailure``

A channel that knows its provider better overrides the class of a status
(``retry_on``, ``ambiguous_on``, ``permanent_on``: lists of codes 300-599, each code
in one list at most): a provider whose 503 means "not processed, come back later"
says ``retry_on = [503]``, and its ``Retry-After`` is then honoured too (every
retried status's is).

With ``secret`` (one ``whsec_…`` secret, or a list of them while rotating) every
request is signed per Standard Webhooks (``kirim.providers.signing``): ``webhook-id``
is the idempotency key, ``webhook-timestamp`` the moment of sending.

With ``lookup_url`` (``http://…/lookup/{key}``, the key URL-quoted into ``{key}``)
it can also say whether it accepted a key (``lookup``): 200 → accepted (the message
id from the body's ``id`` or ``X-Message-Id``), 404 → not accepted, anything else
raises, so the worker keeps the delivery in doubt. ``lookup_lag``: seconds after a
request lands before the lookup is sure to see it (the worker adds them to the
time an attempt takes to settle).
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from kirim.errors import (
    AmbiguousFailure,
    NotSent,
    PermanentFailure,
    ProviderError,
    TransientFailure,
)
from kirim.providers.base import Message, Sent
from kirim.providers.signing import Signer
from kirim.validation import DAY, BadValue, Number

_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
#: the TOML keys of the failure classes, each a list of HTTP status codes
CLASS_KEYS = ("retry_on", "ambiguous_on", "permanent_on")
_CLASSES: Mapping[str, type[ProviderError]] = {
    "retry_on": TransientFailure,
    "ambiguous_on": AmbiguousFailure,
    "permanent_on": PermanentFailure,
}


def status_classes(
    *,
    retry_on: Iterable[int] = (),
    ambiguous_on: Iterable[int] = (),
    permanent_on: Iterable[int] = (),
) -> dict[int, type[ProviderError]]:
    """The overridden statuses and their class; ValueError on a code that is not
    300-599 or that is in two lists."""
    classes: dict[int, type[ProviderError]] = {}
    given = {"retry_on": retry_on, "ambiguous_on": ambiguous_on, "permanent_on": permanent_on}
    for name, codes in given.items():
        for code in codes:
            if isinstance(code, bool) or not isinstance(code, int) or not 300 <= code <= 599:
                raise ValueError(f"{name} takes HTTP status codes from 300 to 599, not {code!r}")
            if code in classes and classes[code] is not _CLASSES[name]:
                raise ValueError(f"{name}: status {code} is in another of {', '.join(CLASS_KEYS)}")
            classes[code] = _CLASSES[name]
    return classes


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset({"url", "headers", "token", "lookup_url", "lookup_lag", "secret", *CLASS_KEYS})
#: ``lookup_lag``'s bounds
LOOKUP_LAG = Number(minimum=0, maximum=DAY, unit="seconds")


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with a webhook channel's options (its URLs, lookup, headers,
    signing and failure classes), or None."""
    if not isinstance(options.get("url"), str) or not options["url"].startswith(
        ("http://", "https://")
    ):
        return "url is required for a webhook (http:// or https://)"
    lookup_url = options.get("lookup_url")
    if lookup_url is not None and (
        not isinstance(lookup_url, str)
        or not lookup_url.startswith(("http://", "https://"))
        or "{key}" not in lookup_url
    ):
        return "lookup_url must be an http:// or https:// URL with {key} in it"
    if options.get("lookup") and lookup_url is None:
        return "lookup: the webhook provider has no lookup without lookup_url"
    try:
        LOOKUP_LAG.check("lookup_lag", options.get("lookup_lag", 0))
    except BadValue as exc:
        return str(exc)
    headers = options.get("headers", {})
    if not isinstance(headers, Mapping) or not all(isinstance(v, str) for v in headers.values()):
        return "headers must be a table of strings"
    if not isinstance(options.get("token", ""), str):
        return "token must be a string"
    secret = options.get("secret")
    if secret is not None:
        if isinstance(secret, list) and not all(isinstance(s, str) for s in secret):
            return "secret must be a whsec_ secret or a list of them"
        if not isinstance(secret, str | list):
            return "secret must be a whsec_ secret or a list of them"
        try:
            Signer(secret)
        except ValueError as exc:
            return str(exc) if str(exc).startswith("secret") else f"secret: {exc}"
    for name in CLASS_KEYS:
        if name in options and not isinstance(options[name], list):
            return f"{name} must be a list of HTTP status codes, such as [503]"
    try:
        status_classes(**{name: options.get(name, ()) for name in CLASS_KEYS})
    except ValueError as exc:
        return str(exc)
    return None


def from_table(options: Mapping[str, Any]) -> WebhookProvider:
    """The provider of a checked ``[channels.NAME]`` table."""
    return WebhookProvider(
        options["url"],
        timeout=float(options.get("timeout", 10)),
        idempotent=bool(options.get("idempotent", False)),
        headers=dict(options.get("headers", {})),
        token=options.get("token"),
        lookup_url=options.get("lookup_url"),
        lookup_lag=float(options.get("lookup_lag", 0)),
        secret=options.get("secret"),
        retry_on=options.get("retry_on", ()),
        ambiguous_on=options.get("ambiguous_on", ()),
        permanent_on=options.get("permanent_on", ()),
    )


def json_body(body: Any) -> bytes:
    """The JSON bytes of a request body, as httpx would write them (the bytes signed)."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


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
        secret: str | Sequence[str] | None = None,
        retry_on: Collection[int] = (),
        ambiguous_on: Collection[int] = (),
        permanent_on: Collection[int] = (),
        signing_clock: Callable[[], float] = time.time,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        """``signing_clock``: where ``webhook-timestamp`` comes from (tests move it)."""
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
        self._classes = status_classes(
            retry_on=retry_on, ambiguous_on=ambiguous_on, permanent_on=permanent_on
        )
        self._signer = None if secret is None else Signer(secret, clock=signing_clock)
        self._headers = dict(headers or {})
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        for name, value in self._headers.items():  # fail at start, not at the first send
            try:
                httpx.Headers({name: value})
            except (UnicodeError, TypeError, ValueError):
                shown = "token" if name == "Authorization" else f"header {name!r}"
                raise ValueError(
                    f"{shown} must be plain ASCII text (HTTP headers cannot carry it)"
                ) from None
        self._client = client or httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_connections=100)
        )

    def __repr__(self) -> str:  # never the headers (they may hold credentials), nor a secret
        signed = ", signed=True" if self._signer is not None else ""
        return f"WebhookProvider(url={self.url!r}, idempotent={self.idempotent}{signed})"

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
            "Content-Type": "application/json",
            **self._headers,
            "Idempotency-Key": message.idempotency_key,
            "X-Request-Id": message.provider_request_id,
        }
        try:  # everything up to here happened on this host: nothing has left yet
            content = json_body(body)
            if self._signer is not None:  # signed now: the timestamp is the sending time
                headers.update(self._signer.headers(message.idempotency_key, content))
            request = self._client.build_request("POST", self.url, content=content, headers=headers)
        except Exception as exc:
            raise NotSent(f"not sent: the request cannot be built: {exc}") from exc
        try:
            response = await self._client.send(request)
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
        text = f"HTTP {code}: {response.text[:200]}"
        kind = self._classes.get(code) or default_class(code)
        if kind is TransientFailure:  # retried: when the provider says, not sooner
            after = retry_after(response.headers.get("Retry-After"))
            raise TransientFailure(text, status_code=code, retry_after=after)
        raise kind(text, status_code=code)

    async def aclose(self) -> None:
        await self._client.aclose()


def default_class(code: int) -> type[ProviderError]:
    """The class of a non-2xx status unless the channel says otherwise: 408 and 429 are
    retried (not processed), 409 (this key is in progress) and 5xx are ambiguous, any
    other 4xx is permanent; anything else (a 3xx not followed) is ambiguous."""
    if code in (408, 429):
        return TransientFailure
    if code == 409:  # "in progress" for this key: the earlier request may still land
        return AmbiguousFailure
    if 400 <= code < 500:
        return PermanentFailure
    return AmbiguousFailure


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
