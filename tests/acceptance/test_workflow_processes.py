"""The escalation through real `kirim worker` processes (docs/workflows.md): an inbox
message now; after the delay, still unread, one email; read meanwhile, none; the
order delivered meanwhile (an event of another type naming it in `cancel_on`), the
run cancelled and no email. Two workers race for every run and every delivery."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_processes import worker

from kirim import SyncKirim, load_config
from kirim.devtools.receiver import Receiver

pytestmark = pytest.mark.slow

DELAY = 3.0
TYPES = f"""
[channels.inbox]
provider = "inbox"

[types.escalate]
channels = ["inbox", "email"]
cancel_on = ["order_done"]
cancel_key = "order_id"
steps = [
  {{ send = "inbox" }},
  {{ delay = "{DELAY}s" }},
  {{ branch = "unread", step = "inbox" }},
  {{ send = "email" }},
]
[types.escalate.templates.inbox]
title = "Order {{{{ order_id }}}} waits for you"
[types.escalate.templates.email]
subject = "Order {{{{ order_id }}}} waits for you"
body = "Open it in the app."

[types.order_done.templates.inbox]
title = "Order {{{{ order_id }}}} was delivered"
"""


def run_json(config: Path, run_id: int) -> dict[str, object]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kirim",
            "--config",
            str(config),
            "run",
            "show",
            str(run_id),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_escalation_through_kirim_worker_processes(tmp_path: Path) -> None:
    with Receiver(seed=5) as receiver:
        config = tmp_path / "kirim.toml"
        config.write_text(
            f'database = "sqlite:///{tmp_path / "kirim.db"}"\n'
            "[worker]\nlease = 5\npoll_interval = 0.05\n"
            f'[channels.email]\nprovider = "webhook"\nurl = "{receiver.url}"\ntimeout = 5\n' + TYPES
        )
        subprocess.run([sys.executable, "-m", "kirim", "--config", str(config), "init"], check=True)
        runs = {}
        with SyncKirim(load_config(config)) as app:
            for user, order in (("u1", "o1"), ("u2", "o2"), ("u3", "o3")):
                done = app.notify_event("escalate", [user], {"order_id": order}, event_id=order)
                runs[user] = done.runs[0].run_id
        workers = [worker(config), worker(config)]
        try:
            with SyncKirim(load_config(config)) as app:
                deadline = time.time() + 30
                while not all(app.feed(u).items for u in runs) and time.time() < deadline:
                    time.sleep(0.05)
                (item,) = app.feed("u2").items
                app.feed_action("u2", item.id, "read")  # u2 read it within the delay
                app.notify_event("order_done", ["u3"], {"order_id": "o3"}, event_id="d3")
            deadline = time.time() + 30 + DELAY
            shown = {}
            while time.time() < deadline:
                shown = {u: run_json(config, r) for u, r in runs.items()}
                if all(s["status"] != "waiting" for s in shown.values()):
                    break
                time.sleep(0.2)
        finally:
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            for proc in workers:
                _, err = proc.communicate(timeout=30)
                assert proc.returncode == 0, err.decode()
        states = {u: [step["state"] for step in s["steps"]] for u, s in shown.items()}  # type: ignore[union-attr]
        assert states == {
            "u1": ["sent", "waited", "then", "sent"],
            "u2": ["sent", "waited", "else", "skipped"],
            "u3": ["sent", "waited", "canceled", "canceled"],
        }
        assert [s["status"] for s in shown.values()] == ["done", "done", "canceled"]
        assert receiver.delivered() == 1  # u1's email, once
        assert receiver.duplicates() == 0
