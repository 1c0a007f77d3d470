"""The ``kirim analyze`` click command (registered by the CLI with ``add_command``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from kirim.analyze import NoLineEnd, ProgressCallback, analyze_paths
from kirim.analyze.detect import AnalyzeOptions
from kirim.analyze.parse import FIELDS, parse_field_map
from kirim.analyze.report import write_report
from kirim.cli.params import PathParam

_BIG_INPUT = 16 * 1024 * 1024

HELP = f"""Hunt duplicate notification sends in logs.

Reads each LOG (a file, or - for stdin; plain text or gzip) as one stream of
kirim's own log lines (logfmt or JSON) or the seed write-up's key=value
pseudo-log, follows every notification across jobs, attempts, workers and
provider requests (lines that carry only job_id are joined to the
notification_id seen earlier with that job), and reports per notification:

\b
  duplicate_request    more than one outbound provider request; proven when two
                       or more succeeded with different provider message ids
                       (same id = the provider deduplicated: not proven)
  overlapping_attempt  a retry that started while an earlier attempt's provider
                       request was still in flight, with the overlap in seconds
  late_status_write    a provider success whose status write (db_update) came
                       more than --late-after seconds later, or never
  missing_correlation  delivery lines lacking the ids needed to follow the chain

A request that kirim's own log records as not sent (its provider_response says
error="not sent: ...": refused at connect, say) is no request. The worker's start
banner and blank lines are skipped; a line that cannot be read is counted
malformed. The text and Markdown reports show a short excerpt of each
incident's evidence (--verbose: every line kept).

The summary adds provider latency p99 and a suggested lease length.
Use --field CANONICAL=THEIRS (repeatable) when your logs name fields
differently, e.g. --field notification_id=notif --field worker_id=host.
Canonical names: {", ".join(sorted(FIELDS))}.

Exit status: 1 when a proven duplicate is found (so it can gate CI),
0 otherwise, 2 on usage errors (e.g. an unreadable file).
"""


@contextmanager
def _progress(paths: tuple[str, ...]) -> Iterator[ProgressCallback | None]:
    """A rich progress bar on stderr for large inputs, only when stderr is a terminal."""
    big = any(os.path.isfile(p) and os.path.getsize(p) > _BIG_INPUT for p in paths)
    if not (big and sys.stderr.isatty()):
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, TimeRemainingColumn(), console=Console(stderr=True)) as bar:
        tasks: dict[str, TaskID] = {}

        def update(name: str, done: int, total: int | None) -> None:
            task = tasks.get(name)
            if task is None:
                task = tasks[name] = bar.add_task(name, total=total)
            bar.update(task, completed=done)

        yield update


@click.command("analyze", help=HELP)
@click.argument("logs", metavar="LOG...", nargs=-1, required=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "markdown"]),
    default="text",
    show_default=True,
    help="Report format (json: one object with 'summary' and 'incidents').",
)
@click.option(
    "--field",
    "fields",
    multiple=True,
    metavar="CANONICAL=THEIRS",
    help="Map one of your log keys onto a canonical field (repeatable).",
)
@click.option(
    "--late-after",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Seconds after a provider success beyond which the status write counts as late.",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Show every kept line of each incident's notification (default: a short "
    "excerpt of its evidence; the JSON report always has them all).",
)
@click.option(
    "--output",
    "-o",
    type=PathParam(dir_okay=False, writable=True),
    default=None,
    help="Write the report to FILE instead of stdout.",
)
def analyze(
    logs: tuple[str, ...],
    fmt: str,
    fields: tuple[str, ...],
    late_after: float,
    verbose: bool,
    output: str | None,
) -> None:
    try:
        field_map = parse_field_map(fields)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--field") from exc
    for path in logs:
        if path != "-":
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                click.echo(f"kirim analyze: cannot read {path}: {exc.strerror or exc}", err=True)
                sys.exit(2)
    options = AnalyzeOptions(late_after_s=late_after, field_map=field_map)
    try:
        with _progress(logs) as progress:
            report = analyze_paths(logs, options=options, stdin=sys.stdin.buffer, progress=progress)
    except (OSError, EOFError, NoLineEnd) as exc:
        click.echo(f"kirim analyze: cannot read input: {exc}", err=True)
        sys.exit(2)
    if output is None:
        write_report(report, fmt, sys.stdout, color=sys.stdout.isatty(), verbose=verbose)
    else:
        try:
            with open(output, "w", encoding="utf-8") as handle:
                write_report(report, fmt, handle, color=False, verbose=verbose)
        except OSError as exc:
            click.echo(f"kirim analyze: cannot write {output}: {exc.strerror or exc}", err=True)
            sys.exit(2)
    sys.exit(report.exit_code)
