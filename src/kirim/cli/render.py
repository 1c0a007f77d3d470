"""The CLI's output: JSON on stdout, and deliveries, timelines and the worker's banner
as rich tables (user data shown literally, never as markup)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kirim.engine import Kirim
from kirim.model import AttemptStatus, Delivery, DeliveryStatus, JobStatus
from kirim.observe.logging import Sink
from kirim.store.pooler import Wakeups
from kirim.text import redact_url
from kirim.timeline import events
from kirim.views import Record, iso
from kirim.worker import Worker

#: fields of a timeline event its table row says already (in the time and what columns)
_SAID = frozenset({"action", "attempt"})


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False))


# -- output ----------------------------------------------------------------------------


STYLES = {
    DeliveryStatus.PENDING: "cyan",
    DeliveryStatus.PROCESSING: "blue",
    DeliveryStatus.SENT: "green",
    DeliveryStatus.FAILED: "red",
    DeliveryStatus.CANCELED: "dim",
    DeliveryStatus.IN_DOUBT: "yellow",
    DeliveryStatus.DELIVERED: "bold green",
    DeliveryStatus.BOUNCED: "red",
    DeliveryStatus.SUPPRESSED: "magenta",
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
    if d.type is not None:
        facts.add_row("type", _text(f"{d.type} for {d.recipient_id}"))
    facts.add_row("status", _status(d))
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
    for e in events(record, now=time.time()):
        style = "yellow" if e.warn else ""
        detail = Text(e.detail(leave_out=_SAID), style=style)
        table.add_row(iso(e.at), f"{e.at - d.created_at:.3f}", Text(e.summary, style=style), detail)
    console.print(table)


def _status(d: Delivery) -> Text:
    """The status as people read it, with why a suppressed one is: ``suppressed (opted_out)``."""
    label = d.status_label if d.reason is None else f"{d.status_label} ({d.reason})"
    return Text(label, style=STYLES.get(d.status, ""))


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
            _status(d),
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
                "url": redact_url(url) if isinstance(url, str) else None,
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
        "database": redact_url(app.store.url),
        "config": None if source is None else os.path.abspath(source),
        "lease": s.lease,
        "concurrency": s.concurrency,
        "batch_size": s.batch_size,
        "max_attempts": app.config.max_attempts,
        "shutdown_grace": s.shutdown_grace,
        "channels": channels,
        "metrics": metrics_url,
        "wakeups": wakeups_of(app, s.poll_interval),
    }


def wakeups_of(app: Kirim, poll_interval: float) -> str:
    """How an idle worker learns of new work: LISTEN (where), or its poll interval."""
    wakeups = getattr(app.store, "wakeups", None)
    if isinstance(wakeups, Wakeups):
        return f"{wakeups.describe()}; polls every {poll_interval:g}s"
    return f"polls every {poll_interval:g}s"


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
    lines.append(f"  wake-ups     {facts['wakeups']}")
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
