"""The ``kirim`` command line on real SQLite files and a real loopback HTTP provider."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kirim.cli import main
from kirim.observe.logging import configure
from kirim.store.base import SCHEMA_VERSION


@dataclass
class Provider:
    """A webhook provider on 127.0.0.1 that answers ``status`` with ``{"id": "p-1"}``."""

    url: str
    status: int = 200
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with provider.lock:
                provider.requests.append({"headers": dict(self.headers), "body": json.loads(body)})
                status = provider.status
            answer = json.dumps({"id": "p-1"} if status < 300 else {"error": "bad"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def provider() -> Iterator[Provider]:
    """A loopback HTTP provider, shut down at the end of the test."""
    provider = Provider(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    server.daemon_threads = True
    provider.url = f"http://127.0.0.1:{server.server_address[1]}/push"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield provider
    server.shutdown()
    server.server_close()
    thread.join()


@dataclass
class Cli:
    config: Path
    database: str

    def args(self, *args: str) -> list[str]:
        return ["--config", str(self.config), "--database", self.database, *args]

    def __call__(self, *args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(main, self.args(*args), input=input, catch_exceptions=False)

    def json(self, *args: str) -> Any:
        result = self(*args, "--json")
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    def send(self, *extra: str, payload: str = '{"title": "hi"}') -> Result:
        base = ("send", "--event", "48291", "--recipient", "1007", "--channel", "push")
        return self(*base, "--payload", payload, *extra)


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees only its own database; the CLI's log setup is undone afterwards."""
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


@pytest.fixture
def cli(tmp_path: Path, provider: Provider) -> Cli:
    """A CLI on a fresh SQLite file with one webhook channel ``push`` to the provider."""
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'[worker]\nmax_attempts = 3\n\n[channels.push]\nprovider = "webhook"\n'
        f'url = "{provider.url}"\ntimeout = 10\n'
    )
    return Cli(config=config, database=f"sqlite:///{tmp_path / 'kirim.db'}")


@pytest.fixture
def ready(cli: Cli) -> Cli:
    """The same CLI after ``kirim init``."""
    result = cli("init")
    assert result.exit_code == 0, result.stderr
    return cli


def test_init_prints_schema_version_and_url(cli: Cli) -> None:
    """init creates the schema and says which version and which database."""
    result = cli("init")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"schema version {SCHEMA_VERSION} at {cli.database}"
    assert cli("init").exit_code == 0


def test_send_twice_creates_one_delivery(ready: Cli) -> None:
    """The same send again reports the existing delivery with created false."""
    first = json.loads(ready.send("--json").stdout)
    second = json.loads(ready.send("--json").stdout)
    assert first["created"] is True
    assert second["created"] is False
    assert first["delivery_id"] == second["delivery_id"]
    assert first["idempotency_key"] == second["idempotency_key"]
    assert second["status"] == "pending"


def test_send_text_says_whether_created(ready: Cli) -> None:
    """Text mode names the delivery id and whether it was created."""
    assert "delivery 1 created" in ready.send().stdout
    assert "not created" in ready.send().stdout


def test_same_key_different_payload_exits_2(ready: Cli) -> None:
    """Reusing a key for another payload is refused with a one-line message."""
    assert ready.send("--key", "k-1", payload='{"a": 1}').exit_code == 0
    result = ready.send("--key", "k-1", payload='{"a": 2}')
    assert result.exit_code == 2
    assert "k-1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_payload_exits_2(ready: Cli) -> None:
    """A payload that is not JSON exits 2 with one line and writes nothing."""
    result = ready.send(payload="{not json")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: --payload is not valid JSON")
    assert len(result.stderr.strip().splitlines()) == 1
    assert ready.json("list") == []


def test_payload_from_stdin(ready: Cli) -> None:
    """--payload - reads the JSON from stdin."""
    base = ("send", "--event", "1", "--recipient", "2", "--channel", "push", "--json")
    result = ready(*base, "--payload", "-", input='{"from": "stdin"}')
    delivery = ready.json("status", str(json.loads(result.stdout)["delivery_id"]))
    assert delivery["payload"] == {"from": "stdin"}


def test_unknown_channel_exits_2(ready: Cli) -> None:
    """A channel that is not configured exits 2 and names the known ones."""
    result = ready(
        "send", "--event", "1", "--recipient", "2", "--channel", "sms", "--payload", "{}"
    )
    assert result.exit_code == 2
    assert "unknown channel 'sms'" in result.stderr
    assert "push" in result.stderr


