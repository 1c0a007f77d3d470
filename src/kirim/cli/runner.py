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
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kirim.config import Config, load_config
from kirim.engine import Kirim, SendAfter
from kirim.errors import (
    ConfigError,
    IdempotencyKeyReused,
    InvalidNotification,
    KirimError,
    NotFound,
    NotSettled,
    SchemaError,
)
from kirim.model import AttemptStatus, DeliveryStatus, Job, JobStatus
from kirim.observe.logging import Sink, configure
from kirim.store import open_store
from kirim.validation import DURATION, DURATION_UNITS, MAX_EPOCH, as_id
from kirim.views import Record, iso
from kirim.worker import Worker

T = TypeVar("T")

EXIT_FAILED = 1  # a failed check, a missing record
EXIT_USAGE = 2  # a bad flag, config, URL or schema: something the caller must fix
MAX_ID = 2**63 - 1  # the largest id a store holds
_USAGE_ERRORS = (ConfigError, SchemaError, InvalidNotification, IdempotencyKeyReused)
_DURATION, _UNITS = DURATION, DURATION_UNITS  # the one grammar of durations


# -- running a command -----------------------------------------------------------------


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print one line on stderr and exit with ``code``."""
    click.echo(f"Error: {' '.join(message.split())}", err=True)
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


def safe_url(url: str) -> str:
    """The URL without its password, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False))


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


#: how ``kirim status`` reads its argument: ``id:N``, ``key:K``, or bare (key, else id)
By = Literal["auto", "id", "key"]


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
    delivery = await app.store.get_delivery(value, by=by)
    if delivery is None:
        what = {"auto": "id or idempotency key", "id": "id", "key": "idempotency key"}[by]
        raise NotFound(f"no delivery with {what} {value!r}")
    job = await app.store.get_job(delivery.id)
    return delivery, job, await app.store.get_attempts(delivery.id)


# -- input -----------------------------------------------------------------------------


def parse_payload(text: str) -> Any:
    """JSON text, ``@file`` for a file's contents, or ``-`` for stdin."""
    source = "--payload"
    if text == "-":
        text, source = sys.stdin.read(), "stdin"
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text, source = f.read(), text[1:]
        except (OSError, ValueError) as exc:  # ValueError: a NUL, a file not in UTF-8
            fail(f"cannot read the payload file: {exc}", EXIT_USAGE)
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
# Every key is described in the README's "Configuration" section.

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
    action: Callable[[Kirim, Record], Coroutine[Any, Any, str | None]],
    done: str,
) -> None:
    """Apply ``action`` to each delivery; it returns why it could not, or None."""
    state.setup_logging()

    async def go() -> list[str]:
        problems = []
        async with state.app() as app:
            for key_or_id in ids:
                found = await app.get(key_or_id)
                if found is None:
                    problems.append(f"{key_or_id}: not found")
                    continue
                try:
                    why = await action(app, found)
                except NotSettled as exc:  # an earlier request may still land
                    why = str(exc)
                if why is not None:
                    problems.append(f"{key_or_id}: {why}")
                else:
                    click.echo(f"delivery {found[0].id} {done}")
        return problems

    problems = run(go)
    if problems:
        fail("; ".join(problems), EXIT_FAILED)


def job_status(job: Job | None) -> str:
    return "none" if job is None else str(job.status)


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


# -- output ----------------------------------------------------------------------------


STYLES = {
    DeliveryStatus.PENDING: "cyan",
    DeliveryStatus.PROCESSING: "blue",
    DeliveryStatus.SENT: "green",
    DeliveryStatus.FAILED: "red",
    DeliveryStatus.CANCELED: "dim",
    DeliveryStatus.IN_DOUBT: "yellow",
    JobStatus.QUEUED: "cyan",
    JobStatus.RUNNING: "blue",
    JobStatus.RETRY_SCHEDULED: "yellow",
    JobStatus.COMPLETED: "green",
    JobStatus.DEAD: "red",
    AttemptStatus.REQUESTED: "yellow",
    AttemptStatus.SUCCEEDED: "green",
    AttemptStatus.FAILED_PERMANENT: "red",
    AttemptStatus.FAILED_TRANSIENT: "yellow",
    AttemptStatus.UNKNOWN: "yellow",
}


# -- output: text ----------------------------------------------------------------------


def styled(status: Any) -> Text:
    return Text(str(status), style=STYLES.get(status, ""))


def _text(value: Any) -> Text:
    """A cell that shows user data literally (no rich markup)."""
    return Text("-" if value is None or value == "" else str(value))


def timeline(record: Record) -> list[tuple[float, str, Text]]:
    """What happened to one delivery, oldest first: (time, what, detail)."""
    d, job, attempts = record
    events: list[tuple[float, str, Text]] = [
        (d.created_at, "created", _text(f"event {d.event_id}"))
    ]
    several_jobs = len({a.job_id for a in attempts}) > 1
    for a in attempts:
        who = f"attempt {a.number}" + (f" of job {a.job_id}" if several_jobs else "")
        events.append(
            (a.requested_at, f"{who} requested", _text(f"{a.provider_request_id} by {a.worker_id}"))
        )
        if a.completed_at is not None:
            detail = Text.assemble(styled(a.status))
            if a.provider_message_id:
                detail.append(f" message {a.provider_message_id}")
            if a.error:
                detail.append(f" {a.error}")
            events.append((a.completed_at, f"{who} completed", detail))
    if d.sent_at is not None:
        events.append((d.sent_at, "sent", _text(d.provider_message_id)))
    if job is not None and job.status in (JobStatus.QUEUED, JobStatus.RETRY_SCHEDULED):
        events.append((job.run_at, f"job {job.id} due", styled(job.status)))
    if job is not None and job.status is JobStatus.RUNNING and job.lease_expires_at is not None:
        events.append((job.lease_expires_at, "lease expires", _text(job.lease_owner)))
    events.sort(key=lambda e: e[0])
    return events


