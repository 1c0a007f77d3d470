"""The webhook provider against a real HTTP server on 127.0.0.1: headers and the
classification of every failure at the seam."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kirim.errors import AmbiguousFailure, PermanentFailure, TransientFailure
from kirim.providers.base import Message
from kirim.providers.webhook import WebhookProvider, retry_after


class Script:
    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str], bytes]] = []
        self.seen: list[dict[str, str]] = []
        self.hang = threading.Event()  # set: answer nothing until the test ends


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            script.seen.append({**dict(self.headers), "_body": body.decode()})
            if script.hang.is_set():
                script.release.wait(5)
                return
            code, headers, data = script.answers.pop(0)
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return

    script.release = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/hook", script
    script.release.set()
    httpd.shutdown()
    httpd.server_close()


def message() -> Message:
    return Message(
        delivery_id=7712,
        idempotency_key="k-7712",
        provider_request_id="req-abc",
        event_id="48291",
        recipient="1007",
        channel="push",
        payload={"t": 1},
        attempt=1,
    )


async def test_success_sends_keys_and_reads_the_message_id(server) -> None:
    """A 2xx is a success; the request carries Idempotency-Key, X-Request-Id and the token."""
    url, script = server
    script.answers.append((202, {"Content-Type": "application/json"}, b'{"id": "p-1001"}'))
    provider = WebhookProvider(url, token="s3cret")
    try:
        sent = await provider.send(message())
    finally:
        await provider.aclose()
    assert sent.provider_message_id == "p-1001"
    seen = script.seen[0]
    assert seen["Idempotency-Key"] == "k-7712"
    assert seen["X-Request-Id"] == "req-abc"
    assert seen["Authorization"] == "Bearer s3cret"
    assert json.loads(seen["_body"])["payload"] == {"t": 1}
    assert "s3cret" not in repr(provider)


@pytest.mark.parametrize(
    ("code", "headers", "error", "after"),
    [
        (400, {}, PermanentFailure, None),
        (404, {}, PermanentFailure, None),
        (409, {}, AmbiguousFailure, None),  # "this key is in progress": it may still land
        (408, {}, TransientFailure, None),
        (429, {"Retry-After": "7"}, TransientFailure, 7.0),
        (500, {}, AmbiguousFailure, None),
        (503, {"Retry-After": "3"}, AmbiguousFailure, None),
    ],
)
async def test_status_codes_are_classified(server, code, headers, error, after) -> None:
    """4xx is permanent except 408/429 (transient, Retry-After kept) and 409 (an earlier
    request with the key in progress: ambiguous, like 5xx)."""
    url, script = server
    script.answers.append((code, headers, b"nope"))
    provider = WebhookProvider(url)
    try:
        with pytest.raises(error) as caught:
            await provider.send(message())
    finally:
        await provider.aclose()
    assert caught.value.status_code == code
    if after is not None:
        assert caught.value.retry_after == after


async def test_timeout_after_the_request_was_written_is_ambiguous(server) -> None:
    """The server received the request and never answered: it may have acted on it."""
    url, script = server
    script.hang.set()
    provider = WebhookProvider(url, timeout=0.3)
    try:
        with pytest.raises(AmbiguousFailure, match="no answer"):
            await provider.send(message())
    finally:
        await provider.aclose()
    assert len(script.seen) == 1


async def test_connection_refused_is_certainly_not_sent() -> None:
    """Nobody listening: the request never left, so a retry is safe."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    provider = WebhookProvider(f"http://127.0.0.1:{port}/hook")
    try:
        with pytest.raises(TransientFailure, match="not sent"):
            await provider.send(message())
    finally:
        await provider.aclose()


def test_retry_after_forms() -> None:
    """Retry-After is read as seconds or as an HTTP date; garbage is ignored."""
    assert retry_after("120") == 120.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert retry_after("soon") is None
    assert retry_after(None) is None
