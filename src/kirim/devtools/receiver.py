"""A webhook receiver on 127.0.0.1 that stands in for a provider in demos and tests.

It records every request per ``Idempotency-Key`` and honours nothing unless told
to, so a duplicate shows as a second request for a key. A request without that
header is recognised by its content (kirim's default key of its ``event_id``,
``recipient`` and ``channel``), as a user would recognise a second copy; a receiver
that honours keys cannot deduplicate it. Behaviour per request is drawn from a
seeded random generator: a base latency, sometimes slow, sometimes accepting the
request and then not answering until the client has given up.

``GET /lookup/<key>`` (``lookup_url``, for the webhook provider's ``lookup``) answers
200 with the message id once a request with that key was accepted, i.e. reached the
user (a request answered 503 was not; one left to time out was), and 404 otherwise.

``python -m kirim.receiver [--port 8080] [--honour-keys]`` runs one on 127.0.0.1
until Ctrl-C (or SIGTERM), for the channel ``kirim init`` writes: it says on stderr
what it received, and at the end how many notifications arrived more than once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from kirim.keys import default_key
from kirim.text import plural


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # many workers connect at once; a full backlog resets them

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a client that hung up (or was killed) is part of the game


@dataclass(frozen=True, slots=True, kw_only=True)
class Behaviour:
    slow_rate: float = 0.0  # share of requests answered after ``slow_s``
    slow_s: tuple[float, float] = (0.2, 0.8)
    hang_rate: float = 0.0  # share accepted, then answered only after ``hang_s``
    hang_s: float = 2.0
    error_rate: float = 0.0  # share answered 503 without being processed
    limit_rate: float = 0.0  # share answered 429 (the service fakes; not processed)
    lost_rate: float = 0.0  # share processed, then the connection closed unanswered
    honours_keys: bool = False  # deduplicate by Idempotency-Key
    latency: Callable[[random.Random], float] | None = None  # base seconds per request


class Counts:
    """What a stand-in provider's user received: ``requests`` counts every request per
    notification, ``_copies`` the copies the user got (one per key when keys are
    honoured), both guarded by ``_lock``."""

    requests: Counter[str]
    _copies: Counter[str]
    _lock: threading.Lock

    def delivered(self) -> int:
        """Notifications the user received at least once."""
        with self._lock:
            return len(self.requests)

    def duplicates(self) -> int:
        """Requests beyond the first per notification."""
        with self._lock:
            return sum(n - 1 for n in self.requests.values())

    def duplicated(self) -> int:
        """Notifications the user received more than once."""
        with self._lock:
            return sum(1 for n in self._copies.values() if n > 1)

    def copies(self) -> dict[str, int]:
        """The copies the user received, per notification (``kirim.chaos.tally``)."""
        with self._lock:
            return dict(self._copies)


class Receiver(Counts):
    """``with Receiver() as r: r.url`` — stops by itself when the block ends."""

    def __init__(
        self, behaviour: Behaviour | None = None, *, seed: int | None = None, port: int = 0
    ) -> None:
        self.behaviour = behaviour or Behaviour()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # every request per key
        self.request_ids: list[str] = []
        self.first_seen: dict[str, float] = {}  # epoch seconds of the first request per key
        self.in_flight_by: Counter[str] = Counter()  # unanswered requests per X-Worker-Id
        self._copies: Counter[str] = Counter()  # copies the user received per key
        self.injected: Counter[str] = Counter()  # "errors", "timeouts", "slow" answers given
        self._message_ids: dict[str, str] = {}
        self._accepted: dict[str, str] = {}  # the first message id accepted per key
        self.lookups: Counter[str] = Counter()  # "found", "not_found" answers to lookups
        self._hold = threading.Event()
        self._hold.set()  # set = not holding
        self.in_flight = 0
        self._server = _QuietServer(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/notify"

    @property
    def lookup_url(self) -> str:
        """``GET`` it with ``{key}`` replaced by the URL-quoted key (``lookup``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/lookup/{{key}}"

    def lookup(self, key: str) -> str | None:
        """The message id of the first accepted request with ``key``, or None."""
        with self._lock:
            return self._accepted.get(key)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def hold(self) -> None:
        """Accept requests but answer none until ``release``."""
        self._hold.clear()

    def release(self) -> None:
        self._hold.set()

    def _decide(self, key: str, keyed: bool = True) -> tuple[str, float]:
        """(provider message id or "error", seconds to wait before answering)."""
        b = self.behaviour
        with self._lock:
            roll = self._rng.random()
            if roll < b.error_rate:
                self.injected["errors"] += 1
                return "error", 0.0
            self.requests[key] += 1
            deduplicated = b.honours_keys and keyed
            if not (deduplicated and self._copies[key]):
                self._copies[key] += 1
            fresh = f"p-{sum(self.requests.values())}"
            message_id = self._message_ids.setdefault(key, fresh) if deduplicated else fresh
            self._accepted.setdefault(key, message_id)
            base = b.latency(self._rng) if b.latency is not None else 0.0
            roll -= b.error_rate
            if roll < b.slow_rate:
                self.injected["slow"] += 1
                return message_id, base + self._rng.uniform(*b.slow_s)
            if roll < b.slow_rate + b.hang_rate:
                self.injected["timeouts"] += 1
                return message_id, b.hang_s
            return message_id, base

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                key = self.headers.get("Idempotency-Key") or ""
                keyed = bool(key)
                if not keyed:
                    key = _content_key(body)
                worker = self.headers.get("X-Worker-Id") or ""
                with receiver._lock:
                    receiver.request_ids.append(self.headers.get("X-Request-Id") or "")
                    receiver.first_seen.setdefault(key, time.time())
                    receiver.in_flight += 1
                    receiver.in_flight_by[worker] += 1
                try:
                    outcome, delay = receiver._decide(key, keyed)
                    receiver._hold.wait()
                    if delay:
                        time.sleep(delay)
                    if outcome == "error":
                        self._answer(503, {"error": "unavailable"})
                    else:
                        self._answer(200, {"id": outcome})
                finally:
                    with receiver._lock:
                        receiver.in_flight -= 1
                        receiver.in_flight_by[worker] -= 1

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                prefix = "/lookup/"
                if not path.startswith(prefix):
                    self._answer(404, {"error": "no such path"})
                    return
                message_id = receiver.lookup(unquote(path[len(prefix) :]))
                with receiver._lock:
                    receiver.lookups["not_found" if message_id is None else "found"] += 1
                if message_id is None:
                    self._answer(404, {"error": "not found"})
                else:
                    self._answer(200, {"id": message_id}, {"X-Message-Id": message_id})

            def _answer(
                self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: that is the point of a hang

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


def _content_key(body: bytes) -> str:
    """What identifies a notification sent without a key: its event, recipient, channel."""
    try:
        data = json.loads(body)
        return default_key(str(data["event_id"]), str(data["recipient"]), str(data["channel"]))
    except (ValueError, KeyError, TypeError):
        return ""


def main(argv: list[str] | None = None) -> int:
    """``python -m kirim.receiver``: a receiver on 127.0.0.1 until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m kirim.receiver",
        description="A loopback webhook receiver that counts every request per "
        "idempotency key (any POST path; GET /lookup/<key>). Ctrl-C stops it.",
    )
    parser.add_argument("--port", type=int, default=8080, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument(
        "--honour-keys",
        action="store_true",
        help="deduplicate by Idempotency-Key (for a channel with idempotent = true)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: a port is 0-65535")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        receiver = Receiver(Behaviour(honours_keys=args.honour_keys), port=args.port)
    except OSError as exc:
        print(f"Error: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 2
    with receiver:
        base = receiver.url.rpartition("/")[0]
        _say(f"kirim receiver on {base}/ (POST any path, GET /lookup/<key>); Ctrl-C stops it")
        seen = 0
        while not stop.wait(0.2):
            with receiver._lock:
                total = sum(receiver.requests.values())
            if total != seen:
                seen = total
                _say(counts(total, receiver.delivered(), receiver.duplicated()))
    _say(f"stopped: {counts(seen, receiver.delivered(), receiver.duplicated())}")
    return 0


def counts(requests: int, notifications: int, duplicated: int) -> str:
    """``2 requests, 1 notification, 1 received more than once``."""
    return (
        f"{plural(requests, 'request')}, {plural(notifications, 'notification')}, "
        f"{duplicated} received more than once"
    )


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # nobody reads stderr: keep serving
        print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
