"""The smtp provider against real aiosmtpd servers on 127.0.0.1: the message it builds,
and the class of every failure by where in the SMTP dialogue it happened."""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from kirim.channels import Channel
from kirim.config import Config, parse_config
from kirim.engine import Kirim
from kirim.errors import AmbiguousFailure, ConfigError, NotSent, PermanentFailure, TransientFailure
from kirim.model import AttemptStatus, DeliveryStatus, Doubt, OnUnknown
from kirim.providers.base import Message
from kirim.providers.smtp import SmtpProvider, message_id
from kirim.testing import ManualClock
from kirim.worker import WorkerSettings

PASSWORD = "pw-7f3c9e-not-in-any-log"


@dataclass
class Script:
    """How the server answers: a reply per command (None: 250), what follows the content."""

    mail: str | None = None
    rcpt: str | None = None
    data: str = "250 2.0.0 Ok: queued as Q1"
    after_content: str = "reply"  # or "hang" (never answer) or "drop" (close the connection)
    greet: bool = True  # False: accept the connection, never say a word
    messages: list[email.message.EmailMessage] = field(default_factory=list)
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    connections: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if self.mail:
            return self.mail
        envelope.mail_from = address
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if self.rcpt:
            return self.rcpt
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        self.messages.append(email.message_from_bytes(content, policy=email.policy.default))  # type: ignore[arg-type]
        self.envelopes.append((str(envelope.mail_from), list(envelope.rcpt_tos)))
        if self.after_content == "hang":
            await self.release.wait()
        if self.after_content == "drop":
            assert server.transport is not None
            server.transport.abort()
        return self.data


Start = Callable[..., Awaitable[int]]


@pytest.fixture
async def smtp() -> AsyncIterator[Start]:
    """Start aiosmtpd servers on 127.0.0.1 in the test's loop; all stop with the test."""
    servers: list[tuple[asyncio.Server, Script]] = []
    loop = asyncio.get_running_loop()

    async def start(
        script: Script,
        *,
        starttls: ssl.SSLContext | None = None,
        implicit: ssl.SSLContext | None = None,
        auth: tuple[str, str] | None = None,
    ) -> int:
        def authenticate(
            server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
        ) -> AuthResult:
            ok = (
                isinstance(data, LoginPassword)
                and (data.login.decode(), data.password.decode()) == auth
            )
            if ok:
                script.logins.append(data.login.decode())
            return AuthResult(success=ok, handled=False)

        def protocol() -> asyncio.BaseProtocol:
            script.connections += 1
            if not script.greet:
                return asyncio.Protocol()  # takes the connection, says nothing
            return SMTP(
                script,
                hostname="test.invalid",
                loop=loop,
                tls_context=starttls,
                auth_require_tls=False,
                authenticator=authenticate if auth else None,
            )

        server = await loop.create_server(protocol, "127.0.0.1", 0, ssl=implicit)
        servers.append((server, script))
        port: int = server.sockets[0].getsockname()[1]
        return port

    yield start
    for server, script in servers:
        script.release.set()
        server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def provider(port: int, **kw: Any) -> SmtpProvider:
    kw.setdefault("security", "none")
    kw.setdefault("timeout", 2.0)
    return SmtpProvider(host="127.0.0.1", port=port, from_address="Shop <shop@example.com>", **kw)


def message(key: str = "k-1", **payload: Any) -> Message:
    return Message(
        delivery_id=1,
        idempotency_key=key,
        provider_request_id="req-1",
        event_id="order-1",
        recipient="Bob <bob@example.test>",
        channel="email",
        payload=payload or {"subject": "Your order shipped", "text": "It is on its way."},
        attempt=1,
    )


# -- the message ----------------------------------------------------------------------


async def test_a_message_carries_subject_text_and_html(smtp) -> None:
    """The payload's subject, text and html make a multipart/alternative message from
    the channel's sender to the recipient; the server's queue id is the message id."""
    script = Script()
    port = await smtp(script)
    sent = await provider(port).send(
        message(subject="Your order shipped", text="Plain text.", html="<p>HTML</p>")
    )
    assert sent.provider_message_id == "Q1"
    [mail] = script.messages
    assert mail["Subject"] == "Your order shipped"
    assert mail["From"] == "Shop <shop@example.com>"
    assert mail["To"] == "Bob <bob@example.test>"
    assert mail.get_content_type() == "multipart/alternative"
    assert mail.get_body(("plain",)).get_content().strip() == "Plain text."
    assert mail.get_body(("html",)).get_content().strip() == "<p>HTML</p>"
    assert script.envelopes == [("shop@example.com", ["bob@example.test"])]


