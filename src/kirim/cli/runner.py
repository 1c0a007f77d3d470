"""The CLI's machinery: running a command, reading its input, showing its output.

``kirim.cli`` holds the click commands; this module holds what they share: the
group's state, the mapping of kirim's errors to exit codes, parsing of payloads
and times, and the rendering of deliveries, jobs and attempts as JSON objects and
rich tables. JSON times are ISO-8601 UTC strings ending in ``Z`` (millisecond
precision, the same form ``kirim analyze`` uses).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import inspect
import json
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, NoReturn, TypeVar

import click

from kirim.config import Config, load_config
from kirim.engine import Kirim, SendAfter
from kirim.errors import (
    ActionRefused,
    ConfigError,
    IdempotencyKeyReused,
    InvalidNotification,
    KirimError,
    NotFound,
    NotSettled,
    SchemaError,
)
from kirim.observe.logging import configure
from kirim.operations import By, not_found
from kirim.store import open_store
from kirim.text import visible
from kirim.validation import DURATION, DURATION_UNITS, MAX_EPOCH, as_id
from kirim.views import Record

T = TypeVar("T")

EXIT_FAILED = 1  # a failed check, a missing record
EXIT_USAGE = 2  # a bad flag, config, URL or schema: something the caller must fix
_USAGE_ERRORS = (ConfigError, SchemaError, InvalidNotification, IdempotencyKeyReused)
_DURATION, _UNITS = DURATION, DURATION_UNITS  # the one grammar of durations


# -- running a command -----------------------------------------------------------------


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print one line on stderr (control characters escaped) and exit with ``code``."""
    click.echo(f"Error: {visible(' '.join(message.split()))}", err=True)
    raise click.exceptions.Exit(code)


def exit_code(exc: KirimError) -> int:
    return EXIT_USAGE if isinstance(exc, _USAGE_ERRORS) else EXIT_FAILED


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Turn kirim's own errors into a one-line message and an exit status."""
    try:
        yield
    except KirimError as exc:
        fail(str(exc), exit_code(exc))
    except sqlite3.Error as exc:  # only opening escapes the store's wrapping: a bad path
        fail(f"cannot open the SQLite database: {exc}; check --database", EXIT_USAGE)


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run an async command body, mapping ``KirimError`` subclasses to exit codes."""
    with reported():
        return asyncio.run(main())


@dataclass(slots=True)
class State:
    """The group's options, shared with every command."""

    config_path: str | None = None
    database: str | None = None
    log_format: str = "logfmt"
    log_level: str | None = None

    def config(self) -> Config:
        return load_config(self.config_path, database=self.database)

    def setup_logging(self, default_level: str = "warning") -> None:
        # stream None: whatever sys.stderr is when a line is written (logs follow
        # redirection), and a closed stderr drops lines instead of stopping the process
        configure(fmt=self.log_format, level=self.log_level or default_level)

    @contextlib.asynccontextmanager
    async def app(
        self, *, check_schema: bool = True, read_only: bool = False
    ) -> AsyncIterator[Kirim]:
        """A ``Kirim`` on the configured store, opened (schema checked) and closed.

        ``read_only`` for the commands that only look: a SQLite file is opened
        read-only, and one that does not exist is a ConfigError, never created."""
        config = self.config()
        store = open_store(config.database, time="database", read_only=True) if read_only else None
        app = Kirim(config, store=store)
        try:
            await app.store.open()
            if check_schema:
                await app.store.check_schema()
            yield app
        finally:
            await app.close()


pass_state = click.make_pass_decorator(State, ensure=True)


def delivery_ref(text: str) -> tuple[str, By]:
    """``id:42`` names delivery 42, ``key:42`` the delivery whose key is ``42``; a bare
    value is a key, else (digits) an id. A key that starts with ``id:`` or ``key:``
    is given as ``key:id:…``. A bad ``id:`` exits 2."""
    if text.startswith("id:"):
        number = text[3:]
        if as_id(number) is None:
            fail(f"{text!r}: an id is a positive integer (give a key as key:K)", EXIT_USAGE)
        return number, "id"
    if text.startswith("key:"):
        return text[4:], "key"
    return text, "auto"


async def resolve(app: Kirim, value: str, by: By = "auto") -> Record:
    """The delivery ``value`` names (see :func:`delivery_ref`); NotFound otherwise."""
    found = await app.get(value, by=by)
    if found is None:
        raise NotFound(not_found(value, by))
    return found


# -- input -----------------------------------------------------------------------------


def parse_payload(text: str, flag: str = "--payload") -> Any:
    """JSON text, ``@file`` for a file's contents, or ``-`` for stdin (``flag``: the
    option's name, for the messages)."""
    source = flag
    if text == "-":
        text, source = sys.stdin.read(), "stdin"
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text, source = f.read(), text[1:]
        except (OSError, ValueError) as exc:  # ValueError: a NUL, a file not in UTF-8
            fail(f"cannot read the {flag} file: {exc}", EXIT_USAGE)
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or a number past Python's digit limit
        fail(f"{source} is not valid JSON: {exc}", EXIT_USAGE)
    except RecursionError:
        fail(f"{source} is nested too deeply to read", EXIT_USAGE)


