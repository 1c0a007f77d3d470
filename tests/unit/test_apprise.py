"""The Apprise bridge end to end: real Apprise URLs that reach servers on 127.0.0.1
(json://, form:// to an HTTP server, mailto:// to an aiosmtpd server), Apprise's
retries off, and every failure it reports treated as ambiguous."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from kirim.channels import Channel
from kirim.config import Config, parse_config
from kirim.engine import Kirim
from kirim.errors import AmbiguousFailure, ConfigError, NotSent
from kirim.model import AttemptStatus, DeliveryStatus, Doubt
from kirim.providers.apprise_bridge import AppriseProvider
from kirim.providers.base import Message
from kirim.simulate.smtp_receiver import SmtpReceiver
from kirim.testing import ManualClock
from kirim.worker import WorkerSettings

TOKEN = "tok-51d0c4e2-never-shown"


@dataclass
class Seen:
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)  # by path; 200 otherwise


@pytest.fixture
def http() -> Iterator[tuple[str, Seen]]:
    """An HTTP server recording every request; it answers Seen.status[path] or 200."""
    seen = Seen()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?")[0]
            seen.requests.append((path, dict(self.headers), body))
            self.send_response(seen.status.get(path, 200))
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def message(key: str = "order-1:user-1", **payload: object) -> Message:
    return Message(
        delivery_id=1,
        idempotency_key=key,
        provider_request_id="req-7",
        event_id="order-1",
        recipient="user-1",
        channel="chat",
        payload=payload or {"title": "Your order shipped", "body": "It is on its way."},
        attempt=1,
    )


async def send(urls: list[str], msg: Message | None = None, **kw: object) -> None:
    provider = AppriseProvider(urls, **kw)  # type: ignore[arg-type]
    try:
        await provider.send(msg or message())
    finally:
        await provider.aclose()


async def test_json_target_gets_title_body_and_kirims_headers(http) -> None:
    """json:// posts Apprise's JSON with the title and body, and the idempotency key
    and request id as headers."""
    host, seen = http
    await send([f"json://{host}/hook"])
    [(path, headers, body)] = seen.requests
    assert path == "/hook"
    data = json.loads(body)
    assert (data["title"], data["message"]) == ("Your order shipped", "It is on its way.")
    assert headers["Idempotency-Key"] == "order-1:user-1"
    assert headers["X-Request-Id"] == "req-7"


async def test_form_target_gets_the_fields(http) -> None:
    """form:// posts the title and the body (here from subject and text) as a form."""
    host, seen = http
    await send([f"form://{host}/form"], message(subject="Hello", text="Body text"))
    [(path, headers, body)] = seen.requests
    assert path == "/form"
    fields = parse_qs(body.decode())
    assert (fields["title"], fields["message"]) == (["Hello"], ["Body text"])
    assert headers["Idempotency-Key"] == "order-1:user-1"


async def test_mailto_reaches_an_smtp_server() -> None:
    """mailto:// logs in to the aiosmtpd server and delivers the message."""
    with SmtpReceiver(auth=("shop", TOKEN)) as box:
        url = (
            f"mailto://shop:{TOKEN}@127.0.0.1:{box.port}"
            "?from=shop@example.com&to=bob@example.test&mode=insecure"
        )
        await send([url], message(title="Your order shipped", body="On its way."))
    [mail] = box.messages
    assert mail["Subject"] == "Your order shipped"
    assert mail["To"].addresses[0].addr_spec == "bob@example.test"
    assert box.logins == ["shop"]


async def test_every_url_is_notified(http) -> None:
    """Several URLs: each gets the message once."""
    host, seen = http
    await send([f"json://{host}/a", f"form://{host}/b"])
    assert sorted(path for path, _, _ in seen.requests) == ["/a", "/b"]


async def test_a_reported_failure_is_ambiguous_and_not_retried_by_apprise(http) -> None:
    """A target that answers 500 took the request: ambiguous. Apprise's own retries
    are off, even when the URL asks for them: the server sees one request."""
    host, seen = http
    seen.status["/fail"] = 500
    with pytest.raises(AmbiguousFailure, match="may have been delivered"):
        await send([f"json://{host}/fail?retry=3"])
    assert len(seen.requests) == 1


async def test_a_partial_failure_is_ambiguous(http) -> None:
    """One URL delivered, one failed: resending would repeat the first, so in doubt."""
    host, seen = http
    seen.status["/fail"] = 500
    with pytest.raises(AmbiguousFailure, match="1 of 2"):
        await send([f"json://{host}/ok", f"json://{host}/fail"])
    assert len(seen.requests) == 2


