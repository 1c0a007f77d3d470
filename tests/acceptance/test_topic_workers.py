"""A topic's fan-out through real `kirim worker` processes: two burst workers expand one
event to 1,200 subscribers (batches of 500) against a loopback receiver, and every
subscriber as of the event gets exactly one message."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_processes import worker

from kirim import SyncKirim, load_config
from kirim.devtools.receiver import Receiver
from kirim.model import DeliveryStatus

pytestmark = pytest.mark.slow

SUBSCRIBERS = 1200


def write_config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'database = "sqlite:///{tmp_path / "kirim.db"}"\n'
        "[worker]\nlease = 5\npoll_interval = 0.05\nconcurrency = 20\n"
        f'[channels.push]\nprovider = "webhook"\nurl = "{url}"\ntimeout = 5\n'
        '[types.release_out.templates.push]\ntitle = "{{ version }} is out"\n'
    )
    return config


def test_two_burst_workers_fan_a_topic_event_out_once(tmp_path: Path) -> None:
    """Each subscriber as of the event gets one message; one who subscribed after it
    gets none; the receiver counts no duplicate."""
    with Receiver(seed=5) as receiver:
        config = write_config(tmp_path, receiver.url)
        with SyncKirim(load_config(config)).open(migrate=True) as app:
            for i in range(SUBSCRIBERS):
                app.subscribe("project:42", f"u{i:04d}")
            app.notify_topic("release_out", "project:42", {"version": "0.3"}, event_id="rel")
            app.subscribe("project:42", "late")
        procs = [worker(config, "--burst") for _ in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
        with SyncKirim(load_config(config)) as app:
            info = app.topic_info("project:42")
            records = []
            cursor = None
            while True:
                page = app.records(limit=500, cursor=cursor)
                records += page.records
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        assert info is not None
        assert [(e.status, e.recipients) for e in info.recent] == [("done", SUBSCRIBERS)]
        who = sorted(r.delivery.recipient for r in records)
        assert who == [f"u{i:04d}" for i in range(SUBSCRIBERS)]
        assert {r.delivery.status for r in records} == {DeliveryStatus.SENT}
        assert receiver.delivered() == SUBSCRIBERS
        assert receiver.duplicates() == 0