def parse_when(text: str) -> SendAfter:
    """A duration (``30s``, ``5m``, ``2h``, ``1d``, ``1h30m``) or an ISO-8601 datetime."""
    value = text.strip()
    if value and _DURATION.sub("", value) == "":
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(value))
        # past year 9999 either way: notify() refuses it with its one message, and a
        # timedelta this long still exists (99999999999d does not)
        return timedelta(seconds=min(seconds, 2 * MAX_EPOCH))
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        fail(
            f"--send-after {text!r}: use a duration like 30s, 5m, 2h "
            "or an ISO-8601 datetime with a timezone (2030-01-01T09:00:00Z)",
            EXIT_USAGE,
        )
    if when.tzinfo is None:
        fail(f"--send-after {text!r} has no timezone; add Z or an offset like +07:00", EXIT_USAGE)
    return when


# -- kirim init's starter configuration ------------------------------------------------

CONFIG_FILE = "kirim.toml"
STARTER_CONFIG = """\
# kirim.toml, written by `kirim init` as a start (it never overwrites this file).
# Every key is described in docs/configuration.md.

# Where deliveries are kept; KIRIM_DATABASE_URL, then --database, override it.
# database = "sqlite:///kirim.db"      # or "postgresql://user@host/db"

[worker]
# lease = 30            # seconds; renewed by heartbeat while a delivery is in flight
# concurrency = 10      # deliveries in flight per worker process
# max_attempts = 8
# shutdown_grace = 10   # seconds to finish in-flight deliveries on SIGTERM

# One channel, "push", to a local test receiver: run `python -m kirim.receiver`
# (it listens on 127.0.0.1:8080 and counts every request per idempotency key).
# Point url at your provider's endpoint when you are ready.
[channels.push]
provider = "webhook"
url = "http://127.0.0.1:8080/push"
timeout = 10                  # seconds per request
idempotent = false            # true when the endpoint honours Idempotency-Key
on_unknown = "assume_sent"    # in doubt and not idempotent: "assume_sent", "hold" or "retry"
"""


def write_starter_config(path: str) -> str | None:
    """Write :data:`STARTER_CONFIG` to ``path`` unless a file is there; the path written,
    or None. A file that cannot be written exits 2."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(STARTER_CONFIG)
    except FileExistsError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        fail(f"cannot write the starter configuration {path!r}: {exc}", EXIT_USAGE)
    return path


# -- commands from elsewhere -----------------------------------------------------------


class KirimGroup(click.Group):
    """Commands written elsewhere are imported only when used (or listed)."""

    lazy: ClassVar[dict[str, tuple[str, str]]] = {"analyze": ("kirim.analyze.command", "analyze")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        for name in self.lazy:
            try:
                if self._load(name) is not None:
                    names.add(name)
            except Exception:  # a broken extension must not hide the other commands
                continue
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name) or self._load(cmd_name)

    def _load(self, name: str) -> click.Command | None:
        if name in self.commands or name not in self.lazy:
            return self.commands.get(name)
        module_name, attr = self.lazy[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if _is_absent(module_name, exc):
                return None
            raise
        command = getattr(module, attr)
        if not isinstance(command, click.Command):
            return None
        self.add_command(command, name)
        return command


def _is_absent(module_name: str, exc: ModuleNotFoundError) -> bool:
    """The module itself (or its package) is not part of this installation."""
    return exc.name is not None and (module_name + ".").startswith(exc.name + ".")


# -- operator actions and extensions ---------------------------------------------------


def operate(
    state: State,
    ids: tuple[str, ...],
    action: Callable[[Kirim, str], Coroutine[Any, Any, Record]],
    done: str,
) -> None:
    """Apply ``action`` (an operator verb of ``Kirim``) to each delivery; exit 1 naming
    every one it did not apply to, and why."""
    state.setup_logging()

    async def go() -> list[str]:
        problems = []
        async with state.app() as app:
            for key_or_id in ids:
                try:
                    record = await action(app, key_or_id)
                except NotFound:
                    problems.append(f"{key_or_id}: not found")
                except (ActionRefused, NotSettled) as exc:  # NotSettled: a request may land
                    problems.append(f"{key_or_id}: {exc}")
                else:
                    click.echo(f"delivery {record.delivery.id} {done}")
        return problems

    problems = run(go)
    if problems:
        fail("; ".join(problems), EXIT_FAILED)


def extension(module_name: str, attr: str, command: str) -> Any:
    """A function from a module that may not be part of this installation."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if _is_absent(module_name, exc):
            fail(f"`kirim {command}` is not available in this installation", EXIT_FAILED)
        raise
    return getattr(module, attr)


def call_extension(fn: Any, *args: Any) -> Any:
    """Call it (and await what it returns, if anything), mapping kirim's errors."""
    with reported():
        result = fn(*args)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
