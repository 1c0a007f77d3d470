"""The ``kirim`` command line.

Every command reads the configuration (``--config``, else ``./kirim.toml`` if it
exists), opens the store named by ``--database`` (else ``KIRIM_DATABASE_URL``, else
the config file, else ``sqlite:///kirim.db``) and checks its schema. Results go to
stdout (text, or JSON with ``--json``); logs and error messages go to stderr.

Exit status: 0 success, 1 a failed check or a missing record, 2 a usage or
configuration error. Errors are one line on stderr saying what to fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import signal
from typing import Any

import click

from kirim import views
from kirim.cli import params, runner
from kirim.cli.runner import KirimGroup, State, pass_state, run
from kirim.engine import Kirim, Notification
from kirim.errors import ConfigError
from kirim.explore.command import explore
from kirim.model import DeliveryStatus, JobStatus
from kirim.observe.logging import get_logger
from kirim.worker.settings import RULES as WORKER_RULES

# -- the group -------------------------------------------------------------------------


@click.group(cls=KirimGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=params.PathParam(dir_okay=False),
    metavar="FILE",
    help="Configuration file.  [default: ./kirim.toml if it exists]",
)
@click.option(
    "--database",
    metavar="URL",
    help="Database URL; overrides KIRIM_DATABASE_URL and the config file.  "
    "[default: sqlite:///kirim.db]",
)
@click.option(
    "--log-format",
    type=click.Choice(["logfmt", "json"]),
    default="logfmt",
    show_default=True,
    help="Format of the log lines written to stderr.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log level.  [default: info for the worker, warning for other commands]",
)
@click.version_option(package_name="kirim", prog_name="kirim")
@click.pass_context
def main(
    ctx: click.Context,
    config_path: str | None,
    database: str | None,
    log_format: str,
    log_level: str | None,
) -> None:
    """kirim: notification delivery that never sends the same notification twice.

    \b
    A first run (kirim init writes a kirim.toml whose channel push posts to
    the test receiver that python -m kirim.receiver runs on 127.0.0.1:8080):
      kirim init
      python -m kirim.receiver &
      kirim send --event order-48291 --recipient 1007 --channel push \\
                 --payload '{"title": "Your order has shipped"}'
      kirim worker --burst
      kirim list --status sent
    """
    ctx.obj = State(
        config_path=config_path, database=database, log_format=log_format, log_level=log_level
    )
    # The CLI owns the output: logs on stderr (commands that say more set it again).
    ctx.obj.setup_logging()


# `kirim simulate` lives in kirim.simulate and is imported only when used.
KirimGroup.lazy = {**KirimGroup.lazy, "simulate": ("kirim.simulate.command", "simulate")}
# `kirim doctor` lives in kirim.cli.doctor and is imported only when used.
KirimGroup.lazy = {**KirimGroup.lazy, "doctor": ("kirim.cli.doctor", "doctor")}
# `kirim prune` (retention) lives in kirim.cli.prune and is imported only when used.
KirimGroup.lazy = {**KirimGroup.lazy, "prune": ("kirim.cli.prune", "prune")}
# `kirim serve` (kirim.http, FastAPI) and `kirim token` are imported only when used.
KirimGroup.lazy = {
    **KirimGroup.lazy,
    "serve": ("kirim.cli.serve", "serve"),
    "token": ("kirim.cli.tokens", "token"),
}


# -- init, send ------------------------------------------------------------------------


@main.command()
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
    click.echo(f"schema version {version} at {runner.safe_url(url)}")


@main.command()
@click.option(
    "--event",
    "event_id",
    required=True,
    type=params.TextParam(),
    help="The business event's id.",
)
@click.option(
    "--recipient",
    required=True,
    type=params.TextParam(),
    help="Who receives it (a user id, an address).",
)
@click.option(
    "--channel",
    required=True,
    type=params.TextParam(),
    help="A channel configured in kirim.toml.",
)
@click.option(
    "--payload", required=True, metavar="JSON", help="JSON text, @FILE to read a file, - for stdin."
)
@click.option(
    "--key",
    type=params.TextParam(key=True),
    help="Idempotency key: printable ASCII, at most 255 characters.  "
    "[default: derived from event, recipient, channel]",
)
@click.option(
    "--send-after",
    metavar="WHEN",
    help="Not before this: a duration (30s, 5m, 2h, 1d) or an ISO-8601 datetime with timezone.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def send(
    state: State,
    event_id: str,
    recipient: str,
    channel: str,
    payload: str,
    key: str | None,
    send_after: str | None,
    as_json: bool,
) -> None:
    """Record one notification for delivery by a worker.

    The same idempotency key again does not create a second delivery: it prints
    the existing one with created false. The same key with a different payload
    is refused (exit 2).

    \b
    Example:
      kirim send --event order-48291 --recipient 1007 --channel push \\
                 --payload '{"title": "Shipped"}' --send-after 5m --json
    """
    state.setup_logging()
    data = runner.parse_payload(payload)
    when = None if send_after is None else runner.parse_when(send_after)

    async def go() -> Notification:
        async with state.app() as app:
            return await app.notify(event_id, recipient, channel, data, key=key, send_after=when)

    n = run(go)
    if as_json:
        runner.emit_json(
            {
                "delivery_id": n.delivery_id,
                "idempotency_key": n.idempotency_key,
                "created": n.created,
                "status": str(n.status),
            }
        )
    else:
        what = "created" if n.created else "already exists (same idempotency key), not created"
        click.echo(f"delivery {n.delivery_id} {what}: status {n.status}, key {n.idempotency_key}")


# -- worker ----------------------------------------------------------------------------


def _finite_offset(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """``worker --clock-offset``: a finite number of seconds (not inf or nan)."""
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value!r} is not a finite number of seconds", ctx, param)
    return value


@main.command()
@click.option(
    "--concurrency",
    type=params.NumberParam(WORKER_RULES["concurrency"]),
    help="Deliveries in flight at once.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Exit when nothing is due or in flight anywhere; retries are waited for, "
    "notifications not due yet (send_after, --send-after) are not.",
)
@click.option(
    "--lease",
    type=params.NumberParam(WORKER_RULES["lease"]),
    metavar="SECONDS",
    help="Job lease, renewed by heartbeat while a delivery is in flight.",
)
@click.option(
    "--grace",
    type=params.NumberParam(WORKER_RULES["shutdown_grace"]),
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, how long in-flight deliveries may take before release.",
)
@click.option("--worker-id", metavar="ID", help="This worker's name in logs and attempts.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics on http://HOST:PORT/metrics.  [default: no metrics]",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    metavar="HOST",
    help="Address the metrics endpoint binds to.",
)
@click.option(
    "--clock-offset",
    type=float,
    callback=_finite_offset,
    hidden=True,  # for kirim simulate --clock-skew and tests
    metavar="SECONDS",
    help="Run this worker's own clock SECONDS off the system clock (the store keeps "
    "the database's time).",
)
@pass_state
def worker(
    state: State,
    concurrency: int | None,
    burst: bool,
    lease: float | None,
    grace: float | None,
    worker_id: str | None,
    metrics_port: int | None,
    metrics_host: str,
    clock_offset: float | None,
) -> None:
    """Deliver notifications: claim due jobs, send, record outcomes.

    SIGTERM or SIGINT stops claiming, lets in-flight deliveries finish within the
    grace period, releases the rest to the queue and exits 0. It starts with a
    banner on stderr (the database, its password redacted, the config file, each
    channel with its provider and in-doubt policy, the lease and concurrency; one
    worker_banner line with --log-format json). Logs go to stderr (logfmt, or JSON
    lines with --log-format json). Options not given come from the [worker]
    table of the config file.

    --burst exits once no job is due, running, or waiting for a retry anywhere:
    a notification sent with a later send_after does not keep it alive (a
    later `kirim worker --burst`, or a long-running worker, delivers it).

    \b
    Examples:
      kirim worker --concurrency 20
      kirim --log-format json worker --burst --worker-id batch-1
      kirim worker --metrics-port 9464
    """
    state.setup_logging("info")
    overrides: dict[str, Any] = {
        "concurrency": concurrency,
        "lease": lease,
        "shutdown_grace": grace,
    }

    async def go() -> None:
        async with state.app() as app:
            settings = dataclasses.replace(
                app.config.worker, **{k: v for k, v in overrides.items() if v is not None}
            )
            try:
                app.channels()
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"cannot build the channels: {exc}") from None
            metrics = None
            if metrics_port is not None:
                from kirim.observe.metrics import Metrics

                metrics = Metrics(stats_interval=settings.stats_interval)
                metrics.serve(metrics_port, metrics_host)
            if clock_offset is not None:
                from kirim.simulate.skew import OffsetClock

                # The worker's own clock only: the store was opened on the database's.
                app.clock = OffsetClock(clock_offset)
            w = app.worker(settings=settings, worker_id=worker_id, metrics=metrics)
            log = get_logger(worker_id=w.worker_id)
            metrics_url = (
                None if metrics is None else f"http://{metrics_host}:{metrics.port}/metrics"
            )
            facts = runner.worker_facts(app, w, burst=burst, metrics_url=metrics_url)
            if state.log_format == "json":
                log.info("worker_banner", **facts)
            else:
                runner.show_banner(facts)
            if clock_offset is not None:
                log.info("clock_offset", seconds=clock_offset)
            if metrics is not None:
                log.info("metrics_serving", url=metrics_url)
            loop = asyncio.get_running_loop()
            installed = []

            def on_signal(sig: signal.Signals) -> None:
                w.stop()  # first: nothing (a log line to a closed pipe) may come between
                log.warning("signal_received", signal=sig.name, grace_s=settings.shutdown_grace)

            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, on_signal, sig)
                    installed.append(sig)
            try:
                await w.run(burst=burst)
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)
                if metrics is not None:
                    metrics.close()

    run(go)


# -- reading ---------------------------------------------------------------------------


@main.command()
@click.argument("key_or_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def status(state: State, key_or_id: str, as_json: bool) -> None:
    """Show one delivery, its job and every attempt as a timeline.

    KEY_OR_ID is the delivery's idempotency key, else its id; id:N is always
    the id and key:K always the key (so that a key of digits is never taken
    for an id, nor an id for such a key). A missing delivery exits 1. JSON
    times are ISO-8601 UTC strings.

    \b
    Examples:
      kirim status 42
      kirim status id:42
      kirim status key:48291 --json
      kirim status order-48291-push --json | jq '.attempts[].status'
    """
    state.setup_logging()
    value, by = runner.delivery_ref(key_or_id)

    async def go() -> views.Record:
        async with state.app(read_only=True) as app:
            return await runner.resolve(app, value, by)

    record = run(go)
    if as_json:
        runner.emit_json(views.delivery_json(record))
    else:
        runner.show_status(runner.console(), record)


@main.command(name="list")
@click.option("--status", "status_", type=click.Choice([s.value for s in DeliveryStatus]))
@click.option("--channel", type=params.TextParam(), help="Only this channel.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=0,
    metavar="ID",
    help="Page on: the deliveries after this id in the listing's order (the last id shown).",
)
@click.option(
    "--oldest-first", is_flag=True, help="Oldest first (--after then means: ids above ID)."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@pass_state
def list_(
    state: State,
    status_: str | None,
    channel: str | None,
    limit: int,
    after: int,
    oldest_first: bool,
    as_json: bool,
) -> None:
    """List deliveries, newest first, with their job and attempts.

    Page with --after: the last id shown (newest first, the next page holds the
    older deliveries, ids below it; with --oldest-first, ids above it). When a
    page is full, stderr says the --after of the next one. JSON gives the same
    objects as `kirim status --json`.

    \b
    Examples:
      kirim list --status in_doubt
      kirim list --channel push --limit 100 --after 200 --json
      kirim list --oldest-first --after 200
    """
    state.setup_logging()
    mark = min(after, runner.MAX_ID)

    async def go() -> list[views.Record]:
        async with state.app(read_only=True) as app:
            rows = await app.store.list_deliveries(
                status=None if status_ is None else DeliveryStatus(status_),
                channel=channel,
                after_id=mark if oldest_first else 0,
                before_id=None if oldest_first else (mark or runner.MAX_ID),
                limit=limit,
            )
            return [
                (d, await app.store.get_job(d.id), await app.store.get_attempts(d.id)) for d in rows
            ]

    records = run(go)
    if as_json:
        runner.emit_json([views.delivery_json(r) for r in records])
        return
    runner.show_deliveries(runner.console(), records, title=f"deliveries ({len(records)})")
    if len(records) == limit:
        order = " --oldest-first" if oldest_first else ""
        click.echo(f"more: --after {records[-1][0].id}{order}", err=True)


# -- operating -------------------------------------------------------------------------


@main.group(name="dead-letter")
def dead_letter() -> None:
    """List, retry or cancel dead-lettered deliveries.

    A delivery is dead-lettered when its job is dead: it failed for good, ran out
    of attempts, or is held in doubt for an operator.

    \b
    Examples:
      kirim dead-letter list
      kirim dead-letter retry 42 order-48291-push
      kirim dead-letter cancel 43
    """


@dead_letter.command(name="list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@pass_state
def dead_list(state: State, limit: int, as_json: bool) -> None:
    """List dead-lettered deliveries with their job and attempts.

    \b
    Example:
      kirim dead-letter list --json | jq '.[].last_error'
    """
    state.setup_logging()

    async def go() -> list[views.Record]:
        async with state.app(read_only=True) as app:
            dead = await app.store.dead_letters(limit=limit)
            return [(x.delivery, x.job, await app.store.get_attempts(x.delivery.id)) for x in dead]

    records = run(go)
    if as_json:
        runner.emit_json([views.delivery_json(r) for r in records])
    else:
        runner.show_deliveries(runner.console(), records, title=f"dead letters ({len(records)})")


@dead_letter.command(name="retry")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@pass_state
def dead_retry(state: State, ids: tuple[str, ...]) -> None:
    """Requeue dead-lettered deliveries with a fresh job (ID: delivery id or key).

    This releases any earlier doubt: for a delivery held in doubt, the operator
    accepts that the notification may arrive twice. Exits 1 naming every ID that
    was not dead-lettered.

    \b
    Example:
      kirim dead-letter retry 42 43
    """

    async def action(app: Kirim, record: views.Record) -> str | None:
        d, job, _ = record
        if await app.store.retry_dead(d.id, now=app.clock.now()):
            return None
        return f"not dead-lettered (delivery {d.status}, job {runner.job_status(job)})"

    runner.operate(state, ids, action, "requeued")


@dead_letter.command(name="cancel")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@pass_state
def dead_cancel(state: State, ids: tuple[str, ...]) -> None:
    """Cancel dead-lettered deliveries for good (ID: delivery id or key).

    Exits 1 naming every ID that was not dead-lettered or could not be canceled.

    \b
    Example:
      kirim dead-letter cancel 42
    """

    async def action(app: Kirim, record: views.Record) -> str | None:
        d, job, _ = record
        if job is None or job.status is not JobStatus.DEAD:
            return f"not dead-lettered (delivery {d.status}, job {runner.job_status(job)})"
        if await app.store.cancel(d.id, now=app.clock.now()):
            return None
        return f"cannot be canceled (delivery {d.status})"

    runner.operate(state, ids, action, "canceled")


@main.command()
@click.argument("key_or_id")
@pass_state
def cancel(state: State, key_or_id: str) -> None:
    """Cancel a delivery that is neither in flight nor sent.

    A pending, failed or in-doubt delivery becomes canceled and its jobs stop.
    Exits 1 if the delivery is missing, being sent, or already final.

    \b
    Example:
      kirim cancel order-48291-push
    """

    async def action(app: Kirim, record: views.Record) -> str | None:
        d = record[0]
        if await app.store.cancel(d.id, now=app.clock.now()):
            return None
        return f"cannot be canceled: it is {d.status} (only pending, failed or in_doubt can be)"

    runner.operate(state, (key_or_id,), action, "canceled")


# -- demo, bench -----------------------------------------------------------------------


@main.command()
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
    code = runner.call_extension(run_demo, runner.console(), notifications, workers, seed)
    raise click.exceptions.Exit(int(code or 0))


@main.command()
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def bench(
    state: State,
    bench_database: str | None,
    notifications: int,
    workers: int,
    metrics: bool,
    sync: str | None,
    as_json: bool,
) -> None:
    """Measure enqueue and delivery throughput.

    Notifications go through WORKERS worker processes to a zero-latency
    in-process provider, with the full ledger (delivery, job, attempt). --database
    (here or before the command) picks where: a SQLite file, or a PostgreSQL
    server on which a throw-away database is created and dropped; without it a
    temporary SQLite file is used. The result includes its durability: SQLite's
    journal mode and synchronous setting (--sync), or PostgreSQL's
    synchronous_commit and fsync.

    \b
    Example:
      kirim bench --notifications 10000 --workers 8 --json
      kirim bench --sync normal --workers 2
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
    result = runner.call_extension(run_bench, *args)
    if as_json:
        runner.emit_json(result)
    else:
        runner.show_mapping(runner.console(), result, title="kirim bench")


main.add_command(explore)
