"""What keeps other sites from driving the service through a browser.

- An unprotected dashboard answers only the ``Host`` names of ``[serve]
  allowed_hosts`` (the loopback names by default, any port): a page of another site
  whose name was rebound to this address (DNS rebinding) sends its own name, and is
  refused.
- Write actions (retry, cancel) need a token (``protect_dashboard``), or a server
  that only this host can reach (bound to loopback) and an allowed ``Host``.
- Every response forbids framing (clickjacking): ``Content-Security-Policy:
  frame-ancestors 'none'`` and ``X-Frame-Options: DENY``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kirim.config import ServeSettings

#: sent with every response; the dashboard has no script, no inline style, no frame
HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; style-src 'self'; form-action 'self'; base-uri 'none'; "
        b"frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
]


def loopback(host: str) -> bool:
    """True for an address (or ``localhost``) that only this host can reach."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The name of a ``Host`` header (or an ``allowed_hosts`` entry): lower case,
    without its port or the brackets of an IPv6 address; "" when it is malformed."""
    text = value.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :] if end > 0 else ""
        if end <= 0 or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return ""
        return text[1:end]
    if text.count(":") == 1:
        name, _, port = text.partition(":")
        return name if port.isdigit() else ""
    return text


def host_allowed(header: str | None, allowed: Iterable[str]) -> bool:
    """Whether a request's ``Host`` header names one of ``allowed`` (any port)."""
    names = {host_name(a) for a in allowed}
    if "*" in names:
        return True
    if header is None:
        return False
    name = host_name(header)
    return bool(name) and name in names


def writable(settings: ServeSettings) -> bool:
    """Whether the dashboard may retry and cancel: with a token, or bound to loopback
    (the ``Host`` is checked on every page of an unprotected dashboard)."""
    return settings.protect_dashboard or loopback(settings.host)


class FrameGuard:
    """Pure ASGI middleware: the ``HEADERS`` on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        await self.app(scope, receive, sending)
