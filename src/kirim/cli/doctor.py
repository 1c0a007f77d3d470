"""``kirim doctor``: the command over ``kirim.doctor``'s checks, as text or JSON.

``--table T --key COLS`` audits any delivery table for a unique index on exactly
those columns (``kirim.doctor.audit``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import click

from kirim.cli import params, render, runner
from kirim.doctor.audit import (
    OK,
    PROBLEM,
    SKIPPED,
    WARNING,
    Check,
    audit_table,
    plural,
    report_json,
)
from kirim.doctor.checks import diagnose
from kirim.doctor.probes import Database
from kirim.errors import NotFound
from kirim.text import redact_url, visible

# -- the command -----------------------------------------------------------------------

_MARK = {OK: "ok", WARNING: "WARNING", PROBLEM: "PROBLEM", SKIPPED: "skipped"}
_COLOR = {OK: "green", WARNING: "yellow", PROBLEM: "red", SKIPPED: None}


def render_text(target: str, checks: Sequence[Check]) -> None:
    click.echo(f"kirim doctor: {visible(target)}")
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark = click.style(f"{_MARK[c.status]:<8}", fg=_COLOR[c.status], bold=c.status is PROBLEM)
        click.echo(f"  {mark} {c.name:<{width}}  {visible(c.message)}")
        if c.fix:
            click.echo(f"  {'':<8} {'':<{width}}  fix: {visible(c.fix)}")
    problems = sum(c.status is PROBLEM for c in checks)
    warnings = sum(c.status is WARNING for c in checks)
    click.echo(f"{plural(problems, 'problem')}, {plural(warnings, 'warning')}")


@click.command()
@click.option(
    "--table",
    metavar="TABLE",
    type=params.TextParam(),
    help="Audit this delivery table instead (with --key).",
)
@click.option(
    "--key",
    "key",
    metavar="COLS",
    type=params.TextParam(),
    help="Its idempotency key columns, comma-separated.",
)
@click.option(
    "--dsn",
    metavar="URL",
    type=params.TextParam(),
    help="Database to examine (sqlite:///… or postgresql://…).  [default: the configured one]",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"ok": …, "checks": […]}.')
@runner.pass_state
def doctor(
    state: runner.State, table: str | None, key: str | None, dsn: str | None, as_json: bool
) -> None:
    """Say what is wrong with a kirim store, and how to fix it.

    Checks the UNIQUE index on the idempotency key, deliveries stuck in
    processing, in-doubt deliveries and dead letters, the lease against the
    providers' p99 latency, clock skew, each channel's dedup_window against the
    retry horizon, and [retention] keep against both; and what the database
    keeps: its replication mode (synchronous_commit, synchronous_standby_names,
    the standbys streaming), a pooler in front (and listen_url), intents that
    workers found missing after a failover (ledger_behind), SQLite's
    synchronous setting. With --table and --key,
    audits any delivery table for a unique index on exactly those columns (and
    the duplicates already in it).
    Exits 1 on any problem; warnings alone exit 0. Never writes.

    \b
    Examples:
      kirim doctor
      kirim doctor --json | jq '.checks[] | select(.status != "ok")'
      kirim doctor --dsn postgresql://app@db/shop --table notifications \\
                   --key event_id,user_id,channel
    """
    state.setup_logging()
    if (table is None) != (key is None):
        runner.fail("--table and --key go together: --table T --key COL1,COL2", 2)
    with runner.reported():
        config = state.config()
        url = dsn or config.database
        try:
            with Database(url) as db:
                checks = (
                    audit_table(db, table, key)
                    if table is not None and key is not None
                    else diagnose(db, config, now=time.time())
                )
        except NotFound as exc:
            runner.fail(str(exc), runner.EXIT_USAGE)
    if as_json:
        render.emit_json(report_json(checks))
    else:
        render_text(redact_url(url) + (f" table {table}" if table else ""), checks)
    if any(c.status is PROBLEM for c in checks):
        raise click.exceptions.Exit(runner.EXIT_FAILED)
