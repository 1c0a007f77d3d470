"""Signed webhooks (Standard Webhooks), verified by the independent ``standardwebhooks``
package in a real HTTP receiver on 127.0.0.1: the key as ``webhook-id``, rotation,
and the receiver's timestamp tolerance as a bound on how late a request is acted on."""

from __future__ import annotations

import base64
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from kirim.channels import Channel
from kirim.config import Config, parse_config
from kirim.engine import Kirim
from kirim.errors import ConfigError, PermanentFailure
from kirim.model import DeliveryStatus
from kirim.providers.base import Message
from kirim.providers.signing import Signer, decode_secret
from kirim.providers.webhook import WebhookProvider
from kirim.worker import WorkerSettings

NEW = "whsec_" + base64.b64encode(b"the new secret, 32 bytes long..!").decode()
OLD = "whsec_" + base64.b64encode(b"the old secret, 32 bytes long..!").decode()
OTHER = "whsec_" + base64.b64encode(b"nobody's secret, 32 bytes long.!").decode()
TOLERANCE = 300  # seconds: the reference libraries' (standardwebhooks: 5 minutes)


@dataclass
class Verifier:
    """A receiver that acts on a request only if its signature verifies."""

    secret: str
    acted: list[dict[str, str]] = field(default_factory=list)  # headers of what it acted on
    refused: list[str] = field(default_factory=list)  # why the others were refused
    acted_at: list[float] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[Verifier]]]:
    """POST /<i>: verified with the i-th Verifier's secret (204, or 400 and why)."""
    verifiers: list[Verifier] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            verifier = verifiers[int(self.path.strip("/"))]
            headers = dict(self.headers)
            try:
                Webhook(verifier.secret).verify(body, headers)
            except WebhookVerificationError as exc:
                verifier.refused.append(str(exc))
                code = 400
            else:
                verifier.acted.append(headers)
                verifier.acted_at.append(time.time())
                code = 204
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", verifiers
    server.shutdown()
    server.server_close()


def message(key: str = "order-1:user-1", attempt: int = 1) -> Message:
    return Message(
        delivery_id=1,
        idempotency_key=key,
        provider_request_id=f"req-{attempt}",
        event_id="order-1",
        recipient="user-1",
        channel="push",
        payload={"title": "Your order shipped", "ünïcode": "✓"},
        attempt=attempt,
    )


async def test_a_signed_request_verifies_and_its_id_is_the_key(receiver) -> None:
    """standardwebhooks verifies the request; webhook-id is the idempotency key, the
    same on a resend, and the timestamp is the sending time."""
    base, verifiers = receiver
    verifiers.append(Verifier(NEW))
    provider = WebhookProvider(f"{base}/0", secret=NEW)
    try:
        before = math.floor(time.time())
        await provider.send(message(attempt=1))
        await provider.send(message(attempt=2))
        after = time.time()
    finally:
        await provider.aclose()
    first, second = verifiers[0].acted
    assert first["webhook-id"] == second["webhook-id"] == "order-1:user-1"
    assert first["Idempotency-Key"] == "order-1:user-1"
    assert before <= int(first["webhook-timestamp"]) <= after
    assert first["webhook-signature"].startswith("v1,")
    assert verifiers[0].refused == []


async def test_rotation_signs_with_every_secret(receiver) -> None:
    """With [new, old] a receiver that knows either verifies; one that knows neither
    refuses."""
    base, verifiers = receiver
    verifiers += [Verifier(NEW), Verifier(OLD), Verifier(OTHER)]
    providers = [WebhookProvider(f"{base}/{i}", secret=[NEW, OLD]) for i in range(3)]
    try:
        for p in providers[:2]:
            await p.send(message())
        with pytest.raises(PermanentFailure, match="HTTP 400"):
            await providers[2].send(message())
    finally:
        for p in providers:
            await p.aclose()
    assert [len(v.acted) for v in verifiers] == [1, 1, 0]
    assert verifiers[2].refused == ["No matching signature found"]
    assert len(verifiers[0].acted[0]["webhook-signature"].split(" ")) == 2


def test_the_signature_covers_id_timestamp_and_body() -> None:
    """Changing the body, the id or the timestamp breaks the signature."""
    signer = Signer(NEW, clock=lambda: time.time())
    body = b'{"a":1}'
    headers = signer.headers("key-1", body)
    Webhook(NEW).verify(body, headers)
    for changed_body, changed in [
        (b'{"a":2}', {}),
        (body, {"webhook-id": "key-2"}),
        (body, {"webhook-timestamp": str(int(headers["webhook-timestamp"]) - 1)}),
    ]:
        with pytest.raises(WebhookVerificationError):
            Webhook(NEW).verify(changed_body, {**headers, **changed})


