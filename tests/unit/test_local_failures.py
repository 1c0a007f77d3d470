"""Where a failure happened decides its class: before any byte left the host, it is
certainly not sent (issue 11, items 5 and 6)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from kirim.cli import main
from kirim.errors import ConfigError, NotSent
from kirim.observe.logging import configure
from kirim.providers.base import Message
from kirim.providers.webhook import WebhookProvider

MESSAGE = Message(
    delivery_id=1,
    idempotency_key="k-1",
    provider_request_id="req-1",
    event_id="e",
    recipient="u",
    channel="push",
    payload={"t": 1},
    attempt=1,
)


class Listener:
    """A loopback TCP server that counts connections; the first ``hang`` of them get no
    answer, and after that the port is closed (connection refused)."""

    def __init__(self, *, hang: int = 0) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hang = hang
        self.connections = 0
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        held = []
        try:
            while self.connections < max(1, self.hang):
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.recv(65536)  # the request arrived; never answered
                held.append(conn)
                if self.connections >= self.hang:
                    break
        except OSError:
            pass
        finally:
            self.sock.close()  # from now on: connection refused
            self.done.wait(10)
            for conn in held:
                conn.close()

    def close(self) -> None:
        self.done.set()
        # an accept() still waiting for a connection returns (OSError) once the
        # listening socket is shut down; closing it from this thread would not wake it
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)


def test_a_listener_nobody_connected_to_stops_when_closed() -> None:
    """close() ends the listener's thread even while it still waits for a first
    connection (it waited there for its 10 s join, in every test's teardown)."""
    found = Listener()
    found.close()
    assert not found._thread.is_alive()


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    yield found
    found.close()


async def test_a_header_that_cannot_be_encoded_is_refused_at_start() -> None:
    """A token HTTP cannot carry is a configuration error before any send."""
    with pytest.raises(ValueError, match="token must be plain ASCII"):
        WebhookProvider("http://127.0.0.1:9/push", token="s3cret…")


async def test_a_body_that_cannot_be_encoded_is_not_sent(listener: Listener) -> None:
    """A payload that cannot be serialised fails before any byte left: NotSent."""
    provider = WebhookProvider(f"http://127.0.0.1:{listener.port}/push", timeout=2)
    try:
        with pytest.raises(NotSent, match="not sent"):
            await provider.send(replace(MESSAGE, payload={"t": "\ud800"}))
    finally:
        await provider.aclose()
    assert listener.connections == 0


def _cli(tmp_path: Path, url: str, extra: str = "") -> list[str]:
    config = tmp_path / "kirim.toml"
    config.write_text(
        "[worker]\nmax_attempts = 3\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
        "poll_interval = 0.05\nlease = 5\n\n"
        f'[channels.push]\nprovider = "webhook"\nurl = "{url}"\ntimeout = 0.5\n{extra}'
    )
    return ["--config", str(config), "--database", f"sqlite:///{tmp_path / 'k.db'}"]


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    yield
    configure(level="warning")


def test_cli_token_that_cannot_be_encoded_is_a_config_error(tmp_path: Path) -> None:
    """Through the CLI, the README's token example with a non-ASCII character fails at
    start with one line, not as 8 retries ending in doubt with nothing sent."""
    base = _cli(tmp_path, "http://127.0.0.1:9/push", 'token = "…"\n')
    runner = CliRunner()
    assert runner.invoke(main, [*base, "init"]).exit_code == 0
    sent = runner.invoke(
        main,
        [*base, "send", "--event", "e", "--recipient", "u", "--channel", "push", "--payload", "{}"],
    )
    assert sent.exit_code == 0, sent.output
    result = runner.invoke(main, [*base, "worker", "--burst"])
    assert result.exit_code == 2, result.output
    assert "token must be plain ASCII" in result.output
    assert "Traceback" not in result.output


def test_cli_refused_after_an_unknown_request_ends_in_doubt(tmp_path: Path) -> None:
    """The first request is received and never answered; then the port is closed and
    every resend (same key) is refused: the attempts run out in doubt, not failed."""
    listener = Listener(hang=1)
    try:
        base = _cli(tmp_path, f"http://127.0.0.1:{listener.port}/push", "idempotent = true\n")
        runner = CliRunner()
        assert runner.invoke(main, [*base, "init"]).exit_code == 0
        args = ["send", "--event", "e", "--recipient", "u", "--channel", "push"]
        sent = runner.invoke(main, [*base, *args, "--payload", "{}", "--json"])
        delivery = json.loads(sent.stdout)["delivery_id"]
        ran = runner.invoke(main, [*base, "worker", "--burst"])
        assert ran.exit_code == 0, ran.output
        status = runner.invoke(main, [*base, "status", str(delivery), "--json"])
        data = json.loads(status.stdout)
    finally:
        listener.close()
    assert listener.connections == 1
    assert data["status"] == "in_doubt"
    assert [a["status"] for a in data["attempts"]] == [
        "unknown",
        "failed_transient",
        "failed_transient",
    ]


def test_config_error_is_a_kirim_error() -> None:
    """The start-up refusal is the configuration error kirim raises for bad config."""
    from kirim.config import build_provider

    with pytest.raises(ConfigError, match=r"channels\.push: token must be plain ASCII"):
        build_provider("push", "webhook", {"url": "http://127.0.0.1:9/x", "token": "…"})
