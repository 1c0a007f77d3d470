"""A push channel end to end through the CLI and ``kirim worker``: a recipient's two
devices added with ``kirim addresses``, an event fanned out to both, the worker
sending to the loopback APNs (HTTP/2, TLS, the provider token checked), one token
answered 410 Unregistered and retired, ``kirim status`` naming the retired address,
and no credential in anything the processes printed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kirim.devtools.services.apns import ApnsFake

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

PHONE, OLD_TABLET = "a1" * 32, "b2" * 32


@pytest.fixture
def apns(tmp_path: Path) -> Iterator[ApnsFake]:
    with ApnsFake(tmp_path) as fake:
        yield fake


def kirim(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kirim", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_event_reaches_each_device_and_a_dead_token_is_retired(
    tmp_path: Path, apns: ApnsFake
) -> None:
    """Two devices, one dead: the living one shows the push once, the dead one's
    delivery fails and its token is retired (kirim status says so); the next event
    goes to the living device only."""
    key = tmp_path / "AuthKey.p8"
    key.write_text(apns.private_key)
    config = tmp_path / "kirim.toml"
    config.write_text(
        f'database = "sqlite:///{tmp_path / "k.db"}"\n'
        "[worker]\nlease = 10\npoll_interval = 0.1\n"
        f'[channels.ios]\nprovider = "apns"\nteam_id = "{apns.team_id}"\n'
        f'key_id = "{apns.key_id}"\nprivate_key_file = "{key}"\ntopic = "{apns.topic}"\n'
        f'url = "{apns.url}"\nca_file = "{apns.ca_file}"\ntimeout = 5\n'
        '[types.shipped.templates.ios]\ntitle = "Order {{ n }}"\nbody = "on its way"\n'
        'apns = \'{"aps": {"sound": "default"}}\'\n'
    )
    outputs = [kirim(config, "migrate")]
    for token in (PHONE, OLD_TABLET):
        outputs.append(kirim(config, "addresses", "add", "u-1", "ios", token))
    apns.dead.add(OLD_TABLET)
    event = kirim(
        config,
        "event",
        "shipped",
        "--event",
        "ev-1",
        "--recipient",
        "u-1",
        "--data",
        '{"n": 7}',
        "--json",
    )
    outputs += [event, kirim(config, "worker", "--burst")]
    assert all(o.returncode == 0 for o in outputs), [o.stderr for o in outputs]
    made = {d["address"]: d for d in json.loads(event.stdout)["deliveries"]}
    assert set(made) == {PHONE, OLD_TABLET}
    assert list(apns.screens) == [PHONE]
    assert sum(apns._copies.values()) == 1
    assert apns.shown[0][1] == {"title": "Order 7", "body": "on its way"}
    dead = kirim(config, "status", f"id:{made[OLD_TABLET]['delivery_id']}")
    assert "address retired" in dead.stdout, dead.stdout
    assert "Unregistered" in dead.stdout
    listed = json.loads(kirim(config, "addresses", "list", "u-1", "--json").stdout)
    assert {a["address"]: a["retired"] for a in listed["addresses"]} == {
        PHONE: False,
        OLD_TABLET: True,
    }
    again = kirim(
        config,
        "event",
        "shipped",
        "--event",
        "ev-2",
        "--recipient",
        "u-1",
        "--data",
        '{"n": 8}',
        "--json",
    )
    assert [d["address"] for d in json.loads(again.stdout)["deliveries"]] == [PHONE]
    outputs += [dead, again, kirim(config, "worker", "--burst")]
    printed = "".join(o.stdout + o.stderr for o in outputs)
    body = apns.private_key.strip().splitlines()[1]
    assert body not in printed
    assert not any(t in printed for t in apns.tokens_seen)  # the provider tokens (JWTs)
