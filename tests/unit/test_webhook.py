"""The webhook provider against a real HTTP server on 127.0.0.1: headers and the
classification of every failure at the seam."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kirim.devtools.receiver import Behaviour, Receiver
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


# -- lookup, against the loopback Receiver ---------------------------------------------


def keyed(key: str) -> Message:
    return Message(
        delivery_id=1,
        idempotency_key=key,
        provider_request_id="req-1",
        event_id="e-1",
        recipient="r-1",
        channel="push",
        payload={},
        attempt=1,
    )


async def test_lookup_says_whether_the_receiver_accepted_a_key() -> None:
    """404 before any request with the key (None); after one was accepted, 200 with
    the message id the send was answered with. Keys are URL-quoted into {key}."""
    key = "order 7/x:%2F?#"
    with Receiver() as receiver:
        provider = WebhookProvider(receiver.url, lookup_url=receiver.lookup_url)
        try:
            assert await provider.lookup(key) is None
            sent = await provider.send(keyed(key))
            found = await provider.lookup(key)
            assert await provider.lookup("another key") is None
        finally:
            await provider.aclose()
    assert found is not None
    assert found.provider_message_id == sent.provider_message_id is not None
    assert receiver.requests[key] == 1
    assert receiver.lookups == {"not_found": 2, "found": 1}


async def test_lookup_does_not_find_a_request_answered_503() -> None:
    """A 503 was not processed (not delivered): the lookup says so."""
    with Receiver(Behaviour(error_rate=1.0)) as receiver:
        provider = WebhookProvider(receiver.url, lookup_url=receiver.lookup_url)
        try:
            with pytest.raises(AmbiguousFailure):
                await provider.send(keyed("k-503"))
            assert await provider.lookup("k-503") is None
        finally:
            await provider.aclose()


async def test_lookup_finds_a_request_that_timed_out_after_being_accepted() -> None:
    """The receiver accepted it (the user has it) and never answered in time: the
    send is ambiguous, the lookup finds it, even while the answer is still held."""
    with Receiver(Behaviour(hang_rate=1.0, hang_s=2.0)) as receiver:
        provider = WebhookProvider(receiver.url, timeout=0.3, lookup_url=receiver.lookup_url)
        try:
            with pytest.raises(AmbiguousFailure, match="no answer"):
                await provider.send(keyed("k-hang"))
            found = await provider.lookup("k-hang")
        finally:
            await provider.aclose()
    assert found is not None
    assert found.provider_message_id is not None


async def test_the_receiver_answers_404_to_other_paths() -> None:
    """A GET outside /lookup/ is a 404 at the receiver, not a lookup."""
    with Receiver() as receiver:
        base = receiver.url.rsplit("/", 1)[0]
        elsewhere = WebhookProvider(receiver.url, lookup_url=base + "/nothing/{key}")
        try:
            assert await elsewhere.lookup("k") is None  # a 404 is "not accepted"
        finally:
            await elsewhere.aclose()


@pytest.fixture
def lookup_server() -> Iterator[tuple[str, list[tuple[int, dict[str, str], bytes]], list[str]]]:
    """A GET server answering scripted (code, headers, body) and recording paths."""
    answers: list[tuple[int, dict[str, str], bytes]] = []
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            code, headers, data = answers.pop(0)
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/lookup/{{key}}?x=1", answers, paths
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(
    ("code", "headers", "body", "found"),
    [
        (200, {}, b'{"id": "m-1"}', "m-1"),
        (200, {"X-Message-Id": "m-2"}, b"ok", "m-2"),
        (200, {}, b"not json", None),
        (404, {}, b"", "none"),
    ],
)
async def test_lookup_reads_the_message_id(lookup_server, code, headers, body, found) -> None:
    """200 → Sent with the body's id or X-Message-Id (or no id); 404 → None. The token
    and headers go with it; the key is quoted into the path."""
    url, answers, paths = lookup_server
    answers.append((code, headers, body))
    provider = WebhookProvider("http://127.0.0.1:9/hook", token="t0k", lookup_url=url)
    try:
        sent = await provider.lookup("a/b c")
    finally:
        await provider.aclose()
    assert paths == ["/v1/lookup/a%2Fb%20c?x=1"]
    if found == "none":
        assert sent is None
    else:
        assert sent is not None
        assert sent.provider_message_id == found


@pytest.mark.parametrize("code", [500, 503, 401, 409, 302])
async def test_lookup_other_answers_raise(lookup_server, code) -> None:
    """Anything but 200 or 404 leaves the question open: the lookup raises."""
    url, answers, _ = lookup_server
    answers.append((code, {}, b"\x00nope"))
    provider = WebhookProvider("http://127.0.0.1:9/hook", lookup_url=url)
    try:
        with pytest.raises(AmbiguousFailure, match=f"lookup: HTTP {code}"):
            await provider.lookup("k")
    finally:
        await provider.aclose()


async def test_lookup_without_an_answer_raises() -> None:
    """Nobody listening, or no lookup_url at all: the lookup raises, never says None."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    provider = WebhookProvider(
        f"http://127.0.0.1:{port}/hook", lookup_url=f"http://127.0.0.1:{port}/lookup/{{key}}"
    )
    plain = WebhookProvider(f"http://127.0.0.1:{port}/hook")
    try:
        with pytest.raises(AmbiguousFailure, match="lookup: no answer"):
            await provider.lookup("k")
        with pytest.raises(RuntimeError, match="no lookup_url"):
            await plain.lookup("k")
    finally:
        await provider.aclose()
        await plain.aclose()


def test_lookup_settings_are_checked_and_exposed() -> None:
    """lookup_lag (default 0) is the provider's attribute; a lookup_url needs {key}."""
    assert WebhookProvider("http://x/hook").lookup_lag == 0.0
    provider = WebhookProvider("http://x/hook", lookup_url="http://x/l/{key}", lookup_lag=1.5)
    assert (provider.lookup_url, provider.lookup_lag) == ("http://x/l/{key}", 1.5)
    with pytest.raises(ValueError, match="must contain"):
        WebhookProvider("http://x/hook", lookup_url="http://x/lookup")
    for lag in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lookup_lag"):
            WebhookProvider("http://x/hook", lookup_lag=lag)
