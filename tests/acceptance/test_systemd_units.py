"""The systemd units of ops/systemd/: valid, and their command stops gracefully.

``systemd-analyze verify`` checks each unit where it is installed (with ExecStart's
``/opt/kirim/bin/kirim`` pointed at this environment's kirim, the one change); the
units are parsed here in any case. Then each unit's ExecStart runs as written (the
same substitution, the config and port made local) and is stopped with the unit's
KillSignal: it must exit 0 (a clean stop, which ``Restart=on-failure`` leaves
alone) before TimeoutStopSec, when systemd would SIGKILL it.
"""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from kirim.cli import main
from kirim.worker import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "ops" / "systemd").glob("*.service"))
KIRIM = Path(sys.executable).parent / "kirim"
INSTALLED = "/opt/kirim/bin/kirim"

pytestmark = pytest.mark.slow


def unit(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


def seconds(value: str) -> float:
    """A systemd time span of seconds (``30``, ``30s``, ``1min``)."""
    if value.endswith("min"):
        return float(value[:-3]) * 60
    return float(value.removesuffix("s"))


def test_there_is_a_unit_for_the_worker_and_the_server() -> None:
    """ops/systemd has kirim-worker.service and kirim-serve.service."""
    assert [u.name for u in UNITS] == ["kirim-serve.service", "kirim-worker.service"]


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_a_unit_stops_gracefully_and_does_not_restart_a_configuration_error(path: Path) -> None:
    """SIGTERM to the main process only, SIGKILL not before the worker's grace is over;
    restarted on a crash, not on exit 2; its command line is one kirim accepts."""
    service = unit(path)["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"
    assert seconds(service["TimeoutStopSec"]) > WorkerSettings().shutdown_grace + 5
    assert service["Restart"] == "on-failure"
    assert "2" in service["RestartPreventExitStatus"].split()
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == INSTALLED
    assert argv[1:3] == ["--config", "/etc/kirim/kirim.toml"]
    name, rest = argv[3], argv[4:]
    command = main.get_command(click.Context(main), name)
    assert command is not None, argv
    command.make_context(name, rest)  # raises on a flag or value the command refuses
    assert unit(path)["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify_accepts_the_unit(path: Path, tmp_path: Path) -> None:
    """``systemd-analyze verify`` finds nothing wrong with the unit."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed: the units are only parsed")
    copy = tmp_path / path.name
    copy.write_text(path.read_text().replace(INSTALLED, str(KIRIM)))
    done = subprocess.run(
        [tool, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.strip() == "", done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_the_units_command_exits_0_on_its_kill_signal(path: Path, tmp_path: Path) -> None:
    """The unit's ExecStart, started as written and sent its KillSignal once it is
    up, exits 0 before TimeoutStopSec."""
    service = unit(path)["Service"]
    config = tmp_path / "kirim.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIRIM_")}
    env["KIRIM_DATABASE_URL"] = f"sqlite:///{tmp_path / 'kirim.db'}"
    init = subprocess.run(
        [str(KIRIM), "--config", str(config), "init"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    argv = [
        str(KIRIM) if a == INSTALLED else str(config) if a == "/etc/kirim/kirim.toml" else a
        for a in shlex.split(service["ExecStart"])
    ]
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(_free_port())
    ready = "serving" if "serve" in argv else "worker_started"
    with subprocess.Popen(
        argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    ) as process:
        assert process.stderr is not None
        seen: list[str] = []
        deadline = time.monotonic() + 60
        for line in process.stderr:
            seen.append(line)
            if ready in line or time.monotonic() > deadline:
                break
        assert any(ready in line for line in seen), "".join(seen)
        process.send_signal(getattr(signal, service["KillSignal"]))
        try:
            code = process.wait(timeout=seconds(service["TimeoutStopSec"]))
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"{path.name}: still running at TimeoutStopSec: systemd would SIGKILL it")
        rest = process.stderr.read()
    assert code == 0, "".join(seen) + rest
