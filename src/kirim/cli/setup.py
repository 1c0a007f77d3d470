"""``kirim init``, ``demo`` and ``bench``: set a database up, show kirim at work, measure it."""

from __future__ import annotations

import functools
from typing import Any

import click

from kirim.cli import render, runner
from kirim.cli.runner import State, pass_state, run
from kirim.text import redact_url

# -- init, send ------------------------------------------------------------------------


@click.command()
@pass_state
def init(state: State) -> None:
    """Write a starter kirim.toml if there is none, then create or migrate the schema.

    The starter configuration (./kirim.toml, or the --config file) is commented and
    has one channel, push, to a local test receiver on 127.0.0.1:8080 (run
    `python -m kirim.receiver`); an existing file is never overwritten. Safe to run
    again: it applies only the migrations that are missing. Prints the schema
    version and the database URL.

    \b
    Examples:
      kirim init
      kirim --database sqlite:///var/kirim.db init
    """
    state.setup_logging()
    path = runner.CONFIG_FILE if state.config_path is None else state.config_path
    written = runner.write_starter_config(path)
    if written is not None:
        click.echo(f"wrote a starter configuration to {written} (channel push: 127.0.0.1:8080)")

    async def go() -> tuple[int, str]:
        async with state.app(check_schema=False) as app:
            return await app.store.migrate(), app.store.url

    version, url = run(go)
    click.echo(f"schema version {version} at {redact_url(url)}")


# -- demo, bench -----------------------------------------------------------------------


@click.command()
@click.option("--notifications", type=click.IntRange(min=1), default=300, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--seed", type=int, help="Seed for a reproducible run.")
@pass_state
def demo(state: State, notifications: int, workers: int, seed: int | None) -> None:
    """Watch kirim survive stalls, crashes and timeouts.

    Runs notifications through several workers against a flaky local provider
    and shows that none arrived twice.

    \b
    Example:
      kirim demo --notifications 500 --workers 4 --seed 7
    """
    state.setup_logging()
    run_demo = runner.extension("kirim.devtools.demo", "run_demo", "demo")
    code = runner.call_extension(run_demo, render.console(), notifications, workers, seed)
    raise click.exceptions.Exit(int(code or 0))


@click.command()
@click.option(
    "--database",
    "bench_database",
    metavar="URL",
    help="SQLite file to measure, or a PostgreSQL server on which a throw-away database "
    "is created and dropped.",
)
@click.option("--notifications", type=click.IntRange(min=1), default=2000, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--metrics", is_flag=True, help="Workers record Prometheus metrics (their cost).")
@click.option(
    "--sync",
    type=click.Choice(["full", "normal"]),
    help="SQLite only: its synchronous setting for the run, set on the URL as "
    "?synchronous=. full (the store's default) fsyncs every commit; normal fsyncs the WAL "
    "only at checkpoints, so a power loss can undo the last commits. The result's "
    "durability field says what the run had (on PostgreSQL: the server's settings).",
)
@click.option(
    "--worker-log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="The workers' log level, to measure what their log lines cost: the lines are "
    "rendered in --log-format and written to the null device. kirim worker logs at info; "
    "without this option the workers log at warning.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def bench(
    state: State,
    bench_database: str | None,
    notifications: int,
    workers: int,
    metrics: bool,
    sync: str | None,
    worker_log_level: str | None,
    as_json: bool,
) -> None:
    """Measure enqueue and delivery throughput.

    Notifications go through WORKERS worker processes to a zero-latency
    in-process provider, with the full ledger (delivery, job, attempt). --database
    (here or before the command) picks where: a SQLite file, or a PostgreSQL
    server on which a throw-away database is created and dropped; without it a
    temporary SQLite file is used. The result includes its durability: SQLite's
    journal mode and synchronous setting (--sync), or PostgreSQL's
    synchronous_commit and fsync; the worker processes' CPU per delivery (their
    log lines at --worker-log-level counted in); and on
    PostgreSQL the WAL bytes per delivery (server-wide), per hot table the
    updates per delivery and the share that were HOT, and, when the server runs
    on this host, its processes' CPU per delivery.

    \b
    Example:
      kirim bench --notifications 10000 --workers 8 --json
      kirim bench --sync normal --workers 2
      kirim bench --worker-log-level info --workers 1
    """
    state.setup_logging()
    database = bench_database or state.database
    if sync is not None and database and database.startswith(("postgresql:", "postgres:")):
        raise click.UsageError(
            "--sync is SQLite's synchronous setting, not for a PostgreSQL database: there "
            "durability is the server's (synchronous_commit, fsync), which "
            "the result reports",
            click.get_current_context(),
        )
    run_bench = runner.extension("kirim.devtools.bench", "run_bench", "bench")
    args: list[Any] = [database, notifications, workers]
    if metrics:
        args.append(True)  # run_bench's metrics argument, given only when asked for
    if sync is not None:
        run_bench = functools.partial(run_bench, sync=sync)  # given only when asked for
    if worker_log_level is not None:
        worker_log = (worker_log_level, state.log_format)
        run_bench = functools.partial(run_bench, worker_log=worker_log)
    result = runner.call_extension(run_bench, *args)
    if as_json:
        render.emit_json(result)
    else:
        shown = {  # ratios to three places (the table shows floats to one)
            key: f"{value:.3f}" if key.startswith("hot_ratio_") and value is not None else value
            for key, value in result.items()
        }
        render.show_mapping(render.console(), shown, title="kirim bench")
