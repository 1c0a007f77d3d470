"""Secrets never leave kirim: the SMTP password, the webhook signing secret and the
token in an Apprise URL appear in no log line (debug level, both formats), no error
recorded for a failed attempt, no configuration error, no ``kirim status`` or
``kirim list`` output and no dashboard page, while real channels deliver to servers
on 127.0.0.1 and fail."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from kirim.config import load_config, parse_config
from kirim.engine import Kirim
from kirim.errors import ConfigError
from kirim.http import create_app
from kirim.keys import default_key
from kirim.simulate.smtp_receiver import SmtpReceiver

PASSWORD = "smtp-pass-9d41be07"
SECRET_KEY = b"signing-key-bytes-0f6a2c93e5d147"
SECRET = "whsec_" + base64.b64encode(SECRET_KEY).decode()
TOKEN = "apprise-token-77c3e1a0"
SECRETS = {
    "SMTP password": PASSWORD,
    "webhook secret": SECRET,
    "webhook secret's key": base64.b64encode(SECRET_KEY).decode(),
    "Apprise token": TOKEN,
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture
def http() -> Iterator[int]:
    """An HTTP server: /ok answers 200, anything else 500 (echoing nothing back)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200 if self.path.startswith("/ok") else 500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def config_text(http_port: int, smtp_port: int, database: str) -> str:
    smtp = (
        'provider = "smtp"\nhost = "127.0.0.1"\nport = {port}\nsecurity = "none"\n'
        'username = "shop"\npassword = "{password}"\nfrom = "Shop <shop@example.com>"\n'
        "timeout = 5\n"
    )
    return (
        f'database = "{database}"\n'
        "[worker]\nlease = 10\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.01\n"
        "poll_interval = 0.05\n"
        "[channels.email]\n" + smtp.format(port=smtp_port, password=PASSWORD) + "\n"
        "[channels.email_bad]\n"  # a refused login: an error to record
         + smtp.format(port=smtp_port, password=PASSWORD + "-wrong") + "\n[channels.hook]\n"
        f'url = "http://127.0.0.1:{http_port}/ok"\nsecret = ["{SECRET}", "{SECRET}"]\n'
        "[channels.hook_bad]\n"
        f'url = "http://127.0.0.1:{http_port}/fail"\nsecret = "{SECRET}"\n'
        "[channels.chat]\n"
        f'provider = "apprise"\nurls = ["json://user:{TOKEN}@127.0.0.1:{http_port}/ok/{TOKEN}"]\n'
        "[channels.chat_bad]\n"
        f'provider = "apprise"\nurls = ["json://user:{TOKEN}@127.0.0.1:{http_port}/fail/{TOKEN}"]\n'
    )