@pytest.mark.parametrize(
    ("frozen", "acted"),
    [(TOLERANCE - 20, True), (TOLERANCE + 20, False)],
)
async def test_the_receivers_tolerance_bounds_how_late_a_request_is_acted_on(
    receiver, frozen, acted
) -> None:
    """A request signed and then held back (a worker frozen between its deadline check
    and the socket write, a proxy that resends it later) is acted on only within the
    receiver's tolerance of its timestamp; past it, the receiver refuses it unread."""
    base, verifiers = receiver
    verifiers.append(Verifier(NEW))
    # Signed `frozen` seconds before it reaches the receiver: what a freeze after signing does.
    provider = WebhookProvider(f"{base}/0", secret=NEW, signing_clock=lambda: time.time() - frozen)
    try:
        if acted:
            await provider.send(message())
        else:
            with pytest.raises(PermanentFailure, match="HTTP 400"):
                await provider.send(message())
    finally:
        await provider.aclose()
    assert len(verifiers[0].acted) == int(acted)
    if not acted:
        assert verifiers[0].refused == ["Message timestamp too old"]


async def test_a_signed_request_is_acted_on_before_its_attempts_settle_bound(
    receiver, tmp_path: Path
) -> None:
    """Through the worker: the timestamp is taken after the send-deadline check, so it
    is at most the attempt's send_deadline; a receiver with a tolerance no longer than
    the channel's timeout therefore acts on a request of this attempt no later than
    send_deadline + tolerance <= settles_at, however long the worker was frozen."""
    base, verifiers = receiver
    verifiers.append(Verifier(NEW))
    provider = WebhookProvider(f"{base}/0", secret=NEW, timeout=TOLERANCE)
    app = Kirim(
        Config(database=f"sqlite:///{tmp_path / 'kirim.db'}"),
        channels={"push": Channel(name="push", provider=provider)},
    )
    await app.open(migrate=True)
    try:
        n = await app.notify("order-1", "user-1", "push", {"title": "shipped"})
        await app.worker(settings=WorkerSettings(lease=30), worker_id="A").run_once()
        delivery, _, [attempt] = await app.get(n.delivery_id)
    finally:
        await app.close()
    assert delivery.status is DeliveryStatus.SENT
    [headers] = verifiers[0].acted
    stamped = int(headers["webhook-timestamp"])
    assert headers["webhook-id"] == n.idempotency_key
    assert attempt.send_deadline is not None
    assert attempt.settles_at is not None
    assert math.floor(attempt.requested_at) <= stamped <= attempt.send_deadline
    latest = stamped + TOLERANCE  # the receiver refuses it after this
    assert latest <= attempt.send_deadline + TOLERANCE <= attempt.settles_at
    assert verifiers[0].acted_at[0] <= latest


def test_secrets_are_checked_and_never_shown() -> None:
    """A secret must be whsec_ and base64; the error does not repeat it, nor the repr."""
    assert decode_secret(NEW) == b"the new secret, 32 bytes long..!"
    for bad in ["plain-secret-1234", "whsec_***not base64***", "whsec_"]:
        with pytest.raises(ValueError, match="secret") as caught:
            decode_secret(bad)
        assert bad not in str(caught.value)
    provider = WebhookProvider("http://127.0.0.1:9/x", secret=[NEW, OLD])
    assert NEW not in repr(provider)
    assert OLD not in repr(provider)
    assert "signed=True" in repr(provider)


def test_config_takes_one_secret_or_a_list() -> None:
    """secret = "whsec_…" or a list while rotating; anything else is a ConfigError."""
    for secret in (NEW, [NEW, OLD]):
        config = parse_config(
            {"channels": {"push": {"url": "http://127.0.0.1:9/x", "secret": secret}}}
        )
        assert NEW not in repr(config)
        config.channels["push"].build()
    for bad, problem in [
        ("not-whsec", "whsec_"),
        ([], "at least one"),
        ([NEW, 7], "list of them"),
        (7, "list of them"),
    ]:
        with pytest.raises(ConfigError, match=problem) as caught:
            parse_config({"channels": {"push": {"url": "http://127.0.0.1:9/x", "secret": bad}}})
        assert NEW not in str(caught.value)
