"""The README and docs/, tried literally: their shell blocks and Python snippets run.

Every ```sh and ```python block of README.md runs verbatim, in the README's order, in
one fresh temporary directory (a new user following it from the top), with this
environment's ``kirim`` and ``python`` first on PATH; then, in the same directory
(the README's first run has made ``kirim.toml`` and the database there), the blocks
of each page of ``docs/`` in the order of their names. A block is skipped only when
the line above it says why (``<!-- readme-test: skip: REASON -->``), or when it runs
``kirim serve``, a server that runs until it is stopped.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: After the README, the pages of docs/ (a snippet there may use the first run's files).
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- readme-test: skip:"
SHELLS = {"sh", "bash", "shell"}
BLOCK_TIMEOUT = 60


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    skip: str | None  # why it does not run


def blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text`` with their language and skip reason."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("```"):
            i += 1
            continue
        lang = line[3:].strip()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        above = lines[start - 1].strip() if start > 0 else ""
        skip = above[len(MARK) :].removesuffix("-->").strip() if above.startswith(MARK) else None
        code = "\n".join(body) + "\n"
        if skip is None and lang in SHELLS and "kirim serve" in code:
            skip = "runs kirim serve, a server that runs until it is stopped"
        found.append(Block(line=start + 1, lang=lang, body=code, skip=skip))
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_every_shell_block_and_python_snippet_of_the_readme_runs(tmp_path: Path) -> None:
    """Each sh and python block of README.md, then of docs/*.md, runs verbatim, in order,
    in one fresh directory."""
    if not _port_free(8080):
        pytest.skip("127.0.0.1:8080 is taken: the first run's test receiver listens there")
    found = [
        (path, b)
        for path in DOCUMENTS
        for b in blocks(path.read_text())
        if b.lang in SHELLS | {"python"}
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIRIM_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    ran, failures = [], []
    for n, (path, block) in enumerate(found):
        where = f"{path.relative_to(ROOT)}:{block.line}"
        if block.skip is not None:
            assert block.skip, f"{where}: a skip needs a reason"
            continue
        if block.lang == "python":
            script = tmp_path / f"readme_{n}.py"
            script.write_text(block.body)
            argv = [sys.executable, script.name]
        else:
            argv = ["bash", "-e", "-o", "pipefail", "-c", block.body]
        try:
            done = subprocess.run(
                argv,
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            failures.append(f"{where} ({block.lang}): over {BLOCK_TIMEOUT}s")
            continue
        ran.append(where)
        if done.returncode != 0:
            failures.append(
                f"{where} ({block.lang}) exited {done.returncode}:\n"
                f"{block.body}--- stdout\n{done.stdout[-2000:]}--- stderr\n{done.stderr[-2000:]}"
            )
    assert not failures, "\n\n".join(failures)
    in_readme = [w for w in ran if w.startswith("README.md:")]
    assert len(in_readme) >= 3, f"only the blocks at {ran} ran"
    assert len(ran) > len(in_readme), f"no block of docs/ ran: {ran}"


def test_the_first_run_delivers_and_the_python_snippet_finds_it(tmp_path: Path) -> None:
    """The README's first run leaves kirim.toml and one sent delivery, which its snippet sees."""
    if not _port_free(8080):
        pytest.skip("127.0.0.1:8080 is taken: the first run's test receiver listens there")
    shell = [b for b in blocks(README.read_text()) if b.lang in SHELLS and b.skip is None]
    first = next(b for b in shell if "kirim init" in b.body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIRIM_")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", first.body],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "kirim.toml").exists()
    assert "sent" in done.stdout
    assert "kirim receiver on http://127.0.0.1:8080/" in done.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "kirim", "list", "--status", "sent", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
    )
    assert listed.returncode == 0, listed.stderr
    assert '"event_id": "order-48291"' in listed.stdout
