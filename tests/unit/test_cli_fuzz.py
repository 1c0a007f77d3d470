"""Hostile input to every CLI command: never a traceback, always an exit status of 0, 1
or 2 with an ``Error:`` line.

Two tiers, both in-process through click's ``CliRunner``: every command's parser (its
options, arguments and their types; the command body replaced by a no-op, so that
``worker``, ``serve`` or ``bench`` do not run), and the commands that are cheap to run
for real (send, status, list, cancel, dead-letter, doctor, token) on a real database of
each backend. Values: strings with NULs and lone surrogates, huge numbers, nan and inf,
arbitrary text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kirim.cli import main
from kirim.observe.logging import configure

NASTY = [
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "x\ud800y",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "1e308",
    "1e999",
    "-1e308",
    "99999999999999999999999",
    "9" * 5000,
    "-1",
    "0",
    "2.5",
    "0x10",
    "",
    " ",
    "id:99999999999999999999999",
    "key:\x00",
    "99999999999d",
    "1e400s",
    "9999-12-31T23:59:59-23:59",
    '{"t": "\\ud800"}',
    '{"\\u0000": 1}',
    "[" * 5000,
    "@/nonexistent\x00",
    "@\ud800",
    "sqlite:///\x00",
    "sqlite:///\ud800.db",
    "postgresql://\x00",
    "k" * 300,
    "--help",
]

#: hostile values: the list above, arbitrary text (surrogates included), numbers as text
values = st.one_of(
    st.sampled_from(NASTY),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=20),
    st.text(st.sampled_from("\x00\ud800\udc00 a9.-e:@{}"), max_size=12),
    st.integers().map(str),
    st.floats().map(str),
)


def _commands() -> dict[str, click.Command]:
    """Every command and subcommand, by its path (``dead-letter retry``)."""
    found: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: str) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if command is None:
                continue
            path = f"{prefix} {name}".strip()
            if isinstance(command, click.Group):
                walk(command, path)
            else:
                found[path] = command

    walk(main, "")
    return found


COMMANDS = _commands()
#: run for real: quick, and touch nothing but the database
RUN = [
    "send",
    "status",
    "list",
    "cancel",
    "dead-letter list",
    "dead-letter retry",
    "dead-letter cancel",
    "doctor",
    "token list",
    "token create",
    "token revoke",
]
GLOBAL = ["--config", "--database", "--log-format", "--log-level"]


@st.composite
def _args(
    draw: st.DrawFn, command: click.Command, *, given_options: tuple[str, ...] = ()
) -> list[str]:
    """Arguments for ``command``: some of its options with hostile values (or a valid
    choice now and then), and hostile arguments."""
    args: list[str] = []
    for param in command.params:
        if isinstance(param, click.Argument):
            count = 1 if param.nargs == 1 else draw(st.integers(0, 3))
            args += [draw(values) for _ in range(count)]
            continue
        if not isinstance(param, click.Option) or not param.opts:
            continue  # hidden options (worker --clock-offset) are fuzzed too
        name = param.opts[-1] if param.opts[-1].startswith("--") else param.opts[0]
        if name in ("--help", *given_options) or not draw(st.booleans()):
            continue
        if param.is_flag:
            args.append(name)
        elif isinstance(param.type, click.Choice) and draw(st.booleans()):
            args += [name, str(draw(st.sampled_from(list(param.type.choices))))]
        else:
            args += [name, draw(values)]
    return args


def _check(result: Result) -> None:
    """Exit 0, 1 or 2; an error says ``Error:`` and is never a traceback."""
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert "Error: " in result.stderr, result.output


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No KIRIM_DATABASE_URL from outside; the CLI's log setup is undone afterwards."""
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


def test_every_command_is_covered() -> None:
    """The fuzz reaches every command there is (a new command is fuzzed without edits)."""
    assert {"send", "status", "worker", "list", "doctor", "serve", "simulate"} <= set(COMMANDS)
    assert set(RUN) <= set(COMMANDS)


@settings(
    max_examples=2500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_parser_survives_hostile_values(
    data: st.DataObject, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each command's options, arguments and their types turn any value into a value or
    a one-line usage error (exit 2), never an exception; the body is not run."""
    path = data.draw(st.sampled_from(sorted(COMMANDS)), label="command")
    command = COMMANDS[path]
    monkeypatch.setattr(command, "callback", lambda *a, **kw: None)
    head: list[str] = []
    for option in GLOBAL:
        if data.draw(st.booleans()):
            head += [option, data.draw(values)]
    args = [*head, *path.split(), *data.draw(_args(command), label="args")]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    _check(result)


@pytest.fixture(scope="module")
def _config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    config = folder / "kirim.toml"
    config.write_text('[channels.push]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/push"\n')
    return config


@pytest.fixture
def ready_database(database_url: str, _config: Path) -> list[str]:
    """The group options of a CLI on an initialised database of each backend, with one
    delivery in it."""
    head = ["--config", str(_config), "--database", database_url]
    runner = CliRunner()
    assert runner.invoke(main, [*head, "init"], catch_exceptions=False).exit_code == 0
    sent = runner.invoke(
        main,
        [*head, "send", "--event", "e", "--recipient", "r", "--channel", "push", "--payload", "{}"],
        catch_exceptions=False,
    )
    assert sent.exit_code == 0, sent.output
    return head


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_cheap_commands_survive_hostile_values(
    data: st.DataObject, ready_database: list[str]
) -> None:
    """send, status, list, cancel, dead-letter, doctor and token, run for real on both
    backends with hostile values, exit 0, 1 or 2 with an Error line, never a traceback."""
    path = data.draw(st.sampled_from(RUN), label="command")
    command = COMMANDS[path]
    fixed: list[str] = []
    if path == "send":  # the required options valid or not, so that the rest is reached
        for option, good in [
            ("--event", "e2"),
            ("--recipient", "r"),
            ("--channel", "push"),
            ("--payload", "{}"),
        ]:
            fixed += [option, data.draw(st.one_of(st.just(good), values))]
    args = data.draw(_args(command, given_options=tuple(fixed[::2])), label="args")
    stdin: Any = data.draw(st.sampled_from(["", '{"a": "\\ud800"}', "{}", "[" * 3000]))
    head = list(ready_database)
    if data.draw(st.integers(0, 9), label="hostile group option") == 0:
        where = data.draw(st.sampled_from([1, 3]))  # the --config or the --database value
        head[where] = data.draw(values)
    result = CliRunner().invoke(
        main, [*head, *path.split(), *fixed, *args], input=stdin, catch_exceptions=False
    )
    _check(result)
