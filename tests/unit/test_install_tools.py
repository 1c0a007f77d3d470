"""tests/install_tools.sh, what `make test` installs, run under a stand-in root folder.

A stand-in ``apt-get`` on PATH does what Debian's packages do to a machine: while
installing it runs the policy-rc.d the script provides (recording whether a
service start would have been allowed), enables a unit and an init script by
links, and puts a chromium in place; ``apt-get download`` builds a real .deb (with
``dpkg-deb``) holding a promtool. Nothing on this machine is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "install_tools.sh"

FAKE_APT = r"""#!/bin/sh
echo "$*" >> "$KIRIM_TOOLS_ROOT/apt.calls"
case " $* " in
  *" install "*)
    policy="$KIRIM_TOOLS_ROOT/usr/sbin/policy-rc.d"
    calls="$KIRIM_TOOLS_ROOT/apt.calls"
    if [ -x "$policy" ]; then "$policy" prometheus start; echo "policy $?" >> "$calls"
    else echo "policy none" >> "$calls"; fi
    mkdir -p "$KIRIM_TOOLS_ROOT/etc/systemd/system/multi-user.target.wants" \
      "$KIRIM_TOOLS_ROOT/etc/rc2.d" "$KIRIM_TOOLS_ROOT/usr/bin"
    ln -sf /lib/systemd/system/avahi-daemon.service \
      "$KIRIM_TOOLS_ROOT/etc/systemd/system/multi-user.target.wants/avahi-daemon.service"
    ln -sf ../init.d/avahi-daemon "$KIRIM_TOOLS_ROOT/etc/rc2.d/S01avahi-daemon"
    for last; do :; done  # the package asked for
    case "$last" in
      pgbouncer) dir=usr/sbin;;
      *) dir=usr/bin;;
    esac
    mkdir -p "$KIRIM_TOOLS_ROOT/$dir"
    printf '#!/bin/sh\necho %s\n' "$last" > "$KIRIM_TOOLS_ROOT/$dir/$last"
    chmod +x "$KIRIM_TOOLS_ROOT/$dir/$last";;
  *" download "*)
    pkg=$(mktemp -d)
    mkdir -p "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/share/prometheus"
    printf 'Package: prometheus\nVersion: 9.9\nArchitecture: all\n' > "$pkg/DEBIAN/control"
    printf 'Maintainer: t <t@t>\nDescription: t\n' >> "$pkg/DEBIAN/control"
    printf '#!/bin/sh\necho promtool 9.9\n' > "$pkg/usr/bin/promtool"
    printf '#!/bin/sh\necho server\n' > "$pkg/usr/bin/prometheus"
    chmod +x "$pkg/usr/bin/promtool" "$pkg/usr/bin/prometheus"
    dpkg-deb --build "$pkg" prometheus_9.9_all.deb > /dev/null;;
esac
"""


@pytest.fixture
def machine(tmp_path: Path) -> dict[str, Path]:
    if shutil.which("dpkg-deb") is None or shutil.which("sh") is None:
        pytest.skip("dpkg-deb not found: the stand-in apt-get builds a real .deb with it")
    root, tools, venv_bin = tmp_path / "root", tmp_path / "tools", tmp_path / "venv-bin"
    for folder in (root / "etc/systemd/system/timers.target.wants", tools, venv_bin):
        folder.mkdir(parents=True)
    (root / "etc/systemd/system/timers.target.wants/apt-daily.timer").symlink_to("/dev/null")
    apt = tools / "apt-get"
    apt.write_text(FAKE_APT)
    apt.chmod(0o755)
    return {"root": root, "tools": tools, "bin": venv_bin}


def _run(machine: dict[str, Path]) -> str:
    path = os.pathsep.join([str(machine["tools"]), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
    env = {"PATH": path, "KIRIM_TOOLS_ROOT": str(machine["root"]), "HOME": str(machine["root"])}
    done = subprocess.run(
        ["sh", str(SCRIPT), str(machine["bin"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout + done.stderr


def _calls(machine: dict[str, Path]) -> list[str]:
    return (machine["root"] / "apt.calls").read_text().splitlines()


def _links(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink())


def test_no_service_starts_or_stays_enabled_and_only_promtool_is_taken(
    machine: dict[str, Path],
) -> None:
    """Chromium installs without recommends while a policy-rc.d refuses service starts;
    the links the install enabled are removed, those there before kept, the
    policy-rc.d removed again; promtool alone comes out of the prometheus package."""
    out = _run(machine)
    calls, root = _calls(machine), machine["root"]
    installs = [c for c in calls if " install " in f" {c} "]
    assert installs, calls
    assert all("--no-install-recommends" in c for c in installs), installs
    assert "policy 101" in calls  # a start asked for during the install was refused
    assert _links(root) == ["etc/systemd/system/timers.target.wants/apt-daily.timer"]
    assert "disabled avahi-daemon.service" in out
    assert not (root / "usr/sbin/policy-rc.d").exists()
    assert (root / "usr/bin/chromium").exists()
    assert (root / "usr/sbin/pgbouncer").exists()
    assert (
        subprocess.run(
            [str(machine["bin"] / "promtool")], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "promtool 9.9"
    )
    assert not (machine["bin"] / "prometheus").exists()
    assert any(c.startswith("-o") and " download prometheus" in c for c in calls)
    assert not any(" install " in f" {c} " and "prometheus" in c for c in calls)


def test_a_policy_rc_d_already_there_is_left_as_it_was(machine: dict[str, Path]) -> None:
    """A policy-rc.d the machine had (a container's) is used and left in place."""
    policy = machine["root"] / "usr/sbin/policy-rc.d"
    policy.parent.mkdir(parents=True)
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    _run(machine)
    assert "policy 101" in _calls(machine)
    assert policy.read_text() == "#!/bin/sh\nexit 101\n"


def test_nothing_is_installed_when_all_are_there(machine: dict[str, Path]) -> None:
    """With chromium, pgbouncer and promtool in place apt-get is not run at all."""
    for place in ("usr/bin/chromium", "usr/sbin/pgbouncer"):
        tool = machine["root"] / place
        tool.parent.mkdir(parents=True)
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
    promtool = machine["bin"] / "promtool"
    promtool.write_text("#!/bin/sh\n")
    promtool.chmod(0o755)
    assert _run(machine) == ""
    assert not (machine["root"] / "apt.calls").exists()
