"""The CLI's output: JSON on stdout, the worker's banner, and the cells of the tables of
``kirim.cli.tables`` (user data shown literally, never as markup, its control
characters escaped: ``kirim.text.visible``, the one escaping of every text sink)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Mapping
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kirim.engine import Kirim
from kirim.model import AttemptStatus, Delivery, DeliveryStatus, JobStatus
from kirim.observe.logging import Sink
from kirim.store.pooler import Wakeups
from kirim.text import json_text, redact_url, visible
from kirim.worker import Worker


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def emit_json(data: Any) -> None:
    """``data`` as one line of JSON, no control character raw (``kirim.text.json_text``)."""
    click.echo(json_text(data))


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
    return Text(visible(str(status)), style=STYLES.get(status, ""))


def text_cell(value: Any) -> Text:
    """A cell that shows user data literally (no rich markup, control characters
    escaped: an event id cannot set the window's title or clear the screen)."""
    return Text("-" if value is None or value == "" else visible(str(value)))


def status_text(d: Delivery) -> Text:
    """The status as people read it, with why a suppressed one is: ``suppressed (opted_out)``."""
    label = d.status_label if d.reason is None else f"{d.status_label} ({d.reason})"
    return Text(visible(label), style=STYLES.get(d.status, ""))


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
        if channel.in_commit:
            in_doubt = "never: written in the commit that marks it sent"
        elif channel.idempotent:
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
    Sink().write("\n".join(visible(line) for line in lines) + "\n")
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
        table.add_row(text_cell(key), text_cell(shown))
    console.print(table)