def kirim(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KIRIM_DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "kirim", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def assert_clean(where: str, text: str) -> None:
    for name, secret in SECRETS.items():
        assert secret not in text, f"the {name} appears in {where}"


CHANNELS = {
    "email": {"subject": "Your order shipped", "text": "On its way."},
    "email_bad": {"subject": "Your order shipped", "text": "On its way."},
    "hook": {"title": "shipped"},
    "hook_bad": {"title": "shipped"},
    "chat": {"body": "shipped"},
    "chat_bad": {"body": "shipped"},
}


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_no_secret_in_logs_errors_or_status(http, tmp_path: Path, log_format: str) -> None:
    """Deliveries that succeed and fail on every provider; every byte kirim prints
    (worker at debug level, status and list as JSON and as text) is free of them."""
    config = tmp_path / "kirim.toml"
    with SmtpReceiver(auth=("shop", PASSWORD)) as box:
        config.write_text(config_text(http, box.port, f"sqlite:///{tmp_path / 'kirim.db'}"))
        outputs = [kirim(config, "init")]
        for channel, payload in CHANNELS.items():
            outputs.append(
                kirim(
                    config,
                    "send",
                    "--event",
                    "order-1",
                    "--recipient",
                    "bob@example.test",
                    "--channel",
                    channel,
                    "--payload",
                    json.dumps(payload),
                )
            )
        worker = kirim(
            config, "--log-format", log_format, "--log-level", "debug", "worker", "--burst"
        )
        outputs.append(worker)
    assert worker.returncode == 0, worker.stderr
    assert len(box.messages) == 1  # email delivered; email_bad refused at AUTH
    for channel in CHANNELS:
        key = default_key("order-1", "bob@example.test", channel)
        outputs += [kirim(config, "status", f"key:{key}", "--json")]
        outputs += [kirim(config, "status", f"key:{key}")]
    outputs += [kirim(config, "list", "--json"), kirim(config, "list")]
    for done in outputs:
        assert done.returncode == 0, (done.args, done.stderr)
        assert_clean(f"`{' '.join(done.args[3:])}`", done.stdout + done.stderr)
    # The failures were recorded, with their reasons (and nothing else):
    statuses = {
        channel: json.loads(
            kirim(
                config,
                "status",
                f"key:{default_key('order-1', 'bob@example.test', channel)}",
                "--json",
            ).stdout
        )
        for channel in CHANNELS
    }
    errors = json.dumps(statuses)
    assert "535" in errors  # email_bad: the refused login
    assert "HTTP 500" in errors  # hook_bad
    assert "apprise" in errors  # chat_bad
    assert "worker_started" in worker.stderr  # the log is there, and clean
    pages = asyncio.run(dashboard_pages(config, len(CHANNELS)))
    assert any("535" in page for page in pages)  # the refusal is on its page
    for page in pages:
        assert_clean("the dashboard", page)


async def dashboard_pages(config: Path, deliveries: int) -> list[str]:
    """The dashboard's overview and every notification's page."""
    app = Kirim(load_config(config))
    await app.open()
    try:
        transport = httpx.ASGITransport(app=create_app(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            paths = ["/"] + [f"/dashboard/notifications/{i}" for i in range(1, deliveries + 1)]
            responses = [await client.get(path) for path in paths]
    finally:
        await app.close()
    assert [r.status_code for r in responses] == [200] * len(paths)
    return [r.text for r in responses]


def test_no_secret_in_config_reprs_or_errors(tmp_path: Path) -> None:
    """A loaded config's repr and the errors of bad channels never repeat a secret."""
    config = tmp_path / "kirim.toml"
    config.write_text(config_text(9, 9, f"sqlite:///{tmp_path / 'kirim.db'}"))
    loaded = load_config(config)
    assert_clean("repr(config)", repr(loaded))
    for spec in loaded.channels.values():
        assert_clean("repr(provider)", repr(spec.build().provider))
    bad_specs = [
        {"url": "http://127.0.0.1:9/x", "secret": f"whsec{TOKEN}"},
        {"url": "http://127.0.0.1:9/x", "secret": f"whsec_{TOKEN}!!"},
        {"url": "http://127.0.0.1:9/x", "token": f"{TOKEN}…"},
        {"provider": "apprise", "urls": [f"nosuch://{TOKEN}@host/{TOKEN}"]},
        {"provider": "smtp", "host": "h", "from": "a@b.c", "password": PASSWORD},
        {"provider": "smtp", "host": "h", "from": f"{PASSWORD}", "username": "u"},
    ]
    for spec in bad_specs:
        with pytest.raises(ConfigError) as caught:
            parse_config({"channels": {"c": spec}}).channels["c"].build()
        assert_clean(f"the error of {sorted(spec)}", str(caught.value))


CALLBACK_TOKEN = "callback-token-4e2b9c81d07a"
CALLBACK_SECRETS = {"callback secret": SECRET, "callback token": CALLBACK_TOKEN, **SECRETS}


def test_no_callback_secret_in_logs_answers_or_errors(tmp_path: Path) -> None:
    """Delivery callbacks verified by a channel's callback_secret and callback_token,
    good and bad, logged at debug level: no line, answer, repr or config error holds
    either."""
    import io

    from standardwebhooks import Webhook

    from kirim.observe.logging import configure

    out = io.StringIO()
    configure(fmt="json", level="debug", stream=out)
    database = f"sqlite:///{tmp_path / 'kirim.db'}"
    spec = {
        "database": database,
        "channels": {
            "hook": {"url": "http://127.0.0.1:9/x", "callback_secret": [SECRET, SECRET]},
            "sms": {"url": "http://127.0.0.1:9/x", "callback_token": CALLBACK_TOKEN},
        },
    }
    config = parse_config(spec)
    texts = [repr(config), repr(config.channels["hook"].build())]

    async def run() -> list[str]:
        app = Kirim(config)
        await app.open(migrate=True)
        try:
            transport = httpx.ASGITransport(app=create_app(app))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                raw = json.dumps({"message_id": "m-1", "status": "delivered"})
                from datetime import UTC, datetime

                now = datetime.now(UTC)
                good = {
                    "webhook-id": "msg_1",
                    "webhook-timestamp": str(int(now.timestamp())),
                    "webhook-signature": Webhook(SECRET).sign("msg_1", now, raw),
                    "content-type": "application/json",
                }
                answers = [
                    await client.post("/v1/callbacks/hook", content=raw, headers=good),
                    await client.post("/v1/callbacks/hook", content=raw + " ", headers=good),
                    await client.post(
                        "/v1/callbacks/sms",
                        content=raw,
                        headers={
                            "authorization": f"Bearer {CALLBACK_TOKEN}",
                            "content-type": "application/json",
                        },
                    ),
                    await client.post(
                        "/v1/callbacks/sms",
                        content=raw,
                        headers={
                            "authorization": f"Bearer {CALLBACK_TOKEN}x",
                            "content-type": "application/json",
                        },
                    ),
                ]
        finally:
            await app.close()
        assert [a.status_code for a in answers] == [202, 401, 202, 401]
        return [a.text + str(a.headers) for a in answers]

    texts += asyncio.run(run())
    configure(level="warning")
    texts.append(out.getvalue())
    assert "callback_unknown" in out.getvalue()
    assert "callback_refused" in out.getvalue()
    for bad in (
        {"callback_secret": f"whsec_{CALLBACK_TOKEN}!!"},
        {"callback_secret": f"whsec{CALLBACK_TOKEN}"},
        {"callback_token": f"{CALLBACK_TOKEN} {CALLBACK_TOKEN}"},
        {"callback_token": CALLBACK_TOKEN, "callback_secret": SECRET},
    ):
        with pytest.raises(ConfigError) as caught:
            parse_config({"channels": {"c": {"url": "http://127.0.0.1:9/x", **bad}}})
        texts.append(str(caught.value))
    for text in texts:
        for name, secret in CALLBACK_SECRETS.items():
            assert secret not in text, f"the {name} appears in {text[:200]}"
