"""The package layout is the architecture: no module imports a layer above its own.

Layers, from the bottom: the core (records, errors, validation, providers, the store,
observability, views), the worker, the engine and its configuration, the tools built
on the engine (HTTP service, doctor, devtools, analyze, simulate, explore), and the
command line on top. ``kirim.testing`` is for tests: nothing in ``src/`` imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "kirim"

CORE = {
    "addresses",
    "callbacks",
    "limits",
    "machine",
    "channels",
    "clock",
    "day_time",
    "errors",
    "frozen",  # a faster __init__ for the frozen values made per delivery
    "feed_tokens",
    "inbox",
    "keys",
    "model",
    "notify",
    "observe",
    "preferences",
    "providers",
    "runs",
    "store",
    "text",
    "timeline",
    "tokens",
    "topics",
    "validation",
    "version",
    "views",
}
LAYER = {
    **{name: 0 for name in CORE},
    "worker": 1,
    "config": 2,
    "channel_config": 2,  # a [channels.NAME] table of the configuration
    "engine": 2,
    "address_book": 2,  # the engine's verbs on addresses
    "feeds": 2,  # the engine's verbs on recipients' feeds (the inbox)
    "workflows": 2,  # the engine's verbs on workflow runs
    "topic_book": 2,  # the engine's verbs on topics and their subscribers
    "sync": 2,
    "sync_connection": 2,  # a caller's sync psycopg connection, for SyncKirim
    "operations": 2,
    **{name: 3 for name in ("http", "doctor", "devtools", "analyze", "simulate", "explore")},
    "chaos": 3,  # the vocabulary of explore, simulate and the demo
    "live": 3,  # the feed streams' hub, for the HTTP service
    "cli": 4,
    "receiver": 4,  # ``python -m kirim.receiver``: an entry point
    "__main__": 4,
    "__init__": 4,  # the public imports
}
LOWER = ("worker.settings", "worker.checkpoint")  # leaves of the worker that config may read


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def layer(module: str) -> int:
    """``module`` without the ``kirim.`` prefix; commands of a tool are the CLI."""
    if module.endswith(".command"):
        return LAYER["cli"]
    return LAYER[module.split(".")[0]]


def imports(path: Path) -> set[str]:
    """The kirim modules ``path`` imports (at any depth, also under TYPE_CHECKING),
    without the ``kirim.`` prefix."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "kirim":  # a module of kirim's, or a name of its __init__
                names = [
                    f"kirim.{a.name}" if _is_module(a.name) else "kirim.__init__"
                    for a in node.names
                ]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {n.removeprefix("kirim.") for n in names if n.startswith("kirim.")}
    return found


def _is_module(name: str) -> bool:
    return (SRC / name).is_dir() or (SRC / f"{name}.py").is_file()


MODULES = sorted(p for p in SRC.rglob("*.py") if p.name != "testing.py")


def test_every_top_level_name_has_a_layer() -> None:
    tops = {module_name(p).split(".")[0] for p in MODULES}
    assert tops - set(LAYER) == set()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_imports_a_layer_above_its_own(path: Path) -> None:
    me = module_name(path)
    mine = layer(me)
    upward = {
        target
        for target in imports(path)
        if target != "testing" and layer(target) > mine and not target.startswith(LOWER)
    }
    assert upward == set(), f"kirim.{me} (layer {mine}) imports {sorted(upward)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_production_code_never_imports_kirim_testing(path: Path) -> None:
    assert "testing" not in imports(path)


@pytest.mark.parametrize(
    "path", [p for p in MODULES if module_name(p).startswith("http")], ids=module_name
)
def test_the_http_service_never_imports_the_cli(path: Path) -> None:
    assert not {t for t in imports(path) if t == "cli" or t.startswith("cli.")}


def test_the_rules_see_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an import of the CLI from the store is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from kirim.cli.runner import fail\nimport kirim.testing\n")
    assert imports(bad) == {"cli.runner", "testing"}
    assert layer("cli.runner") > layer("store.rules")


@pytest.mark.parametrize("module", ["kirim.explore.command", "kirim.cli.doctor", "kirim.worker"])
def test_each_command_module_imports_first(module: str) -> None:
    """A module imported on its own, before the CLI (a fresh interpreter): no import
    cycle (kirim.explore.command once failed unless kirim.cli came first)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