def test_send_before_init_says_run_init(cli: Cli) -> None:
    """Without a schema, send exits 2 and tells the user to run kirim init."""
    result = cli.send()
    assert result.exit_code == 2
    assert "kirim init" in result.stderr
    assert "Traceback" not in result.output


def test_bad_config_and_bad_url_exit_2(tmp_path: Path, cli: Cli) -> None:
    """A broken config file or an unsupported URL exits 2 with one line."""
    broken = tmp_path / "broken.toml"
    broken.write_text("[channels.push\n")
    result = CliRunner().invoke(main, ["--config", str(broken), "init"])
    assert result.exit_code == 2
    assert "not valid TOML" in result.stderr
    result = CliRunner().invoke(main, ["--config", str(cli.config), "--database", "x://y", "init"])
    assert result.exit_code == 2
    assert "unsupported database URL" in result.stderr


def test_send_after_duration_and_datetime(ready: Cli) -> None:
    """--send-after takes a duration or a zoned ISO datetime and schedules the job."""
    later = ready.json("status", str(ready.json(*_send("a"), "--send-after", "2h")["delivery_id"]))
    assert later["job"]["run_at"] > later["created_at"]
    fixed = ready.json(*_send("b"), "--send-after", "2031-05-01T09:00:00+07:00")
    assert ready.json("status", str(fixed["delivery_id"]))["job"]["run_at"].startswith(
        "2031-05-01T02:00:00"
    )


@pytest.mark.parametrize("when", ["soon", "5", "2031-05-01T09:00:00"])
def test_bad_send_after_exits_2(ready: Cli, when: str) -> None:
    """A WHEN that is neither a duration nor a zoned datetime exits 2."""
    result = ready.send("--send-after", when)
    assert result.exit_code == 2
    assert "--send-after" in result.stderr


def _send(event: str) -> tuple[str, ...]:
    return ("send", "--event", event, "--recipient", "1007", "--channel", "push", "--payload", "{}")


