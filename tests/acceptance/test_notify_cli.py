"""The notification layer through the real commands: types read from kirim.toml,
preferences set with `kirim prefs`, a `kirim worker` process that checks them again
at claim and seals a digest, against a loopback receiver."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_processes import worker

from kirim import SyncKirim, load_config
from kirim.devtools.receiver import Receiver
from kirim.model import DeliveryStatus

pytestmark = pytest.mark.slow

TYPES = """
[types.order_shipped.templates.push]
title = "Order {{ order_id }} has shipped"

[types.likes]
digest = { window = "1s", key = "recipient" }
[types.likes.templates.push]
title = "{{ count }} new likes: {% for e in events %}{{ e.who }} {% endfor %}"
"""


def write_config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'database = "sqlite:///{tmp_path / "kirim.db"}"\n'
        "[worker]\nlease = 5\npoll_interval = 0.05\n"
        f'[channels.push]\nprovider = "webhook"\nurl = "{url}"\ntimeout = 5\n' + TYPES
    )
    return config


def kirim(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "kirim", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_types_preferences_and_a_digest_through_kirim_worker(tmp_path: Path) -> None:
    with Receiver(seed=3) as receiver:
        config = write_config(tmp_path, receiver.url)
        kirim(config, "init")
        kirim(config, "prefs", "set", "u2", "--opt-out")
        with SyncKirim(load_config(config)) as app:
            sent = app.notify_event(
                "order_shipped", ["u1", "u2", "u3"], {"order_id": "48291"}, event_id="o-1"
            )
            by = {d.recipient_id: d for d in sent.deliveries}
            assert by["u2"].status == DeliveryStatus.SUPPRESSED  # at enqueue
            assert by["u3"].status == DeliveryStatus.PENDING
            for i, who in enumerate(["ana", "bo", "cy"]):
                app.notify_event("likes", ["u1"], {"who": who}, event_id=f"like-{i}")
        # a preference changed after the enqueue: the worker's claim finds it
        kirim(config, "prefs", "set", "u3", "--channel", "order_shipped:push=off")
        with SyncKirim(load_config(config)) as app:
            digests = [r for r in app.records(limit=50).records if r.delivery.type == "likes"]
            due = max(r.job.run_at for r in digests if r.job is not None)
        # the digests are due when their one-second window ends: wait for that time
        time.sleep(max(0.0, due - time.time()) + 0.05)
        proc = worker(config, "--burst")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        with SyncKirim(load_config(config)) as app:
            records = {
                (r.delivery.type, r.delivery.recipient_id, r.delivery.id): r
                for r in app.records(limit=50).records
            }
        orders = {rid: r.delivery for (t, rid, _), r in records.items() if t == "order_shipped"}
        assert orders["u1"].status == DeliveryStatus.SENT
        assert (orders["u2"].status, orders["u2"].reason) == ("suppressed", "opted_out")
        assert (orders["u3"].status, orders["u3"].reason) == ("suppressed", "channel_opted_out")
        assert orders["u3"].payload["title"] == "Order 48291 has shipped"
        likes = [r.delivery for (t, _, _), r in records.items() if t == "likes"]
        assert {d.status for d in likes} == {DeliveryStatus.SENT}
        # every event in exactly one digest, none twice (two windows if the events
        # straddled a second)
        events = [e for d in likes for e in d.payload["events"]]
        assert sorted(events) == ["like-0", "like-1", "like-2"]
        assert sum(d.payload["count"] for d in likes) == 3
        assert receiver.delivered() == 1 + len(likes)
        assert receiver.duplicates() == 0
    shown = kirim(config, "status", orders["u3"].idempotency_key)
    assert "channel_opted_out" in shown.stdout