async def test_text_only_is_a_plain_message_and_dots_survive(smtp) -> None:
    """Without html the message is text/plain; a line holding only "." arrives intact
    (dot-stuffed on the wire, not taken for the end of the data)."""
    script = Script(data="250 OK")
    port = await smtp(script)
    sent = await provider(port).send(message(subject="s", text="one\n.\ntwo\n"))
    [mail] = script.messages
    assert mail.get_content_type() == "text/plain"
    assert mail.get_content().splitlines() == ["one", ".", "two"]
    assert sent.provider_message_id == mail["Message-ID"]  # no queue id: our Message-ID


async def test_message_id_is_derived_from_the_key_and_stable_across_resends(smtp) -> None:
    """Every send of one key carries one Message-ID (<sha256(key)[:32]@from-domain>);
    another key gets another."""
    script = Script()
    port = await smtp(script)
    p = provider(port)
    await p.send(message("order-1:bob"))
    await p.send(message("order-1:bob"))
    await p.send(message("order-2:bob"))
    ids = [m["Message-ID"] for m in script.messages]
    assert ids[0] == ids[1] == message_id("order-1:bob", "example.com")
    assert ids[2] != ids[0]
    assert ids[0].startswith("<")
    assert ids[0].endswith("@example.com>")
    assert len(ids[0]) == len("<@example.com>") + 32


@pytest.mark.parametrize(
    ("payload", "recipient"),
    [
        ({"text": "no subject"}, "bob@example.test"),
        ({"subject": "no text"}, "bob@example.test"),
        ({"subject": "s", "text": "t", "html": 7}, "bob@example.test"),
        ({"subject": "s", "text": "t"}, "not an address"),
        ({"subject": "line\r\nBcc: eve@example.test", "text": "t"}, "bob@example.test"),
        (["a list"], "bob@example.test"),
    ],
)
async def test_a_message_that_cannot_be_built_is_not_sent(smtp, payload, recipient) -> None:
    """A payload without subject or text, a recipient that is no address, a header with
    a line break: NotSent, and the server never saw a connection."""
    script = Script()
    port = await smtp(script)
    bad = Message(
        delivery_id=1,
        idempotency_key="k",
        provider_request_id="r",
        event_id="e",
        recipient=recipient,
        channel="email",
        payload=payload,
        attempt=1,
    )
    with pytest.raises(NotSent):
        await provider(port).send(bad)
    assert script.connections == 0


# -- before the content: not processed, or refused ------------------------------------


async def test_connection_refused_is_certainly_not_sent() -> None:
    """Nobody listening: transient, so a retry is safe."""
    with pytest.raises(TransientFailure, match="not sent: at connect"):
        await provider(closed_port()).send(message())


@pytest.mark.parametrize("command", ["mail", "rcpt"])
@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("451 4.3.0 Try again later", TransientFailure),
        ("452 4.2.2 Mailbox full", TransientFailure),
        ("550 5.1.1 No such user", PermanentFailure),
        ("553 5.7.1 Sender refused", PermanentFailure),
    ],
)
async def test_replies_before_the_content_are_not_processed(smtp, command, reply, error) -> None:
    """A 4xx to MAIL FROM or RCPT TO is transient, a 5xx permanent; either way the
    server never had the message."""
    script = Script(**{command: reply})
    port = await smtp(script)
    with pytest.raises(error, match=reply.split()[0]) as caught:
        await provider(port).send(message())
    assert str(caught.value).startswith("not sent")
    assert script.messages == []


async def test_a_server_that_never_greets_is_not_sent(smtp) -> None:
    """Connected, but no greeting within the timeout: nothing was written, transient."""
    port = await smtp(Script(greet=False))
    with pytest.raises(TransientFailure, match="not sent: at connect"):
        await provider(port, timeout=0.5).send(message())


# -- after the content: RFC 1047's window ---------------------------------------------


