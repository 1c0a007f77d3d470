"""An SMTP server on 127.0.0.1 (aiosmtpd, in a thread of its own) that stands in for
a mail provider in ``kirim simulate --channel smtp`` and in tests.

It counts every message per notification, as a user's mailbox would: a message is
recognised by its recipient and subject (``identify``), not by anything kirim adds,
so a resend with a fresh Message-ID shows as a second copy. With ``honours_keys``
it drops a message whose Message-ID it already has (a receiving system that
deduplicates by Message-ID). The faults of a ``Behaviour``, per message:

- ``error_rate``: ``451`` to RCPT TO, before any content (certainly not processed);
- ``hang_rate``: the content is taken (the user has it) and the reply to its final
  ``.`` withheld for ``hang_s``, past the client's timeout (RFC 1047's window);
- ``latency`` (and ``slow_rate``): seconds before that reply.

``in_flight_by`` counts the messages waiting for that reply per EHLO name (kirim's
``local_hostname``, the naive worker's id), so the harness can aim a fault at a
worker with a send in flight. With ``auth`` the server takes AUTH PLAIN/LOGIN with
that username and password and refuses MAIL FROM without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from kirim.devtools.receiver import Behaviour, Counts

Identify = Callable[[str, str], str]


def _not_deprecation_chatter(record: logging.LogRecord) -> bool:
    """aiosmtpd logs a warning of its own API on every successful AUTH: drop that one."""
    return "login_data is deprecated" not in record.getMessage()


logging.getLogger("mail.log").addFilter(_not_deprecation_chatter)


class SmtpReceiver(Counts):
    """``with SmtpReceiver() as r: r.port`` — stops by itself when the block ends."""

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        *,
        seed: int | None = None,
        identify: Identify | None = None,
        auth: tuple[str, str] | None = None,
    ) -> None:
        self.behaviour = behaviour or Behaviour()
        self._rng = random.Random(seed)
        # the RCPT refusals draw from their own sequence: the k-th RCPT TO is refused or
        # not whatever the replies to the messages in between drew, so a seeded run
        # refuses the same share of its first recipients every time
        self._refusals = random.Random(f"{seed}:rcpt") if seed is not None else random.Random()
        self._identify = identify or (lambda recipient, subject: f"{recipient}|{subject}")
        self._auth = auth
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # every message taken, per notification
        self.first_seen: dict[str, float] = {}  # epoch seconds of the first message per key
        self.in_flight_by: Counter[str] = Counter()  # messages waiting for their reply
        self.injected: Counter[str] = Counter()  # "errors", "timeouts", "slow" given
        self.lookups: Counter[str] = Counter()  # never asked: SMTP has no lookup
        self.messages: list[email.message.EmailMessage] = []  # every message taken
        self.logins: list[str] = []  # usernames that authenticated
        self._copies: Counter[str] = Counter()  # copies the user received per key
        self._message_ids: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="smtp-receiver")

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        assert self._server is not None, "use it in a with block"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"smtp://{self.host}:{self.port}"

    @property
    def lookup_url(self) -> str:
        return ""  # SMTP has no lookup

    def __enter__(self) -> SmtpReceiver:
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError("the SMTP receiver did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                loop.create_server(self._protocol, "127.0.0.1", 0, backlog=512)
            )
        finally:
            self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            close_clients = getattr(self._server, "close_clients", None)  # Python 3.13
            if close_clients is not None:
                close_clients()
            with contextlib.suppress(TimeoutError):  # 3.12+ waits for every connection
                loop.run_until_complete(asyncio.wait_for(self._server.wait_closed(), 2))
            loop.close()

    def _protocol(self) -> SMTP:
        return SMTP(
            _Handler(self),
            hostname="kirim-receiver",
            loop=self._loop,
            auth_require_tls=False,
            authenticator=self._authenticate if self._auth else None,
            timeout=30,
        )

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = (
            self._auth is not None
            and isinstance(data, LoginPassword)
            and (data.login.decode(), data.password.decode()) == self._auth
        )
        if ok:
            with self._lock:
                self.logins.append(data.login.decode())
        return AuthResult(success=ok, handled=False)  # aiosmtpd answers 235 or 535

    # -- the hooks ---------------------------------------------------------------------

    def _refuse(self) -> bool:
        with self._lock:
            refused = self._refusals.random() < self.behaviour.error_rate
            if refused:
                self.injected["errors"] += 1
            return refused

    def _take(self, content: bytes, recipients: list[str], worker: str) -> tuple[float, int]:
        """Record a message: the seconds to wait before the reply to its final ``.``, and
        its number (the queue id of the reply)."""
        mail = email.message_from_bytes(content, policy=email.policy.default)
        subject = str(mail.get("Subject", ""))
        message_id = str(mail.get("Message-ID", ""))
        b = self.behaviour
        with self._lock:
            self.messages.append(mail)
            for recipient in recipients:
                key = self._identify(recipient, subject)
                self.requests[key] += 1
                self.first_seen.setdefault(key, time.time())
                if not (b.honours_keys and message_id and message_id in self._message_ids):
                    self._copies[key] += 1
            if message_id:
                self._message_ids.add(message_id)
            self.in_flight_by[worker] += 1
            number = len(self.messages)
            base = b.latency(self._rng) if b.latency is not None else 0.0
            roll = self._rng.random()
            if roll < b.slow_rate:
                self.injected["slow"] += 1
                return base + self._rng.uniform(*b.slow_s), number
            if roll < b.slow_rate + b.hang_rate:
                self.injected["timeouts"] += 1
                return b.hang_s, number
            return base, number

    def _answered(self, worker: str) -> None:
        with self._lock:
            self.in_flight_by[worker] -= 1


class _Handler:
    def __init__(self, receiver: SmtpReceiver) -> None:
        self.r = receiver

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if self.r._auth is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if self.r._refuse():
            return "451 4.3.0 Try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        worker = session.host_name or ""
        content = envelope.original_content or b""
        delay, number = self.r._take(content, list(envelope.rcpt_tos), worker)
        try:
            if delay:
                await asyncio.sleep(delay)
        finally:
            self.r._answered(worker)
        return f"250 OK queued as m{number}"