def test_status_of_missing_delivery_exits_1(ready: Cli) -> None:
    """status of an id that does not exist exits 1 with a message on stderr."""
    result = ready("status", "999", "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "no delivery" in result.stderr


def test_worker_burst_delivers_and_status_shows_attempt(ready: Cli, provider: Provider) -> None:
    """worker --burst delivers once; status shows it sent with one succeeded attempt."""
    sent = json.loads(ready.send("--json").stdout)
    result = ready("worker", "--burst", "--worker-id", "w-1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert "event=worker_started" in result.stderr
    assert len(provider.requests) == 1
    request = provider.requests[0]
    delivery = ready.json("status", sent["idempotency_key"])
    assert delivery["status"] == "sent"
    assert delivery["provider_message_id"] == "p-1"
    assert delivery["sent_at"].endswith("Z")
    assert delivery["job"]["status"] == "completed"
    [attempt] = delivery["attempts"]
    assert attempt["status"] == "succeeded"
    assert attempt["worker_id"] == "w-1"
    assert attempt["provider_request_id"] == request["headers"]["X-Request-Id"]
    assert request["headers"]["Idempotency-Key"] == sent["idempotency_key"]
    assert ready("worker", "--burst").exit_code == 0
    assert len(provider.requests) == 1


def test_status_text_shows_timeline(ready: Cli) -> None:
    """Text status shows the delivery and a timeline with the attempt."""
    ready.send()
    ready("worker", "--burst")
    result = ready("status", "1")
    assert result.exit_code == 0
    assert "timeline" in result.stdout
    assert "attempt 1 requested" in result.stdout
    assert "succeeded" in result.stdout


def test_worker_json_logs(ready: Cli) -> None:
    """--log-format json makes the worker log JSON lines on stderr."""
    ready.send()
    result = CliRunner().invoke(main, ["--log-format", "json", *ready.args("worker", "--burst")])
    assert result.exit_code == 0
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    requests = [line for line in lines if line["event"] == "provider_request"]
    assert requests[0]["provider_request_id"].startswith("req-")


def test_list_by_status_json(ready: Cli) -> None:
    """list --status sent --json gives the sent deliveries with their job and attempts."""
    ready(*_send("a"))
    ready("worker", "--burst")
    ready(*_send("b"))
    sent = ready.json("list", "--status", "sent")
    assert [d["event_id"] for d in sent] == ["a"]
    assert sent[0]["job"]["status"] == "completed"
    assert sent[0]["attempts"][0]["status"] == "succeeded"
    assert [d["event_id"] for d in ready.json("list", "--status", "pending")] == ["b"]
    assert [d["event_id"] for d in ready.json("list", "--after", "2")] == ["a"]  # newest first
    assert [d["event_id"] for d in ready.json("list", "--oldest-first", "--after", "1")] == ["b"]
    table = ready("list")
    assert table.exit_code == 0
    assert "deliveries (2)" in table.stdout


def test_dead_letter_flow(ready: Cli, provider: Provider) -> None:
    """A 400 dead-letters the delivery; retry requeues it; cancel of a live one exits 1."""
    provider.status = 400
    delivery_id = str(json.loads(ready.send("--json").stdout)["delivery_id"])
    assert ready("worker", "--burst").exit_code == 0
    failed = ready.json("status", delivery_id)
    assert failed["status"] == "failed"
    assert failed["job"]["status"] == "dead"
    assert failed["attempts"][0]["status"] == "failed_permanent"
    [dead] = ready.json("dead-letter", "list")
    assert dead["id"] == int(delivery_id)
    assert "HTTP 400" in dead["last_error"]
    assert "dead letters (1)" in ready("dead-letter", "list").stdout
    retried = ready("dead-letter", "retry", delivery_id)
    assert retried.exit_code == 0
    assert f"delivery {delivery_id} requeued" in retried.stdout
    again = ready.json("status", delivery_id)
    assert again["status"] == "pending"
    assert again["job"]["status"] == "queued"
    assert ready.json("dead-letter", "list") == []
    result = ready("dead-letter", "cancel", delivery_id, "404")
    assert result.exit_code == 1
    assert f"{delivery_id}: not dead-lettered" in result.stderr
    assert "404: not found" in result.stderr
    assert ready("dead-letter", "retry", delivery_id).exit_code == 1


def test_dead_letter_cancel_cancels_a_dead_delivery(ready: Cli, provider: Provider) -> None:
    """dead-letter cancel turns a dead-lettered delivery into a canceled one."""
    provider.status = 400
    ready.send()
    ready("worker", "--burst")
    result = ready("dead-letter", "cancel", "1")
    assert result.exit_code == 0, result.stderr
    assert ready.json("status", "1")["status"] == "canceled"
    assert ready.json("dead-letter", "list") == []


def test_cancel_pending_then_sent_exits_1(ready: Cli, provider: Provider) -> None:
    """cancel stops a pending delivery; a sent one cannot be canceled (exit 1)."""
    ready(*_send("a"))
    ready(*_send("b"))
    assert ready("cancel", "1").exit_code == 0
    ready("worker", "--burst")
    assert [r["body"]["event_id"] for r in provider.requests] == ["b"]
    assert ready.json("status", "1")["status"] == "canceled"
    result = ready("cancel", "2")
    assert result.exit_code == 1
    assert "it is sent" in result.stderr


def test_demo_and_bench_call_their_modules(ready: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """demo passes its options to run_demo and exits with its code; bench prints its dict."""
    calls: list[tuple[Any, ...]] = []

    def run_demo(console: Any, notifications: int, workers: int, seed: int | None) -> int:
        calls.append((notifications, workers, seed))
        return 3

    def run_bench(database: str | None, notifications: int, workers: int) -> dict[str, float]:
        calls.append((database, notifications, workers))
        return {"deliveries_per_s": 10.5, "enqueues_per_s": notifications * workers}

    demo = types.ModuleType("kirim.devtools.demo")
    demo.run_demo = run_demo
    bench = types.ModuleType("kirim.devtools.bench")
    bench.run_bench = run_bench
    monkeypatch.setitem(sys.modules, "kirim.devtools.demo", demo)
    monkeypatch.setitem(sys.modules, "kirim.devtools.bench", bench)
    result = CliRunner().invoke(main, ["demo", "--notifications", "5", "--seed", "7"])
    assert result.exit_code == 3
    assert calls == [(5, 3, 7)]
    out = ready.json("bench", "--notifications", "4", "--workers", "2")
    assert out == {"deliveries_per_s": 10.5, "enqueues_per_s": 8}
    assert calls[1] == (ready.database, 4, 2)
    assert "deliveries_per_s" in ready("bench").stdout


def test_bench_passes_the_workers_log_level(ready: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """--worker-log-level reaches run_bench with the CLI's log format; without it,
    run_bench is not given one (its default: warning)."""
    calls: list[dict[str, Any]] = []

    def run_bench(
        database: str | None, notifications: int, workers: int, **kw: Any
    ) -> dict[str, Any]:
        calls.append(kw)
        return {"deliveries_per_s": 1.0}

    bench = types.ModuleType("kirim.devtools.bench")
    bench.run_bench = run_bench
    monkeypatch.setitem(sys.modules, "kirim.devtools.bench", bench)
    ready.json("bench", "--worker-log-level", "info")
    ready.json("--log-format", "json", "bench", "--worker-log-level", "debug")
    ready.json("bench")
    assert calls == [
        {"worker_log": ("info", "logfmt")},
        {"worker_log": ("debug", "json")},
        {},
    ]
    assert ready("bench", "--worker-log-level", "loud").exit_code == 2


def test_the_bench_workers_log_at_the_level_asked(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A real run at info: the workers' lines are written to the null device, not to
    the terminal, and the result says the level."""
    from kirim.devtools.bench import run_bench
    from kirim.errors import ConfigError

    url = f"sqlite:///{tmp_path / 'b.db'}"
    quiet = run_bench(url, 40, 1)
    loud = run_bench(url, 40, 1, worker_log=("info", "json"))
    assert (quiet["worker_log_level"], loud["worker_log_level"]) == ("warning", "info")
    assert quiet["delivered"] == loud["delivered"] == 40
    err = capfd.readouterr().err
    assert "bench: 40 delivered" in err
    assert '"event"' not in err
    with pytest.raises(ConfigError, match="worker_log"):
        run_bench(url, 1, 1, worker_log=("loud", "logfmt"))


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["init"],
        ["send"],
        ["worker"],
        ["status"],
        ["list"],
        ["dead-letter"],
        ["dead-letter", "list"],
        ["dead-letter", "retry"],
        ["dead-letter", "cancel"],
        ["cancel"],
        ["demo"],
        ["bench"],
        ["analyze"],
    ],
)
def test_help_of_every_command(command: list[str]) -> None:
    """Every command has a --help that exits 0 and shows an example."""
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.stdout
    if command and command[0] != "analyze":
        assert "kirim " in result.stdout.split("Options:")[0]


def test_usage_error_exits_2(ready: Cli) -> None:
    """A missing required option is a usage error (exit 2)."""
    assert ready("send", "--event", "1").exit_code == 2
    assert ready("worker", "--concurrency", "0").exit_code == 2


def test_python_m_kirim_worker_stops_on_sigterm(ready: Cli) -> None:
    """python -m kirim worker stops on SIGTERM and exits 0."""
    env = {k: v for k, v in os.environ.items() if k != "KIRIM_DATABASE_URL"}
    with subprocess.Popen(
        [sys.executable, "-m", "kirim", *ready.args("worker", "--worker-id", "term")],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if "event=worker_started" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            rest = proc.stderr.read()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "event=signal_received" in rest
    assert "event=worker_stopped" in rest


def test_status_prefixes_tell_an_id_from_a_key_of_digits(ready: Cli) -> None:
    """status id:N is always the id and key:K always the key; a bare value is the key first."""
    first = ready.json(*_send("a"), "--key", "k-a")
    digits = ready.json(*_send("b"), "--key", str(first["delivery_id"]))
    named = str(first["delivery_id"])
    assert ready.json("status", named)["id"] == digits["delivery_id"]
    assert ready.json("status", f"key:{named}")["id"] == digits["delivery_id"]
    assert ready.json("status", f"id:{named}")["id"] == first["delivery_id"]
    assert ready.json("status", "key:k-a")["id"] == first["delivery_id"]
    missing = ready("status", f"key:{digits['delivery_id']}", "--json")
    assert missing.exit_code == 1
    assert "no delivery with idempotency key" in missing.stderr


@pytest.mark.parametrize("ref", ["id:", "id:k-a", "id:0", "id:-1", f"id:{2**63}"])
def test_status_with_a_bad_id_exits_2(ready: Cli, ref: str) -> None:
    """status id: followed by anything but a positive integer is a usage error."""
    result = ready("status", ref, "--json")
    assert result.exit_code == 2
    assert "an id is a positive integer" in result.stderr


def test_send_with_a_key_of_another_event_exits_2_naming_it(ready: Cli) -> None:
    """Reusing a key for another event (same payload) is refused, naming event_id."""
    assert ready.json(*_send("a"), "--key", "k-1")["created"] is True
    result = ready(*_send("b"), "--key", "k-1")
    assert result.exit_code == 2
    assert "different event_id" in result.stderr


# -- issue 11: the README tried literally (init, list, worker banner, --burst) ---------


def test_init_writes_a_commented_starter_config_and_never_overwrites_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init in an empty directory writes a commented kirim.toml with a loopback channel
    that loads, and a second init leaves an edited file as it is."""
    from kirim.config import load_config

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    first = runner.invoke(main, ["init"], catch_exceptions=False)
    assert first.exit_code == 0, first.stderr
    assert "wrote a starter configuration to kirim.toml" in first.stdout
    text = (tmp_path / "kirim.toml").read_text()
    assert text.startswith("#")
    config = load_config("kirim.toml")
    push = config.channels["push"]
    assert push.provider == "webhook"
    assert push.options["url"] == "http://127.0.0.1:8080/push"
    assert (tmp_path / "kirim.db").exists()
    (tmp_path / "kirim.toml").write_text(text + "# mine\n")
    again = runner.invoke(main, ["init"], catch_exceptions=False)
    assert again.exit_code == 0
    assert "wrote" not in again.stdout
    assert (tmp_path / "kirim.toml").read_text() == text + "# mine\n"


def test_init_writes_the_missing_config_file_it_is_given(tmp_path: Path) -> None:
    """init --config FILE writes the starter there when FILE does not exist yet."""
    config = tmp_path / "etc" / "kirim.toml"
    config.parent.mkdir()
    args = ["--config", str(config), "--database", f"sqlite:///{tmp_path / 'k.db'}", "init"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert f"wrote a starter configuration to {config}" in result.stdout
    assert "[channels.push]" in config.read_text()


def test_list_shows_the_newest_first_and_after_pages_on_to_older_ones(
    cli: Cli, database_url: str
) -> None:
    """list shows the newest deliveries first; --after the last id shown gives the older
    ones, and a page with more after it says on stderr how to get the next one (the
    last page, full or not, says nothing; both backends)."""
    ready = Cli(config=cli.config, database=database_url)
    assert ready("init").exit_code == 0
    for event in "abcde":
        ready(*_send(event))
    first = ready.json("list", "--limit", "2")
    assert [d["event_id"] for d in first] == ["e", "d"]
    table = ready("list", "--limit", "2")
    assert f"more: --after {first[-1]['id']}" in table.stderr
    second = ready.json("list", "--limit", "2", "--after", str(first[-1]["id"]))
    assert [d["event_id"] for d in second] == ["c", "b"]
    last = ready.json("list", "--limit", "2", "--after", str(second[-1]["id"]))
    assert [d["event_id"] for d in last] == ["a"]
    oldest = ready.json("list", "--limit", "2", "--oldest-first")
    assert [d["event_id"] for d in oldest] == ["a", "b"]
    # a page that is full but the last one says nothing more
    exact = ready("list", "--limit", "1", "--after", str(second[-1]["id"]))
    assert exact.exit_code == 0
    assert "more:" not in exact.stderr


def test_worker_starts_with_a_banner_naming_database_config_and_channels(
    tmp_path: Path, provider: Provider
) -> None:
    """The worker's first lines on stderr are a banner: the database, the config file,
    each channel's provider, redacted URL and in-doubt policy, lease and concurrency."""
    config = tmp_path / "kirim.toml"
    secret_url = provider.url.replace("http://", "http://user:s3cret@")
    config.write_text(
        '[worker]\nlease = 12\nconcurrency = 3\n\n[channels.push]\nprovider = "webhook"\n'
        f'url = "{secret_url}"\non_unknown = "hold"\n\n[channels.mail]\n'
        f'provider = "webhook"\nurl = "{provider.url}"\nidempotent = true\n'
    )
    cli = Cli(config=config, database=f"sqlite:///{tmp_path / 'kirim.db'}")
    assert cli("init").exit_code == 0
    result = cli("worker", "--burst", "--worker-id", "w-9")
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("kirim ")
    assert "worker w-9" in lines[0]
    banner = "\n".join(lines[: next(i for i, t in enumerate(lines) if t.startswith("ts="))])
    assert cli.database in banner
    assert str(config) in banner
    assert "lease        12s" in banner
    assert "concurrency  3 in flight" in banner
    assert "push: webhook http://user:***@127.0.0.1:" in banner
    assert "in doubt: hold" in banner
    assert "mail: webhook" in banner
    assert "resend with the same key (idempotent)" in banner
    assert "s3cret" not in result.stderr


def test_worker_banner_is_one_json_line_with_log_format_json(ready: Cli) -> None:
    """With --log-format json the banner is one worker_banner line: stderr stays JSON lines."""
    result = CliRunner().invoke(main, ["--log-format", "json", *ready.args("worker", "--burst")])
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    [banner] = [line for line in lines if line["event"] == "worker_banner"]
    assert banner["database"] == ready.database
    assert banner["config"] == str(ready.config)
    assert banner["channels"][0]["name"] == "push"
    assert banner["channels"][0]["in_doubt"] == "assume_sent"


def test_worker_burst_does_not_wait_for_send_after_and_says_so(ready: Cli) -> None:
    """--burst exits at once past a notification due later, and its --help says so."""
    assert ready(*_send("later"), "--send-after", "1h").exit_code == 0
    result = ready("worker", "--burst")
    assert result.exit_code == 0, result.stderr
    [delivery] = ready.json("list")
    assert delivery["status"] == "pending"
    help_text = " ".join(CliRunner().invoke(main, ["worker", "--help"]).stdout.split())
    assert "send_after" in help_text
    assert "does not keep it alive" in help_text


# -- issue 11: every door validates (numbers, text, payloads, read-only opening) ----------


@pytest.fixture
def any_ready(tmp_path: Path, provider: Provider, database_url: str) -> Cli:
    """A CLI after ``kirim init`` on a fresh database of each backend."""
    config = tmp_path / "kirim.toml"
    config.write_text(f'[channels.push]\nprovider = "webhook"\nurl = "{provider.url}"\n')
    cli = Cli(config=config, database=database_url)
    assert cli("init").exit_code == 0
    return cli


def _one_line_error(result: Result, code: int = 2) -> str:
    """The result's exit code is ``code`` and its stderr ends in one Error line; that line."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("payload", ['{"t": "\\ud800"}', '{"t": ["a\\u0000"]}', '{"\\udfff": 1}'])
def test_send_refuses_nul_and_lone_surrogates_in_the_payload(any_ready: Cli, payload) -> None:
    """send --payload with a lone surrogate or NUL anywhere exits 2 in one line and writes
    nothing, so list and status keep working (both backends)."""
    line = _one_line_error(any_ready.send(payload=payload))
    assert "must not contain NUL" in line or "no lone surrogates" in line
    assert any_ready.json("list") == []
    assert any_ready.send().exit_code == 0
    assert any_ready.json("status", "1")["payload"] == {"title": "hi"}


@pytest.mark.parametrize("lease", ["nan", "inf", "1e308", "-inf", "0"])
def test_worker_lease_must_be_a_finite_positive_number(ready: Cli, lease: str) -> None:
    """--lease nan, inf or 1e308 exits 2 with one line before the worker starts."""
    result = ready("worker", "--burst", "--lease", lease)
    line = _one_line_error(result)
    assert "'--lease': must be a number of seconds greater than 0 and at most 86400" in line
    assert "worker_started" not in result.stderr


@pytest.mark.parametrize(
    ("flag", "setting", "value"),
    [
        ("--lease", "lease", "nan"),
        ("--lease", "lease", "inf"),
        ("--concurrency", "concurrency", "2.5"),
        ("--concurrency", "concurrency", "0"),
        ("--concurrency", "concurrency", "99999999999999999999999"),
        ("--grace", "shutdown_grace", "-1"),
    ],
)
def test_a_flag_and_its_toml_setting_get_the_same_message(
    ready: Cli, flag: str, setting: str, value: str
) -> None:
    """A bad number gets the same reason from the worker's flag and from kirim.toml."""
    from_flag = _one_line_error(ready("worker", "--burst", flag, value))
    text = ready.config.read_text()
    ready.config.write_text(f"[worker]\n{setting} = {value}\n" + text.replace("[worker]\n", ""))
    from_toml = _one_line_error(ready("worker", "--burst"))
    reason = from_toml.split(f"worker.{setting} ", 1)[1]
    assert reason.startswith("must be ")
    assert from_flag.split(f"'{flag}': ", 1)[1] == reason


@pytest.mark.parametrize(
    "setting",
    [
        "concurrency = 2.5",
        "batch_size = 0",
        "batch_size = -1",
        "poll_interval = 0",
        "backoff_base = -1",
        "backoff_max = -1",
        "shutdown_grace = -1",
        "request_timeout = 0",
        "send_margin = 99",
        "lease = nan",
    ],
)
def test_worker_refuses_bad_numbers_in_kirim_toml(ready: Cli, setting: str) -> None:
    """A [worker] number outside its type or range stops `kirim worker` with one line."""
    ready.config.write_text(f"[worker]\n{setting}\n" + ready.config.read_text().split("\n", 2)[2])
    line = _one_line_error(ready("worker", "--burst"))
    assert f"worker.{setting.split(' ')[0]} must be" in line


def test_worker_accepts_the_documented_stats_interval(ready: Cli) -> None:
    """[worker] stats_interval, documented with the metrics, is accepted by the worker."""
    text = ready.config.read_text()
    ready.config.write_text(text.replace("[worker]\n", "[worker]\nstats_interval = 5\n"))
    result = ready("worker", "--burst")
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--key", "k" * 100_000), "'--key': must be at most 255 characters, not 100000"),
        (("--key", "clé"), "'--key': must be printable ASCII"),
        (("--key", "k\x00"), "'--key': must not contain NUL characters"),
        (("--event", "e\ud800"), "'--event': must be valid Unicode text"),
        (("--recipient", "r\x00"), "'--recipient': must not contain NUL"),
        (("--channel", "push\x00"), "'--channel': must not contain NUL"),
    ],
)
def test_send_refuses_bad_ids_and_keys(ready: Cli, args: tuple[str, str], message: str) -> None:
    """A key over 255 characters or outside printable ASCII, and NUL or lone surrogates in
    an id, exit 2 with one line naming the flag, and write nothing."""
    base = {"--event": "e", "--recipient": "r", "--channel": "push", "--payload": "{}"}
    base.update([args])
    line = _one_line_error(ready("send", *(x for kv in base.items() for x in kv)))
    assert message in line
    assert ready.json("list") == []


@pytest.mark.parametrize("when", ["99999999999d", "9999999d", "1" + "0" * 400 + "s"])
def test_send_after_too_far_is_one_line(ready: Cli, when: str) -> None:
    """--send-after beyond the year 9999 exits 2 in one line (no OverflowError) and writes
    nothing that would crash `status` later."""
    line = _one_line_error(ready.send("--send-after", when))
    assert "send_after must fall between 1970-01-01 and 9999-12-31" in line
    assert ready.json("list") == []


@pytest.mark.parametrize(
    ("ref", "code", "message"),
    [
        ("99999999999999999999999", 1, "no delivery with id or idempotency key"),
        ("9" * 5000, 1, "no delivery with id or idempotency key"),
        ("id:99999999999999999999999", 2, "an id is a positive integer"),
    ],
)
def test_status_of_huge_numbers_is_one_line(
    any_ready: Cli, ref: str, code: int, message: str
) -> None:
    """status of an id past any integer column is a one-line answer on both backends."""
    assert message in _one_line_error(any_ready("status", ref), code)


def test_max_payload_bytes_inf_is_a_config_error(ready: Cli) -> None:
    """max_payload_bytes = inf in kirim.toml exits 2 in one line."""
    ready.config.write_text("max_payload_bytes = inf\n" + ready.config.read_text())
    line = _one_line_error(ready.send())
    assert "max_payload_bytes must be an integer from 1 to" in line


@pytest.mark.parametrize("version", ["abc", "", "3.5", "-1", "99999999999999999999999"])
def test_a_corrupt_schema_version_is_one_line(ready: Cli, version: str) -> None:
    """A schema version in kirim_meta that is not a number: status and init exit 2 in one
    line, doctor reports it (exit 1), none with a traceback."""
    path = ready.database.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE kirim_meta SET value = ? WHERE key = 'schema_version'", (version,))
    db.close()
    for command in (("status", "1"), ("init",), _send("e")):
        assert "schema version in kirim_meta" in _one_line_error(ready(*command))
    doctor = ready("doctor")
    assert doctor.exit_code == 1, doctor.output
    assert "Traceback" not in doctor.output


FACTORIES = """
from kirim.providers.base import Sent

class Minimal:
    idempotent = False
    async def send(self, message):
        return Sent(provider_message_id="m-1")

def minimal(**options):
    return Minimal()

def not_a_provider(**options):
    return {"url": "http://x"}
"""


def _factory_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factory: str) -> Cli:
    (tmp_path / "cli_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "factory.toml"
    config.write_text(f'[channels.push]\nprovider = "cli_factories:{factory}"\n')
    cli = Cli(config=config, database=f"sqlite:///{tmp_path / 'factory.db'}")
    assert cli("init").exit_code == 0
    assert cli.send().exit_code == 0
    return cli


def test_worker_with_a_minimal_custom_provider_delivers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider factory as the README describes it (idempotent and send, no aclose)
    delivers with `kirim worker --burst`, which exits 0."""
    cli = _factory_cli(tmp_path, monkeypatch, "minimal")
    result = cli("worker", "--burst")
    assert result.exit_code == 0, result.output
    assert cli.json("status", "1")["status"] == "sent"


def test_worker_with_a_non_provider_factory_fails_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factory that returns a non-provider stops the worker at start with one line
    (exit 2), before any delivery is claimed."""
    cli = _factory_cli(tmp_path, monkeypatch, "not_a_provider")
    line = _one_line_error(cli("worker", "--burst"))
    assert "channels.push.provider 'cli_factories:not_a_provider' returned dict" in line
    delivery = cli.json("status", "1")
    assert delivery["status"] == "pending"
    assert delivery["attempts"] == []


@pytest.mark.parametrize("command", [("status", "1"), ("list",), ("dead-letter", "list")])
def test_read_only_commands_never_create_a_database(cli: Cli, command: tuple[str, ...]) -> None:
    """status, list and dead-letter list on a missing SQLite file exit 2 saying it does not
    exist, and leave no file behind."""
    path = Path(cli.database.removeprefix("sqlite:///"))
    line = _one_line_error(cli(*command))
    assert f"no SQLite database at {str(path)!r}: the file does not exist" in line
    assert not path.exists()


@contextlib.contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """``chattr +i`` on ``path`` (read-only even for root), undone afterwards; skips the
    test where the file system or the user cannot."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {done.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_read_only_commands_work_on_a_read_only_database(
    tmp_path: Path, provider: Provider
) -> None:
    """doctor ("never writes"), status and list work on a database in a read-only
    directory, where no -wal or -shm file can be created."""
    folder = tmp_path / "ro"
    folder.mkdir()
    config = tmp_path / "kirim.toml"
    config.write_text(f'[channels.push]\nprovider = "webhook"\nurl = "{provider.url}"\n')
    cli = Cli(config=config, database=f"sqlite:///{folder / 'kirim.db'}")
    assert cli("init").exit_code == 0
    assert cli.send().exit_code == 0
    assert sorted(p.name for p in folder.iterdir()) == ["kirim.db"]
    with _immutable(folder):
        doctor = cli("doctor")
        assert doctor.exit_code == 0, doctor.output
        assert "0 problems" in doctor.stdout
        assert cli.json("status", "1")["status"] == "pending"
        assert len(cli.json("list")) == 1


def test_status_finds_a_delivery_by_its_event_id(ready: Cli) -> None:
    """A bare value that is neither a key nor an id is looked up as an event id (as the
    dashboard's search does), and event:E names an event id only; an event with several
    deliveries shows each (a JSON list with --json)."""
    ready.send()  # event 48291, recipient 1007
    one = ready("status", "48291")
    assert one.exit_code == 0, one.output
    assert "1007" in one.stdout
    assert ready.json("status", "event:48291")["event_id"] == "48291"
    base = ("send", "--event", "48291", "--recipient", "1008", "--channel", "push")
    assert ready(*base, "--payload", '{"title": "hi"}').exit_code == 0
    both = ready.json("status", "event:48291")
    assert sorted(d["recipient"] for d in both) == ["1007", "1008"]
    text = ready("status", "48291")
    assert text.exit_code == 0, text.output
    assert "1007" in text.stdout
    assert "1008" in text.stdout
    missing = ready("status", "event:nope")
    assert missing.exit_code == 1
    assert "no delivery of event 'nope'" in missing.stderr