async def test_no_reply_after_the_final_dot_is_ambiguous(smtp) -> None:
    """The server took the content and never answered: it may have accepted it."""
    script = Script(after_content="hang")
    port = await smtp(script)
    with pytest.raises(AmbiguousFailure, match=r"final '\.'"):
        await provider(port, timeout=0.5).send(message())
    assert len(script.messages) == 1  # the server has it


async def test_a_dropped_connection_after_the_final_dot_is_ambiguous(smtp) -> None:
    """The connection closes where the reply should be: it may have been accepted."""
    script = Script(after_content="drop")
    port = await smtp(script)
    with pytest.raises(AmbiguousFailure, match=r"final '\.'"):
        await provider(port).send(message())
    assert len(script.messages) == 1


@pytest.mark.parametrize(
    ("reply", "error"),
    [("451 4.3.0 Try later", TransientFailure), ("554 5.7.1 Rejected as spam", PermanentFailure)],
)
async def test_a_refusal_after_the_content_is_definite(smtp, reply, error) -> None:
    """A 4xx or 5xx to the final "." says the server did not take the message."""
    port = await smtp(Script(data=reply))
    with pytest.raises(error, match="after the content"):
        await provider(port).send(message())


# -- authentication and TLS -----------------------------------------------------------


async def test_login_then_send_and_the_password_is_never_shown(smtp) -> None:
    """With username and password the provider logs in; bad credentials are permanent;
    the password is in neither the repr nor the error."""
    good = Script()
    port = await smtp(good, auth=("shop", PASSWORD))
    await provider(port, username="shop", password=PASSWORD).send(message())
    assert good.logins == ["shop"]
    bad = provider(port, username="shop", password=PASSWORD + "-wrong")
    with pytest.raises(PermanentFailure, match="at AUTH: 535") as caught:
        await bad.send(message())
    assert PASSWORD not in str(caught.value)
    assert PASSWORD not in repr(bad)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def server_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    return context


async def test_starttls_and_implicit_tls_verify_the_server(smtp, certificate) -> None:
    """STARTTLS and TLS from the first byte both send with the CA given in ca_file."""
    context = server_context(certificate)
    upgraded, wrapped = Script(), Script()
    port = await smtp(upgraded, starttls=context)
    await provider(port, security="starttls", ca_file=str(certificate[0])).send(message())
    port = await smtp(wrapped, implicit=context)
    await provider(port, security="tls", ca_file=str(certificate[0])).send(message())
    assert len(upgraded.messages) == len(wrapped.messages) == 1


async def test_a_certificate_that_does_not_verify_is_permanent(smtp, certificate) -> None:
    """A server whose certificate is not trusted gets nothing: permanent, not sent."""
    script = Script()
    port = await smtp(script, starttls=server_context(certificate))
    with pytest.raises(PermanentFailure, match="certificate"):
        await provider(port, security="starttls").send(message())
    assert script.messages == []


async def test_starttls_required_but_not_offered_is_permanent(smtp) -> None:
    """security = "starttls" never falls back to plain text."""
    script = Script()
    port = await smtp(script)
    with pytest.raises(PermanentFailure, match="no STARTTLS"):
        await provider(port, security="starttls").send(message())
    assert script.messages == []


# -- configuration --------------------------------------------------------------------


def test_config_builds_an_smtp_channel() -> None:
    """[channels.email] with provider = "smtp" builds the provider; the default port
    follows security; the password is not in the channel's repr."""
    config = parse_config(
        {
            "channels": {
                "email": {
                    "provider": "smtp",
                    "host": "smtp.example.com",
                    "security": "tls",
                    "username": "shop",
                    "password": PASSWORD,
                    "from": "Shop <shop@example.com>",
                    "timeout": 20,
                }
            }
        }
    )
    spec = config.channels["email"]
    built = spec.build().provider
    assert isinstance(built, SmtpProvider)
    assert (built.port, built.timeout, built.idempotent) == (465, 20.0, False)
    assert PASSWORD not in repr(spec) + repr(built)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"from": "a@b.c"}, "host is required"),
        ({"host": "h"}, "from is required"),
        ({"host": "h", "from": "not an address"}, "from is required"),
        ({"host": "h", "from": "a@b.c", "port": 70000}, "port must be"),
        ({"host": "h", "from": "a@b.c", "security": "ssl"}, "security must be"),
        ({"host": "h", "from": "a@b.c", "username": "u"}, "go together"),
        ({"host": "h", "from": "a@b.c", "url": "http://x"}, "not an option of provider 'smtp'"),
        ({"host": "h", "from": "a@b.c", "lookup": True}, "has no lookup"),
    ],
)
def test_config_refuses_a_bad_smtp_channel(spec, problem) -> None:
    """Each mistake gets a message that names the key."""
    with pytest.raises(ConfigError, match=problem):
        parse_config({"channels": {"email": {"provider": "smtp", **spec}}})


