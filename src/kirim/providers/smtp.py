"""Email over SMTP on aiosmtplib: one connection per message, failures classified by
where in the dialogue they happened.

The payload gives ``subject``, ``text`` and optionally ``html`` (then the message is
``multipart/alternative``); the recipient is the address. The ``Message-ID`` is
derived from the idempotency key (``<sha256(key)[:32]@from-domain>``), so every
resend of one notification carries the same one and a receiving system that drops
repeated Message-IDs sees one message.

Failures are classified at this seam (RFC 5321 replies; RFC 1047's window):

- the message cannot be built (a payload without ``subject`` or ``text``, a
  recipient that is not an address, a header that cannot be encoded): nothing left
  this host → ``NotSent``
- connection refused, a timeout or a dropped connection, and any 4xx reply, before
  the message's content was written (greeting, EHLO, STARTTLS, AUTH, MAIL, RCPT,
  DATA): the server never had the message → ``TransientFailure``
- a 5xx reply before the content (a refused sender, an unknown recipient, bad
  credentials), a certificate that does not verify, a server without STARTTLS when
  it is required, or without AUTH when the channel has a password →
  ``PermanentFailure``
- after the content and its final ``.`` were written: a 250 is ``Sent``; a 4xx or
  5xx reply says the server did not take it (``TransientFailure`` /
  ``PermanentFailure``); no reply (a timeout, a dropped connection) is the window
  where the server may have accepted the message without saying so →
  ``AmbiguousFailure``

The whole dialogue is bounded by ``timeout`` (less a margin, so that this seam, not
the worker's cut-off, decides the class of a slow server). The password is never
shown: not in ``repr``, not in an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import re
import socket
import ssl
from collections.abc import Mapping
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY
from typing import Any, Literal

import aiosmtplib

from kirim.errors import (
    AmbiguousFailure,
    NotSent,
    PermanentFailure,
    ProviderError,
    TransientFailure,
)
from kirim.providers.base import Message, Sent

Security = Literal["starttls", "tls", "none"]
SECURITY: tuple[Security, ...] = ("starttls", "tls", "none")
DEFAULT_PORT: Mapping[str, int] = {"starttls": 587, "tls": 465, "none": 25}
#: the TOML keys of an smtp channel, besides the ones every channel has
OPTIONS = frozenset(
    {"host", "port", "security", "username", "password", "from", "local_hostname", "ca_file"}
)
_QUEUED = re.compile(r"queued as ([A-Za-z0-9._@<>-]{1,128})", re.IGNORECASE)
_PERIOD = re.compile(rb"(?m)^\.")
_ADDRESS = re.compile(r"[^@\s<>()\[\],;:\\\"]+@[^@\s<>()\[\],;:\\\"]+")


def message_id(idempotency_key: str, domain: str = "kirim") -> str:
    """The Message-ID of every send of the notification with this key."""
    return f"<{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]}@{domain}>"


#: the keys of a ``[channels.NAME]`` table this provider takes besides the common ones
KEYS = frozenset(
    {"host", "port", "security", "username", "password", "from", "local_hostname", "ca_file"}
)


def check_options(options: Mapping[str, Any]) -> str | None:
    """What is wrong with an smtp channel's options (``key must …``), or None."""
    if options.get("lookup"):
        return "lookup: the smtp provider has no lookup"
    host = options.get("host")
    if not isinstance(host, str) or not host or not host.isascii() or " " in host:
        return "host is required for an smtp channel (a host name or address)"
    port = options.get("port")
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535
    ):
        return "port must be a port number (1-65535)"
    if options.get("security", "starttls") not in SECURITY:
        return "security must be starttls, tls or none"
    sender = options.get("from")
    if not isinstance(sender, str) or not _is_address(email.utils.parseaddr(sender)[1]):
        return 'from is required for an smtp channel (an address: "Shop <shop@example.com>")'
    for key in ("username", "password", "local_hostname", "ca_file"):
        if key in options and (not isinstance(options[key], str) or not options[key]):
            return f"{key} must be a non-empty string"
    if ("username" in options) != ("password" in options):
        return "username and password go together"
    return None