async def test_connection_refused_is_still_ambiguous() -> None:
    """Apprise does not say why a service failed, so even a refused connection stays
    ambiguous: the documented price of the bridge."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(AmbiguousFailure):
        await send([f"json://127.0.0.1:{port}/x"])


@pytest.mark.parametrize(
    "payload",
    [{"title": "no body"}, {"body": ""}, {"body": "b", "format": "rtf"}, {"body": "b", "title": 7}],
)
async def test_a_payload_without_a_body_is_not_sent(http, payload) -> None:
    """Nothing to say, or said wrongly: NotSent, and no request."""
    host, seen = http
    with pytest.raises(NotSent):
        await send([f"json://{host}/x"], message(**payload))
    assert seen.requests == []


def test_services_get_no_retries_and_short_timeouts(http) -> None:
    """Apprise's retries are forced to 0, its socket timeouts to a quarter of timeout."""
    host, _ = http
    provider = AppriseProvider([f"json://{host}/x?retry=5&cto=30&rto=30"], timeout=8)
    services: list[object] = []
    original = provider._apprise.Apprise.notify

    def spy(self: object, *args: object, **kwargs: object) -> object:
        services.extend(self)  # type: ignore[call-overload]
        return original(self, *args, **kwargs)

    provider._apprise.Apprise.notify = spy
    try:
        assert provider._notify(message(), "t", "b", None, began=time.monotonic())[0]
    finally:
        provider._apprise.Apprise.notify = original
    [service] = services
    assert service.retry == 0  # type: ignore[attr-defined]
    assert service.socket_connect_timeout == service.socket_read_timeout == 2.0  # type: ignore[attr-defined]


def test_config_builds_an_apprise_channel_and_never_shows_a_url() -> None:
    """provider = "apprise" with urls; idempotent is false by default; a URL Apprise
    does not know is refused by its scheme alone, and no URL appears in a repr."""
    url = f"json://user:{TOKEN}@127.0.0.1:9/hook"
    config = parse_config({"channels": {"chat": {"provider": "apprise", "urls": [url]}}})
    provider = config.channels["chat"].build().provider
    assert isinstance(provider, AppriseProvider)
    assert provider.idempotent is False
    assert TOKEN not in repr(provider) + repr(config)
    with pytest.raises(ConfigError, match="urls is required"):
        parse_config({"channels": {"chat": {"provider": "apprise"}}})
    with pytest.raises(ConfigError, match="not an option of provider 'apprise'"):
        parse_config({"channels": {"chat": {"provider": "apprise", "urls": [url], "url": url}}})
    bad = parse_config(
        {"channels": {"chat": {"provider": "apprise", "urls": [f"nosuch://{TOKEN}@host"]}}}
    )
    with pytest.raises(ConfigError, match=r"urls\[0\] \(nosuch://…\)") as caught:
        bad.channels["chat"].build()
    assert TOKEN not in str(caught.value)


# -- through the worker ---------------------------------------------------------------


async def test_worker_sends_once_and_holds_a_reported_failure_in_doubt(http, tmp_path) -> None:
    """A delivered message is sent; a reported failure ends "sent, assumed" (at most
    once, the default for a bridge that cannot say more), never a resend."""
    host, seen = http
    seen.status["/fail"] = 500
    channels = {
        "chat": Channel(name="chat", provider=AppriseProvider([f"json://{host}/ok"])),
        "alerts": Channel(name="alerts", provider=AppriseProvider([f"json://{host}/fail"])),
    }
    app = Kirim(
        Config(database=f"sqlite:///{tmp_path / 'kirim.db'}"),
        channels=channels,
        clock=ManualClock(),
    )
    await app.open(migrate=True)
    try:
        ok = await app.notify("order-1", "user-1", "chat", {"body": "shipped"})
        failed = await app.notify("order-1", "user-1", "alerts", {"body": "shipped"})
        await app.worker(settings=WorkerSettings(lease=10), worker_id="A").run_once()
        record = await app.get(ok.delivery_id)
        sent, sent_attempts = record.delivery, record.attempts
        record = await app.get(failed.delivery_id)
        doubt, doubt_attempts = record.delivery, record.attempts
    finally:
        await app.close()
    assert sent.status is DeliveryStatus.SENT
    assert [a.status for a in sent_attempts] == [AttemptStatus.SUCCEEDED]
    assert (doubt.status, doubt.doubt) == (DeliveryStatus.SENT, Doubt.ASSUMED_SENT)
    assert [a.status for a in doubt_attempts] == [AttemptStatus.UNKNOWN]
    assert sorted(path for path, _, _ in seen.requests) == ["/fail", "/ok"]


def test_without_the_extra_an_apprise_channel_says_what_to_install(monkeypatch) -> None:
    """Without Apprise the config still parses; building the channel says to install
    kirim[apprise]."""
    monkeypatch.setitem(sys.modules, "apprise", None)  # import apprise: ImportError
    config = parse_config({"channels": {"chat": {"provider": "apprise", "urls": ["json://x"]}}})
    with pytest.raises(ConfigError, match=r"pip install 'kirim\[apprise\]'"):
        config.channels["chat"].build()