# -- through the worker ---------------------------------------------------------------


@pytest.fixture
async def app_on(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Kirim]]]:
    apps: list[Kirim] = []

    async def make(p: SmtpProvider, on_unknown: OnUnknown = OnUnknown.ASSUME_SENT) -> Kirim:
        channels = {"email": Channel(name="email", provider=p, on_unknown=on_unknown)}
        app = Kirim(
            Config(database=f"sqlite:///{tmp_path / 'kirim.db'}"),
            channels=channels,
            clock=ManualClock(),
        )
        await app.open(migrate=True)
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.close()


SETTINGS = WorkerSettings(lease=10, backoff_base=0.01, backoff_max=0.01)
PAYLOAD = {"subject": "Your order shipped", "text": "On its way."}


async def test_worker_retries_a_451_and_delivers_once(smtp, app_on) -> None:
    """A 451 before the content is retried (certainly not processed): one message."""
    script = Script(rcpt="451 4.3.0 Try again later")
    app = await app_on(provider(await smtp(script)))
    n = await app.notify("order-1", "bob@example.test", "email", PAYLOAD)
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await worker.run_once()
    script.rcpt = None
    job = await app.store.get_job(n.delivery_id)
    app.clock.set(job.run_at)  # type: ignore[attr-defined]
    await worker.run_once()
    record = await app.get(n.delivery_id)
    delivery, attempts = record.delivery, record.attempts
    assert delivery.status is DeliveryStatus.SENT
    assert [a.status for a in attempts] == [AttemptStatus.FAILED_TRANSIENT, AttemptStatus.SUCCEEDED]
    assert len(script.messages) == 1


async def test_worker_treats_no_reply_after_the_dot_as_in_doubt(smtp, app_on) -> None:
    """The server took the content and did not answer: at most once (assumed sent)."""
    script = Script(after_content="hang")
    app = await app_on(provider(await smtp(script), timeout=0.5))
    n = await app.notify("order-1", "bob@example.test", "email", PAYLOAD)
    await app.worker(settings=SETTINGS, worker_id="A").run_once()
    record = await app.get(n.delivery_id)
    delivery, attempts = record.delivery, record.attempts
    assert (delivery.status, delivery.doubt) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT)
    assert [a.status for a in attempts] == [AttemptStatus.UNKNOWN]
    assert len(script.messages) == 1


async def test_an_at_least_once_resend_carries_the_same_message_id(smtp, app_on) -> None:
    """With on_unknown = "retry" the resend after a lost reply repeats the Message-ID,
    so a receiver that drops repeated Message-IDs shows the user one message."""
    script = Script(after_content="hang")
    app = await app_on(provider(await smtp(script), timeout=0.5), OnUnknown.RETRY)
    n = await app.notify("order-1", "bob@example.test", "email", PAYLOAD)
    worker = app.worker(settings=SETTINGS, worker_id="A")
    await worker.run_once()
    script.after_content = "reply"
    job = await app.store.get_job(n.delivery_id)
    app.clock.set(job.run_at)  # type: ignore[attr-defined]
    await worker.run_once()
    delivery = (await app.get(n.delivery_id)).delivery
    assert delivery.status is DeliveryStatus.SENT
    first, second = script.messages
    assert (
        first["Message-ID"] == second["Message-ID"] == message_id(n.idempotency_key, "example.com")
    )


async def test_credentials_for_a_server_without_auth_are_permanent(smtp) -> None:
    """The channel has a password, the server offers no AUTH: it would never work."""
    script = Script()
    port = await smtp(script)
    with pytest.raises(PermanentFailure, match="at AUTH"):
        await provider(port, username="shop", password=PASSWORD).send(message())
    assert script.messages == []