def from_table(options: Mapping[str, Any]) -> SmtpProvider:
    """The provider of a checked ``[channels.NAME]`` table."""
    return SmtpProvider(
        host=options["host"],
        port=options.get("port"),
        security=options.get("security", "starttls"),
        username=options.get("username"),
        password=options.get("password"),
        from_address=options["from"],
        timeout=float(options.get("timeout", 30)),
        idempotent=bool(options.get("idempotent", False)),
        local_hostname=options.get("local_hostname"),
        ca_file=options.get("ca_file"),
    )


class SmtpProvider:
    """Send each message over its own SMTP connection to ``host``."""

    #: its recipients' addresses are email addresses (``kirim.addresses.KINDS``)
    address_kind = "email"

    def __init__(
        self,
        *,
        host: str,
        from_address: str,
        port: int | None = None,
        security: Security = "starttls",
        username: str | None = None,
        password: str | None = None,
        timeout: float = 30.0,
        idempotent: bool = False,
        local_hostname: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        if security not in SECURITY:
            raise ValueError("security must be starttls, tls or none")
        if (username is None) != (password is None):
            raise ValueError("username and password go together")
        name, address = email.utils.parseaddr(from_address)
        if not _is_address(address):
            raise ValueError("from must be an email address")
        self.host = host
        self.port = port or DEFAULT_PORT[security]
        self.security: Security = security
        self.from_address = email.utils.formataddr((name, address))
        self._envelope_from = address
        self._domain = address.rpartition("@")[2] if address.isascii() else "kirim"
        self._username = username
        self._password = password
        #: the longest one request may take: the worker's settle bound relies on it
        self.timeout = float(timeout)
        self.idempotent = idempotent
        #: the EHLO name (the host's FQDN, looked up once, when not given)
        self.local_hostname = local_hostname
        self._ca_file = ca_file

    def __repr__(self) -> str:  # never the password
        return (
            f"SmtpProvider(host={self.host!r}, port={self.port}, "
            f"security={self.security!r}, from={self.from_address!r})"
        )

    def build(self, message: Message) -> EmailMessage:
        """The email of ``message``; ``NotSent`` if it cannot be built."""
        payload = message.payload
        if not isinstance(payload, Mapping):
            raise NotSent("not sent: an email payload is an object with subject and text")
        subject, text, html = payload.get("subject"), payload.get("text"), payload.get("html")
        if not isinstance(subject, str) or not isinstance(text, str):
            raise NotSent("not sent: an email payload needs subject and text (strings)")
        if html is not None and not isinstance(html, str):
            raise NotSent("not sent: the payload's html must be a string")
        name, address = email.utils.parseaddr(message.recipient)
        if not _is_address(address):
            raise NotSent("not sent: the recipient is not an email address")
        try:
            mail = EmailMessage()
            mail["From"] = self.from_address
            mail["To"] = email.utils.formataddr((name, address))
            mail["Subject"] = subject
            mail["Date"] = email.utils.formatdate(localtime=False, usegmt=True)
            mail["Message-ID"] = message_id(message.idempotency_key, self._domain)
            mail.set_content(text)
            if html is not None:
                mail.add_alternative(html, subtype="html")
        except (ValueError, TypeError, UnicodeError) as exc:
            raise NotSent(f"not sent: the email cannot be built: {exc}") from exc
        return mail

    async def send(self, message: Message) -> Sent:
        mail = self.build(message)
        try:
            content = _dot_stuffed(mail.as_bytes(policy=SMTP_POLICY))
        except (ValueError, TypeError, UnicodeError, LookupError) as exc:
            raise NotSent(f"not sent: the email cannot be encoded: {exc}") from exc
        recipient = email.utils.parseaddr(message.recipient)[1]
        margin = min(1.0, 0.1 * self.timeout)
        client = aiosmtplib.SMTP(
            hostname=self.host,
            port=self.port,
            use_tls=self.security == "tls",
            start_tls=False,  # upgraded below, so that a refusal is classified here
            timeout=self.timeout,
            local_hostname=self.local_hostname,
            cert_bundle=self._ca_file,
        )
        phase = "connect"
        try:
            try:
                async with asyncio.timeout(self.timeout - margin):
                    if client.local_hostname is None:  # once: a DNS lookup may be slow
                        client.local_hostname = await asyncio.to_thread(socket.getfqdn)
                        self.local_hostname = client.local_hostname
                    await client.connect()
                    phase = "EHLO"
                    await client.ehlo()
                    if self.security == "starttls":
                        phase = "STARTTLS"
                        if not client.supports_extension("starttls"):
                            raise PermanentFailure("not sent: the server offers no STARTTLS")
                        await client.starttls()
                    if self._username is not None and self._password is not None:
                        phase = "AUTH"
                        await client.login(self._username, self._password)
                    phase = "MAIL FROM"
                    await client.mail(self._envelope_from)
                    phase = "RCPT TO"
                    await client.rcpt(recipient)
                    phase = "DATA"
                    start = await client.execute_command(b"DATA")
                    if start.code != 354:
                        raise aiosmtplib.SMTPDataError(start.code, start.message)
                    protocol = client.protocol
                    if protocol is None:
                        raise aiosmtplib.SMTPServerDisconnected("lost before the content")
                    protocol.write(content)  # raises, writing nothing, on a closed connection
                    phase = "content"  # from here on the server may take the message
                    reply = await protocol.read_response(timeout=self.timeout)
                    if reply.code != 250:
                        raise aiosmtplib.SMTPDataError(reply.code, reply.message)
            except ProviderError:
                raise
            except Exception as exc:  # TimeoutError (the bound above) included
                raise _classify(exc, phase) from exc
            # Taken: a QUIT that fails or hangs changes nothing, and is not waited for long.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(min(1.0, margin)):
                    await client.quit()
        finally:
            client.close()
        found = _QUEUED.search(reply.message)
        return Sent(provider_message_id=found.group(1) if found else mail["Message-ID"])

    async def aclose(self) -> None:
        return None  # one connection per message: nothing stays open


def _classify(exc: BaseException, phase: str) -> ProviderError:
    """The class of a failure in ``phase`` of the dialogue (see the module docstring)."""
    code = getattr(exc, "code", None)
    reply = f"{code} {getattr(exc, 'message', '')}".strip() if isinstance(code, int) else ""
    if phase == "content":
        if isinstance(code, int) and 400 <= code < 500:
            return TransientFailure(f"deferred after the content: {reply}")
        if isinstance(code, int) and 500 <= code < 600:
            return PermanentFailure(f"refused after the content: {reply}")
        return AmbiguousFailure(
            f"no reply after the message's final '.': {_what(exc)}; the server may have taken it"
        )
    where = f"not sent: at {phase}"
    if isinstance(code, int) and 500 <= code < 600:
        return PermanentFailure(f"{where}: {reply}")
    if isinstance(code, int) and 400 <= code < 500:
        return TransientFailure(f"{where}: {reply}")
    if isinstance(exc, ssl.SSLCertVerificationError) or isinstance(
        exc.__cause__, ssl.SSLCertVerificationError
    ):
        return PermanentFailure(f"{where}: the server's certificate does not verify: {exc}")
    if isinstance(exc, aiosmtplib.SMTPNotSupported) or (
        phase == "AUTH" and type(exc) is aiosmtplib.SMTPException
    ):  # no AUTH, or no mechanism in common: this server will not take it from us
        return PermanentFailure(f"{where}: {exc}")
    return TransientFailure(f"{where}: {_what(exc)}")


def _what(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _dot_stuffed(content: bytes) -> bytes:
    """The content as DATA carries it: CRLF lines, a leading ``.`` doubled, ``.`` last."""
    content = re.sub(rb"\r\n|\r|\n", b"\r\n", content)
    if not content.endswith(b"\r\n"):
        content += b"\r\n"
    return _PERIOD.sub(b"..", content) + b".\r\n"


def _is_address(address: str) -> bool:
    return address.isascii() and _ADDRESS.fullmatch(address) is not None
