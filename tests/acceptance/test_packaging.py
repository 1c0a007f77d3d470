"""The distributions and the container image's install steps, run for real.

The Dockerfile cannot be built here (no Docker), so its install steps are: every RUN
marked ``install step`` runs as written, in order, with ``sh -ec``, in a copy of the
tree taken through ``.dockerignore`` (the image's build context), with ``python`` a
fresh venv's (the build stage) or the bare interpreter (the runtime stage), and
DIST and VENV set to folders of the test's own. Then: ``twine check --strict`` on
the sdist and the wheel those steps built, kirim run from the venv they made, and
the wheel installed with ``pipx`` with an extra, as docs/deploying.md says. Installs
come from the package index pip is configured with.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
#: what the package needs at run time besides its modules
DATA = ("kirim/py.typed", "kirim/http/templates/overview.html", "kirim/http/static/dashboard.css",
        "kirim/http/static/kirim-inbox.js",
        "kirim/http/openapi.json", "kirim/store/sqlite/sql/0001_initial.sql",
        "kirim/store/postgres/sql/queries.sql")  # fmt: skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def instructions(text: str) -> list[tuple[str, str, str]]:
    """The Dockerfile's instructions as ``(comment above, keyword, arguments)``, the
    continuation lines joined."""
    found: list[tuple[str, str, str]] = []
    comment: list[str] = []
    lines = iter(text.splitlines())
    for line in lines:
        stripped = line.strip()
        if not stripped:
            comment = []
            continue
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("# "))
            continue
        while stripped.endswith("\\"):
            stripped = stripped[:-1].rstrip() + " " + next(lines).strip()
        keyword, _, args = stripped.partition(" ")
        found.append((" ".join(comment), keyword.upper(), args.strip()))
        comment = []
    return found


def _ignored(patterns: list[str], root: Path) -> object:
    """``shutil.copytree``'s ignore: the names a ``.dockerignore`` pattern matches."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).relative_to(root)
        out = set()
        for name in names:
            path = (rel / name).as_posix().removeprefix("./")
            for pattern in patterns:
                bare = pattern.removeprefix("**/")
                if fnmatch.fnmatch(path, pattern) or (
                    pattern.startswith("**/") and fnmatch.fnmatch(name, bare)
                ):
                    out.add(name)
        return out

    return ignore


def context(into: Path) -> Path:
    """A copy of the tree as ``docker build .`` would send it (``.dockerignore`` applied)."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith("#")]
    shutil.copytree(ROOT, into, ignore=_ignored(patterns, ROOT))  # type: ignore[arg-type]
    return into


def _run(command: list[str] | str, **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


def _base_python() -> str:
    return str(getattr(sys, "_base_executable", sys.executable))


def test_every_run_step_is_marked_and_uses_only_the_variables_the_test_sets() -> None:
    """Each RUN of the Dockerfile says whether the test runs it; the install steps use
    only DIST, VENV and EXTRAS, which the Dockerfile sets (ENV, ARG) as the test does."""
    found = instructions(DOCKERFILE.read_text())
    runs = [(c, a) for c, k, a in found if k == "RUN"]
    assert len([c for c, _ in runs if c.startswith("install step")]) == 2
    assert all(c.startswith(("install step", "system step")) for c, _ in runs), runs
    declared = " ".join(a for _, k, a in found if k in ("ENV", "ARG"))
    for comment, args in runs:
        if comment.startswith("install step"):
            names = set(re.findall(r"\$\{?(\w+)", args))
            assert names <= {"DIST", "VENV", "EXTRAS"}, names
            assert all(re.search(rf"\b{n}=", declared) for n in names), (names, declared)


def test_the_image_install_steps_build_a_checked_sdist_and_wheel_that_run(
    tmp_path: Path,
) -> None:
    """The Dockerfile's install steps, run in clean venvs, build an sdist and a wheel
    that pass ``twine check --strict`` and install kirim with its extra: its schema,
    templates and postgres driver work from the installed venv."""
    found = instructions(DOCKERFILE.read_text())
    steps = [a for c, k, a in found if k == "RUN" and c.startswith("install step")]
    extras = next(a for _, k, a in found if k == "ARG" and a.startswith("EXTRAS="))
    src = context(tmp_path / "src")
    assert not (src / ".venv").exists()
    assert (src / "pyproject.toml").exists()
    dist, venv = tmp_path / "dist", tmp_path / "opt-kirim"
    env = {
        **os.environ,
        "DIST": str(dist),
        "VENV": str(venv),
        "EXTRAS": extras.partition("=")[2],
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    # the build stage: an image's python is its own; here a fresh venv's
    build_env = tmp_path / "build-python"
    _run([_base_python(), "-m", "venv", str(build_env)])
    _run(["sh", "-ec", steps[0]], cwd=src, env={**env, "PATH": f"{build_env}/bin:{env['PATH']}"})
    # the runtime stage: the bare interpreter as `python`
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "python").symlink_to(_base_python())
    _run(["sh", "-ec", steps[1]], cwd=tmp_path, env={**env, "PATH": f"{shim}:{env['PATH']}"})

    wheels, sdists = sorted(dist.glob("kirim-*.whl")), sorted(dist.glob("kirim-*.tar.gz"))
    assert len(wheels) == 1, sorted(dist.iterdir())
    assert len(sdists) == 1, sorted(dist.iterdir())
    _run([sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])])
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    assert set(DATA) <= names, set(DATA) - names
    with tarfile.open(sdists[0]) as sdist:
        packed = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {f"src/{d}" for d in DATA} <= packed

    work = tmp_path / "work"
    work.mkdir()
    kirim = str(venv / "bin" / "kirim")
    clean = {k: v for k, v in env.items() if not k.startswith("KIRIM_")}
    assert "schema version" in _run([kirim, "init"], cwd=work, env=clean).stdout
    _run([kirim, "migrate", "--check"], cwd=work, env=clean)
    send = [kirim, "send", "--event", "e-1", "--recipient", "1007", "--channel", "push"]
    _run([*send, "--payload", '{"title": "hi"}'], cwd=work, env=clean)
    assert "pending" in _run([kirim, "list"], cwd=work, env=clean).stdout
    probe = (
        "import psycopg; from kirim.http.dashboard import _env; _env.get_template('overview.html')"
    )
    _run([str(venv / "bin" / "python"), "-c", probe], cwd=work, env=clean)

    # pipx, as docs/deploying.md installs it: the wheel with an extra, an app of its own
    pipx = tmp_path / "pipx"
    pipx_env = {
        **clean,
        "PIPX_HOME": str(pipx / "home"),
        "PIPX_BIN_DIR": str(pipx / "bin"),
        "PIPX_MAN_DIR": str(pipx / "man"),
    }
    _run([sys.executable, "-m", "pipx", "install", f"{wheels[0]}[postgres]"], env=pipx_env)
    version = _run([str(pipx / "bin" / "kirim"), "--version"], env=pipx_env).stdout
    assert wheels[0].name.split("-")[1] in version
    app_python = pipx / "home" / "venvs" / "kirim" / "bin" / "python"
    _run([str(app_python), "-c", "import psycopg"], env=pipx_env)