def show_status(console: Console, record: Record) -> None:
    d, job, _ = record
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("delivery", _text(d.id))
    facts.add_row("key", _text(d.idempotency_key))
    facts.add_row("event", _text(d.event_id))
    facts.add_row("recipient", _text(d.recipient))
    facts.add_row("channel", _text(d.channel))
    status = Text(d.status_label, style=STYLES.get(d.status, ""))
    facts.add_row("status", status)
    facts.add_row("provider message", _text(d.provider_message_id))
    if d.last_error:
        facts.add_row("last error", _text(d.last_error))
    if job is None:
        facts.add_row("job", _text(None))
    else:
        line = Text.assemble(f"{job.id} ", styled(job.status))
        line.append(f" attempts {job.attempts}/{job.max_attempts}")
        if job.lease_owner:
            line.append(f" leased by {job.lease_owner} until {iso(job.lease_expires_at)}")
        facts.add_row("job", line)
        if job.last_error and job.last_error != d.last_error:
            facts.add_row("job error", _text(job.last_error))
    console.print(facts)
    table = Table(title="timeline", title_justify="left")
    table.add_column("time (UTC)", no_wrap=True)
    table.add_column("+s", justify="right")
    table.add_column("what")
    table.add_column("detail")
    for when, what, detail in timeline(record):
        table.add_row(iso(when), f"{when - d.created_at:.3f}", what, detail)
    console.print(table)


def show_deliveries(console: Console, records: Sequence[Record], *, title: str) -> None:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("id", no_wrap=True, justify="right")
    for name in ("event", "recipient", "channel"):
        table.add_column(name, overflow="fold", ratio=1)
    table.add_column("status", no_wrap=True)
    table.add_column("job", no_wrap=True)
    table.add_column("tries", no_wrap=True)
    table.add_column("last error", overflow="fold", ratio=2)
    for d, job, attempts in records:
        table.add_row(
            str(d.id),
            _text(d.event_id),
            _text(d.recipient),
            _text(d.channel),
            Text(d.status_label, style=STYLES.get(d.status, "")),
            _text(None) if job is None else styled(job.status),
            str(len(attempts)) if job is None else f"{len(attempts)}/{job.max_attempts}",
            _text(d.last_error or (job.last_error if job is not None else None)),
        )
    console.print(table)


def worker_facts(
    app: Kirim, worker: Worker, *, burst: bool, metrics_url: str | None
) -> dict[str, Any]:
    """What ``kirim worker`` says as it starts: where, with what, how (no secrets)."""
    s = worker.settings
    channels = []
    for name, channel in sorted(app.channels().items()):
        spec = app.config.channels.get(name)
        provider = spec.provider if spec is not None else type(channel.provider).__name__
        url = None if spec is None else spec.options.get("url")
        if channel.idempotent:
            in_doubt = "resend with the same key (idempotent)"
        else:
            in_doubt = str(channel.on_unknown)
        channels.append(
            {
                "name": name,
                "provider": provider,
                "url": safe_url(url) if isinstance(url, str) else None,
                "in_doubt": in_doubt,
                "lookup": channel.lookup,
            }
        )
    source = app.config.source
    return {
        "version": _version(),
        "worker_id": worker.worker_id,
        "pid": os.getpid(),
        "burst": burst,
        "database": safe_url(app.store.url),
        "config": None if source is None else os.path.abspath(source),
        "lease": s.lease,
        "concurrency": s.concurrency,
        "batch_size": s.batch_size,
        "max_attempts": app.config.max_attempts,
        "shutdown_grace": s.shutdown_grace,
        "channels": channels,
        "metrics": metrics_url,
    }


def show_banner(facts: Mapping[str, Any]) -> None:
    """The worker's start banner on stderr, like Celery's (a closed stderr drops it)."""
    mode = ", burst" if facts["burst"] else ""
    lines = [
        f"kirim {facts['version']} worker {facts['worker_id']} (pid {facts['pid']}{mode})",
        f"  database     {facts['database']}",
        f"  config       {facts['config'] or 'none (defaults; kirim init writes kirim.toml)'}",
        f"  lease        {facts['lease']:g}s, renewed while a delivery is in flight",
        f"  concurrency  {facts['concurrency']} in flight, claims of {facts['batch_size']}, "
        f"{facts['max_attempts']} attempts, {facts['shutdown_grace']:g}s grace on SIGTERM",
    ]
    if not facts["channels"]:
        lines.append("  channels     none configured")
    for i, c in enumerate(facts["channels"]):
        where = f" {c['url']}" if c["url"] else ""
        lookup = ", lookup first" if c["lookup"] else ""
        label = "channels" if i == 0 else ""
        lines.append(
            f"  {label:<11}  {c['name']}: {c['provider']}{where}; in doubt: {c['in_doubt']}{lookup}"
        )
    if facts["metrics"]:
        lines.append(f"  metrics      {facts['metrics']}")
    Sink().write("\n".join(lines) + "\n")
    Sink().flush()


def _version() -> str:
    try:
        return importlib.metadata.version("kirim")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def show_mapping(console: Console, data: Mapping[str, Any], *, title: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in data.items():
        shown = f"{value:,.1f}" if isinstance(value, float) else str(value)
        table.add_row(_text(key), _text(shown))
    console.print(table)
