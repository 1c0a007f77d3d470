"""What every loopback service fake shares: the device's view, the faults, the counts.

A fake stands for a real service (APNs, FCM, a Web Push service, Twilio, Slack) on
127.0.0.1: it checks what the real one checks (credentials, addresses, bodies) and
answers with the service's documented error bodies. What a request becomes is drawn
per request from a seeded generator (``Behaviour``, as the webhook receiver's):

- ``error_rate``: a 5xx the service answers without acting (not delivered);
- ``limit_rate``: a 429 with ``Retry-After`` (not delivered);
- ``lost_rate``: delivered, then the connection is closed with no answer;
- ``hang_rate``: delivered, then the answer is held ``hang_s`` (past the client's
  timeout);
- ``latency``: seconds before any other answer;

or, for a test, taken in order from ``script`` (``["lost", "ok"]``) before any is
drawn.

The device's view (``show``) is what the user sees: a notification with the collapse
id of one the device still shows *replaces* it (APNs ``apns-collapse-id``, an Android
notification's ``tag``, a web notification's ``tag``); any other is one more. So
``duplicated()`` counts notifications a user saw more than once, and a collapsed
resend is one. A notification is told apart by its content (``identify``), never by
anything kirim adds, as the user would. Requests of a dead address (``dead``) are
refused the service's way, and counted in ``refused_dead``.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from kirim.devtools.receiver import Behaviour, Counts

#: (device address, the shown message) -> the notification it is
Identify = Callable[[str, dict[str, Any]], str]


def by_content(address: str, shown: dict[str, Any]) -> str:
    """The default ``identify``: the device and the title and body shown."""
    return f"{address}|{shown.get('title', '')}|{shown.get('body', '')}"


@dataclass(slots=True)
class Answer:
    """What the fake answers: a status, a JSON body (or text) and headers."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def content(self) -> bytes:
        if self.body is None:
            return b""
        if isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body).encode()


class ServiceFake(Counts):
    """The counts, the device view and the drawn faults of one fake."""

    def __init__(
        self,
        behaviour: Behaviour | None = None,
        *,
        seed: int | None = None,
        identify: Identify | None = None,
    ) -> None:
        self.behaviour = behaviour or Behaviour()
        self._rng = random.Random(seed)
        #: how a shown message is told apart (a harness may set it once it knows)
        self.identify: Identify = identify or by_content
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # requests the service acted on, per key
        self._copies: Counter[str] = Counter()  # notifications the device showed, per key
        self.first_seen: dict[str, float] = {}
        self.in_flight_by: Counter[str] = Counter()  # unanswered requests per User-Agent
        self.injected: Counter[str] = Counter()  # "errors", "limited", "lost", "timeouts"
        self.lookups: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # the service's refusals, by reason
        self.dead: set[str] = set()  # addresses the service calls gone
        #: device -> collapse id -> the notification it shows
        self.screens: dict[str, dict[str, str]] = {}
        self.shown: list[tuple[str, dict[str, Any]]] = []  # (device, message) of each show
        #: fates the next requests take, in order, before any is drawn (tests)
        self.script: list[str] = []

    @property
    def lookup_url(self) -> str:
        return ""  # a service fake is not asked by kirim's webhook lookup

    @property
    def url(self) -> str:
        return self.base_url

    @property
    def base_url(self) -> str:
        raise NotImplementedError

    def draw(self) -> tuple[str, float]:
        """A request's fate and the seconds before its answer."""
        b = self.behaviour
        with self._lock:
            if self.script:
                fate = self.script.pop(0)
                if fate != "ok":
                    self.injected[_COUNTED[fate]] += 1
                return fate, b.hang_s if fate == "hang" else 0.0
            roll = self._rng.random()
            base = b.latency(self._rng) if b.latency is not None else 0.0
            for fate, rate in (
                ("error", b.error_rate),
                ("limited", b.limit_rate),
                ("lost", b.lost_rate),
                ("hang", b.hang_rate),
            ):
                if roll < rate:
                    self.injected[_COUNTED[fate]] += 1
                    return fate, b.hang_s if fate == "hang" else base
                roll -= rate
            return "ok", base

    def show(self, device: str, message: dict[str, Any], collapse: str | None) -> str:
        """The device receives ``message``: it replaces the one it shows with the same
        collapse id, else it is one more. Returns the notification's key."""
        key = self.identify(device, message)
        with self._lock:
            self.requests[key] += 1
            self.first_seen.setdefault(key, time.time())
            self.shown.append((device, message))
            screen = self.screens.setdefault(device, {})
            if collapse is not None and collapse in screen:
                screen[collapse] = key  # replaced: the device shows one
                return key
            self._copies[key] += 1
            screen[collapse if collapse is not None else f"#{len(self.shown)}"] = key
        return key

    def refuse(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1

    @contextlib.contextmanager
    def in_flight(self, worker: str) -> Iterator[None]:
        with self._lock:
            self.in_flight_by[worker] += 1
        try:
            yield
        finally:
            with self._lock:
                self.in_flight_by[worker] -= 1

    def wait(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


_COUNTED = {"error": "errors", "limited": "limited", "lost": "lost", "hang": "timeouts"}


def worker_of(user_agent: str | None) -> str:
    """The worker a request came from: the last word of its User-Agent
    (``kirim/0.1.0 worker-3``; the simulation's workers say it), else ""."""
    return (user_agent or "").split()[-1] if user_agent and " " in user_agent else ""


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


#: a handler's answer that closes the connection with none (the answer lost)
LOST = object()
Handle = Callable[[str, str, dict[str, str], bytes], "Answer | object"]


class HttpFake(ServiceFake):
    """A fake over HTTP/1.1 on 127.0.0.1 (a thread of its own): ``handle(method, path,
    headers, body)`` answers, the faults applied around it (``deliver``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._server = _QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))
        self._thread.daemon = True

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HttpFake:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        raise NotImplementedError

    def deliver(self, act: Callable[[], Answer]) -> Any:
        """Draw the request's fate: refused with a 5xx or 429 without acting, or
        ``act()`` (it delivers) and then its answer, lost, held or given."""
        fate, delay = self.draw()
        if fate == "error":
            return self.unavailable()
        if fate == "limited":
            return self.limited()
        answer = act()
        if fate == "lost":
            return LOST
        self.wait(delay)
        return answer

    def unavailable(self) -> Answer:
        return Answer(503, {"error": "unavailable"})

    def limited(self) -> Answer:
        return Answer(429, {"error": "too many requests"}, {"Retry-After": "1"})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with fake.in_flight(worker_of(headers.get("user-agent"))):
                    answer = fake.handle(
                        method, urlsplit(self.path).path + _query(self.path), headers, body
                    )
                if answer is LOST or not isinstance(answer, Answer):
                    self.close_connection = True
                    return
                data = answer.content()
                try:
                    self.send_response(answer.status)
                    kind = (
                        "application/json" if not isinstance(answer.body, bytes) else "text/plain"
                    )
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self) -> None:
                self._serve("POST")

            def do_GET(self) -> None:
                self._serve("GET")

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


def _query(path: str) -> str:
    query = urlsplit(path).query
    return f"?{query}" if query else ""
