"""The Apprise bridge: ~100 services (Slack, Discord, Telegram, Matrix, ntfy, Pushover,
Teams, email, …) from their Apprise URLs, with ``pip install 'kirim[apprise]'``.

The payload gives ``body`` (or ``text``) and optionally ``title`` (or ``subject``) and
``format`` (``text``, ``markdown`` or ``html``). Every URL of the channel is notified;
the send succeeds when Apprise says every one of them did.

kirim owns retries, so Apprise's are off (``retry=0`` on every service, whatever the
URL says). Apprise reports only success or failure, not whether a request had left
when it failed, so:

- a payload without a body, or a URL Apprise cannot build: ``NotSent``;
- a call that had not begun by a quarter of ``timeout`` (every thread busy): it
  never starts → ``TransientFailure``;
- any failure Apprise reports: the request may have left (a service that took it and
  then answered 500, a partial success over several URLs) → ``AmbiguousFailure``,
  and the channel's in-doubt policy decides. ``idempotent`` is false by default:
  almost no service behind Apprise deduplicates.

The JSON, form and XML targets (``json://``, ``form://``, ``xml://`` and their ``s``
forms) carry ``Idempotency-Key`` and ``X-Request-Id`` headers like the webhook
provider. Email through ``mailto://`` gets a fresh Message-ID from Apprise on every
send: use ``provider = "smtp"`` where a stable one matters.

Apprise calls are blocking; each runs in a thread of this provider. Its services get
connect and read timeouts of a quarter of ``timeout``, so a one-request service
writes its request within half of it or never; a service whose protocol takes
several round trips (``mailto://``'s SMTP dialogue) may write later than kirim
waits. URLs hold tokens: they are never shown (not in ``repr``, not in an error, and
Apprise's own log masks them with ``secure_logging``).
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from kirim.errors import AmbiguousFailure, NotSent, TransientFailure
from kirim.providers.base import Message, Sent

#: the TOML keys of an apprise channel, besides the ones every channel has
OPTIONS = frozenset({"urls"})
HINT = "provider = \"apprise\" needs Apprise: pip install 'kirim[apprise]'"
_HEADERS_SCHEMES = ("json", "jsons", "form", "forms", "xml", "xmls")
_FORMATS = ("text", "markdown", "html")


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset({"urls"})


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with an apprise channel's options, or None (Apprise not needed)."""
    if options.get("lookup"):
        return "lookup: the apprise provider has no lookup"
    urls = options.get("urls")
    if (
        not isinstance(urls, list)
        or not urls
        or not all(isinstance(u, str) and "://" in u for u in urls)
    ):
        return 'urls is required for an apprise channel: a list of Apprise URLs ("json://…")'
    return None


def from_table(options: Mapping[str, Any]) -> AppriseProvider:
    """The provider of a checked ``[channels.NAME]`` table (kirim[apprise])."""
    return AppriseProvider(
        options["urls"],
        timeout=float(options.get("timeout", 10)),
        idempotent=bool(options.get("idempotent", False)),
    )


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower()


class _NotStarted(Exception):
    """The call waited too long for a thread: it never began."""


class AppriseProvider:
    """Notify every Apprise URL of the channel, in a thread, without Apprise's retries."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout: float = 10.0,
        idempotent: bool = False,
        max_threads: int = 64,
    ) -> None:
        try:
            with warnings.catch_warnings():  # Apprise's plugins import imghdr (3.11, 3.12)
                warnings.simplefilter("ignore", DeprecationWarning)
                import apprise

                self._apprise: Any = apprise
                self._asset = apprise.AppriseAsset(storage_mode="memory", secure_logging=True)
                for i, url in enumerate(urls):  # load the plugins now, and check each URL
                    if apprise.Apprise.instantiate(url, asset=self._asset) is None:
                        raise ValueError(
                            f"urls[{i}] ({_scheme(url)}://…) is not a URL Apprise can use"
                        )
        except ImportError:
            raise ValueError(HINT) from None
        if not urls:
            raise ValueError("urls: give at least one Apprise URL")
        self._urls = list(urls)
        #: the longest one request may take: the worker's settle bound relies on it
        self.timeout = float(timeout)
        self.idempotent = idempotent
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="apprise")

    def __repr__(self) -> str:  # never the URLs: they hold tokens
        schemes = ", ".join(sorted({_scheme(u) for u in self._urls}))
        return f"AppriseProvider({len(self._urls)} url(s): {schemes})"

    async def send(self, message: Message) -> Sent:
        title, body, body_format = _content(message.payload)
        began = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            ok, failed, total = await loop.run_in_executor(
                self._pool, self._notify, message, title, body, body_format, began
            )
        except _NotStarted as exc:
            raise TransientFailure(f"not sent: {exc}") from None
        except NotSent:
            raise
        except Exception as exc:  # inside Apprise, after it may have sent: unknowable
            raise AmbiguousFailure(
                f"apprise raised {type(exc).__name__}; a request may have left"
            ) from None
        if not ok:
            which = f"{failed} of {total}" if failed is not None else "a"
            raise AmbiguousFailure(
                f"apprise: {which} service(s) reported failure; Apprise does not say "
                "whether the request had left, so it may have been delivered"
            )
        return Sent(provider_message_id=None)

    def _notify(
        self,
        message: Message,
        title: str,
        body: str,
        body_format: str | None,
        began: float,
    ) -> tuple[bool, int | None, int]:
        """In a thread: build the services for this message and notify them."""
        if time.monotonic() - began > self.timeout / 4:
            raise _NotStarted(f"no thread free within {self.timeout / 4:g} s")
        apprise = self._apprise
        notifier = apprise.Apprise(asset=self._asset)
        for url in self._urls:
            if not notifier.add(_with_headers(url, message)):
                raise NotSent(f"not sent: apprise could not build a {_scheme(url)}:// service")
        for service in notifier:
            if hasattr(service, "retry"):
                service.retry = 0  # kirim owns retries
            service.socket_connect_timeout = min(service.socket_connect_timeout, self.timeout / 4)
            service.socket_read_timeout = min(service.socket_read_timeout, self.timeout / 4)
        result = notifier.notify(body=body, title=title, body_format=body_format)
        failed = getattr(result, "failed_count", None)
        return bool(result), failed, len(self._urls)

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _content(payload: Any) -> tuple[str, str, str | None]:
    """(title, body, body format) from a payload; ``NotSent`` if it has no body."""
    if not isinstance(payload, Mapping):
        raise NotSent("not sent: an apprise payload is an object with a body")
    body = payload.get("body", payload.get("text"))
    title = payload.get("title", payload.get("subject", ""))
    body_format = payload.get("format")
    if not isinstance(body, str) or not body:
        raise NotSent("not sent: an apprise payload needs body (or text), a string")
    if not isinstance(title, str):
        raise NotSent("not sent: the payload's title must be a string")
    if body_format is not None and body_format not in _FORMATS:
        raise NotSent(f"not sent: the payload's format must be one of {', '.join(_FORMATS)}")
    return title, body, body_format


def _with_headers(url: str, message: Message) -> str:
    """``url`` with kirim's headers added where the target sends custom headers."""
    if _scheme(url) not in _HEADERS_SCHEMES:
        return url
    extra = (
        f"+Idempotency-Key={quote(message.idempotency_key, safe='')}"
        f"&+X-Request-Id={quote(message.provider_request_id, safe='')}"
    )
    base, _, fragment = url.partition("#")
    joined = f"{base}{'&' if '?' in base else '?'}{extra}"
    return f"{joined}#{fragment}" if fragment else joined
