"""The ``kirim simulate`` click command (loaded by the CLI when used)."""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kirim.cli import params, render, runner
from kirim.cli.runner import EXIT_FAILED, EXIT_USAGE, State, pass_state
from kirim.model import OnUnknown
from kirim.simulate import harness, report
from kirim.simulate.options import (
    CHANNELS,
    STRATEGIES,
    Latency,
    SimOptions,
    parse_latency,
    parse_rate,
    parse_ratios,
)
from kirim.simulate.result import SimResult

HELP = """Measure duplicates and losses under chaos: kirim against the naive flow.

Enqueues --notifications, starts --workers real worker processes (`kirim worker
--burst`, or with --strategy naive the write-up's original flow: claim a job with
a lease, check status = 'pending', send, then set status = 'sent', with no delivery
claim, fencing token, heartbeat, attempt log or idempotency key) and lets them
deliver to a webhook receiver on 127.0.0.1 that records every request per
notification. Meanwhile it injects faults: the receiver answers after --latency,
lets --timeout-rate of the calls time out after accepting them and answers
--error-rate with a 503; --kill-rate and --stall-rate, per delivery, become a
number of SIGKILLs and of SIGSTOP/SIGCONT stalls 1.5-2.5 times the lease, spread
over the run and aimed at a worker with requests in flight (a killed worker is
replaced by a fresh one). The run stops by itself when the queue is drained, or
at --deadline; every process it started is ended.

--clock-skew S runs each worker process on its own clock, off by a random offset
uniform in ±S seconds (seeded by --seed, reported as clock_offsets): kirim keeps
leases, takeover and reaping on the database's clock, the naive flow on the
worker's own. --lookup gives kirim's channel `lookup = true` with the receiver's
GET /lookup/{key} (200 once a request with the key reached the user, else 404),
against a receiver that honours no key; when in doubt kirim asks before resending,
and sends again only when an earlier request can no longer land. The naive
strategy ignores --lookup (it has no lookup).

--channel smtp delivers email instead: kirim's smtp provider (and, with --strategy
naive, a plain aiosmtplib send with a fresh Message-ID each time) to an aiosmtpd
server on 127.0.0.1 that counts the messages a mailbox receives per notification.
Its faults: --error-rate answers 451 to RCPT TO (before any content), --timeout-rate
takes the content and withholds the reply to its final "." past the timeout, and
--latency delays that reply. With --idempotent the server drops a message whose
Message-ID it already has (kirim's is derived from the key; the naive flow then
sends a stable one too).

--channel apns|fcm|webpush|sms delivers through kirim's provider of that service to a
loopback fake of it (APNs over HTTP/2 and TLS, FCM with its OAuth token endpoint, a
Web Push service that decrypts each message, Twilio) that counts what the user's
device shows: a push that carries the collapse id of one the device shows replaces
it, so kirim's resends (the delivery's own collapse id) show once, the naive flow's
(a fresh one per send) show again; an SMS has no collapse. Its faults:
--timeout-rate is half answers lost after delivery, half held past the timeout;
--error-rate half 5xx, half 429 with Retry-After.

\b
The report counts:
  delivered            notifications the receiver saw at least once
  duplicate_requests   requests beyond the first per notification
  duplicates           notifications a user received more than once (with
                       --idempotent the receiver delivers a key once)
  lost                 neither delivered nor reported in doubt or failed
  in_doubt             reported as maybe delivered (assumed sent, or held)
  latency_p50_s/p99_s  from enqueue to the first request at the receiver
  resolved             in doubt, then known sent (a late success, a lookup)
  clock_offsets        each worker's clock offset, seconds (--clock-skew)
  lookups              the receiver's answers to lookups: found, not_found

\b
Databases: SQLite on a temporary file by default. With --database
postgresql://USER@HOST/DB the run creates a throw-away database
kirim_sim_<hex> on that server (the user needs CREATEDB) and drops it at the
end; the database named in the URL is only connected to, never written.

--plot FILE.png sweeps lease / median latency over --ratios for both strategies
(2 runs per ratio, the other knobs as given) and draws duplicates per 1,000
notifications against the ratio; it needs the plot extra (matplotlib).

Exit status: 0 when the run finished (and, for --strategy kirim, kept its
promise: no duplicate unless the channel chose at-least-once, nothing lost,
every doubt reported); 1 when kirim broke it or the deadline passed; 2 on a
usage error. The naive strategy's duplicates are its expected result, not a
failure.

\b
Examples:
  kirim simulate --strategy naive --kill-rate 0.01 --stall-rate 0.01 --seed 7
  kirim simulate --notifications 2000 --workers 4 --lease 2 \\
      --latency lognormal:0.2:3 --kill-rate 0.01 --stall-rate 0.01 --json
  kirim simulate --database postgresql://postgres@127.0.0.1/postgres --idempotent
  kirim simulate --lease 1 --clock-skew 3 --kill-rate 0.01 --stall-rate 0.01
  kirim simulate --lookup --timeout-rate 0.05 --kill-rate 0.01 --stall-rate 0.01
  kirim simulate --channel smtp --kill-rate 0.01 --stall-rate 0.01 --seed 1
  kirim simulate --channel apns --timeout-rate 0.05 --kill-rate 0.01 --seed 1
  kirim simulate --notifications 300 --plot sweep.png --ratios 1,2,5,10
"""


def _parsed(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback from a parser that raises ValueError with a readable message."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return callback


SECONDS = click.FloatRange(min=0, min_open=True)


@click.command("simulate", help=HELP)
@click.option(
    "--strategy",
    type=click.Choice(STRATEGIES),
    default="kirim",
    show_default=True,
    help="kirim's worker, or the write-up's naive flow as a baseline.",
)
@click.option("--notifications", type=click.IntRange(min=1), default=500, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Worker processes at once (killed ones are replaced).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Deliveries in flight per worker.",
)
@click.option(
    "--lease",
    type=SECONDS,
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="Job lease of both strategies (kirim renews it by heartbeat; naive does not).",
)
@click.option(
    "--latency",
    metavar="SPEC",
    callback=_parsed(parse_latency),
    default="lognormal:0.2:3",
    show_default=True,
    help="Receiver latency: fixed:S, uniform:A:B or lognormal:MEDIAN:P99 (seconds).",
)
@click.option(
    "--provider-timeout",
    type=SECONDS,
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="The workers' HTTP timeout; a --timeout-rate call is held 0.5s longer.",
)
@click.option(
    "--timeout-rate",
    metavar="RATE",
    callback=_parsed(parse_rate),
    default="0.01",
    show_default=True,
    help="Share of calls the receiver accepts (counts as delivered) and lets time out.",
)
@click.option(
    "--error-rate",
    metavar="RATE",
    callback=_parsed(parse_rate),
    default="0.01",
    show_default=True,
    help="Share of calls answered 503 without being delivered.",
)
@click.option(
    "--kill-rate",
    metavar="RATE",
    callback=_parsed(parse_rate),
    default="0.004",
    show_default=True,
    help="SIGKILLs per delivery (0.01 = one per 100 notifications), mid-send.",
)
@click.option(
    "--stall-rate",
    metavar="RATE",
    callback=_parsed(parse_rate),
    default="0.004",
    show_default=True,
    help="SIGSTOP stalls longer than the lease per delivery, mid-send.",
)
@click.option(
    "--idempotent/--no-idempotent",
    default=False,
    show_default=True,
    help="The receiver honours Idempotency-Key (kirim's channel says so; naive sends the key).",
)
@click.option(
    "--on-unknown",
    type=click.Choice([p.value for p in OnUnknown]),
    default=OnUnknown.ASSUME_SENT.value,
    show_default=True,
    help="kirim's in-doubt policy for a receiver that does not honour keys.",
)
@click.option(
    "--max-attempts", type=click.IntRange(min=1), default=8, show_default=True, metavar="N"
)
@click.option(
    "--clock-skew",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="Each worker process's clock is off by a random offset within ±SECONDS.",
)
@click.option(
    "--lookup",
    is_flag=True,
    help="kirim's channel asks the receiver (lookup = true) before resending; the "
    "receiver honours no key. The naive strategy ignores it.",
)
@click.option(
    "--channel",
    "channel_kind",
    type=click.Choice(CHANNELS),
    default="webhook",
    show_default=True,
    help="Deliver over HTTP to the webhook receiver, email over SMTP to aiosmtpd, or "
    "to a loopback APNs, FCM, Web Push or Twilio (sms) that counts what the device shows.",
)
@click.option(
    "--seed", type=int, help="Seed of the faults, clocks and receiver.  [default: random]"
)
@click.option(
    "--deadline",
    type=SECONDS,
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="Stop the run (exit 1) if the workers have not finished by then.",
)
@click.option(
    "--database",
    "sim_database",
    metavar="URL",
    help="postgresql://… to run on a throw-away database on that server.  [default: SQLite]",
)
@click.option(
    "--logs",
    type=params.PathParam(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Keep the workers' logs (and the SQLite file) in DIR, for `kirim analyze`.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--plot",
    "plot_path",
    type=params.PathParam(dir_okay=False, path_type=Path),
    metavar="FILE.png",
    help="Sweep the lease/latency ratio for both strategies and draw duplicates per 1,000.",
)
@click.option(
    "--ratios",
    metavar="LIST",
    callback=_parsed(parse_ratios),
    default="1,2,5,10,20,50",
    show_default=True,
    help="Lease / median latency values of the --plot sweep.",
)
@pass_state
def simulate(
    state: State,
    strategy: str,
    notifications: int,
    workers: int,
    concurrency: int,
    lease: float,
    latency: Latency,
    provider_timeout: float,
    timeout_rate: float,
    error_rate: float,
    kill_rate: float,
    stall_rate: float,
    idempotent: bool,
    on_unknown: str,
    max_attempts: int,
    clock_skew: float,
    lookup: bool,
    channel_kind: str,
    seed: int | None,
    deadline: float,
    sim_database: str | None,
    logs: Path | None,
    as_json: bool,
    plot_path: Path | None,
    ratios: tuple[float, ...],
) -> None:
    state.setup_logging()
    database = sim_database or state.database
    if database is not None and not database.startswith(("postgresql:", "postgres:")):
        runner.fail(
            f"--database {database!r}: simulate takes a postgresql:// URL "
            "(SQLite runs on a temporary file by default)",
            EXIT_USAGE,
        )
    opts = SimOptions(
        strategy="naive" if strategy == "naive" else "kirim",
        database=database,
        notifications=notifications,
        workers=workers,
        concurrency=concurrency,
        lease=lease,
        latency=latency,
        provider_timeout=provider_timeout,
        timeout_rate=timeout_rate,
        error_rate=error_rate,
        kill_rate=kill_rate,
        stall_rate=stall_rate,
        idempotent=idempotent,
        on_unknown=OnUnknown(on_unknown),
        max_attempts=max_attempts,
        seed=random.randrange(1 << 30) if seed is None else seed,
        deadline=deadline,
        clock_skew=clock_skew,
        lookup=lookup,
        channel=next(c for c in CHANNELS if c == channel_kind),
    )
    try:
        opts.validate()
    except ValueError as exc:
        runner.fail(str(exc), EXIT_USAGE)
    out = render.console()
    if plot_path is not None:
        with runner.reported():
            report.check_plotting()
        _sweep(out, opts, ratios, plot_path, as_json)
        return
    with runner.reported(), _progress(f"{opts.strategy}") as progress:
        result = harness.simulate(opts, progress=progress, logs=logs)
    if as_json:
        render.emit_json(result.as_json())
    else:
        report.show(out, result)
    if result.promise_kept is False or result.timed_out:
        raise click.exceptions.Exit(EXIT_FAILED)


def _sweep(
    out: Console, opts: SimOptions, ratios: tuple[float, ...], path: Path, as_json: bool
) -> None:
    err = Console(stderr=True, highlight=False)

    def said(ratio: float, r: SimResult) -> None:
        err.print(
            f"lease/latency {ratio:g} (lease {r.lease:g}s) {r.strategy}: "
            f"{r.duplicates} duplicates, {r.lost} lost in {r.seconds:.1f}s"
        )

    try:
        with runner.reported():
            runs = harness.sweep(opts, ratios, on_run=said)
    except ValueError as exc:
        runner.fail(str(exc), EXIT_USAGE)
    subtitle = (
        f"{opts.notifications} notifications, {opts.workers} workers × {opts.concurrency}, "
        f"latency {opts.latency}, seed {opts.seed}\n"
        f"per delivery: kills {opts.kill_rate:g}, stalls {opts.stall_rate:g}, "
        f"timeouts {opts.timeout_rate:g}, 503s {opts.error_rate:g}; "
        f"{'idempotent' if opts.idempotent else 'non-idempotent'} receiver"
        + (f", clock skew ±{opts.clock_skew:g}s" if opts.clock_skew else "")
        + (", kirim with lookup" if opts.lookup else "")
    )
    report.plot(runs, path, subtitle=subtitle)
    if as_json:
        render.emit_json(report.sweep_json(runs, str(path)))
    else:
        report.show_sweep(out, runs, str(path))
    if any(r.promise_kept is False or r.timed_out for _, r in runs):
        raise click.exceptions.Exit(EXIT_FAILED)


@contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None] | None]:
    """Progress on stderr while the run goes: a bar on a terminal, else a line every
    few seconds (and the last one), so that a log or CI shows the run is alive."""
    if not sys.stderr.isatty():
        yield _progress_lines(label)
        return
    columns = (TextColumn(f"delivering ({label})"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as p:
        task = p.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            p.update(task, completed=done, total=total)

        yield update


def _progress_lines(label: str, every: float = 2.0) -> Callable[[int, int], None]:
    """``update(done, total)`` that prints ``simulate (kirim): 120/500 delivered, 3.2s``
    on stderr at most every ``every`` seconds, and when ``done`` reaches ``total``."""
    started = time.monotonic()
    last = {"at": float("-inf"), "done": -1}

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        finished = done >= total and last["done"] < total
        if not finished and (now - last["at"] < every or done == last["done"]):
            return
        last["at"], last["done"] = now, done
        with contextlib.suppress(OSError, ValueError):  # nobody reads stderr: go on
            print(
                f"simulate ({label}): {done}/{total} delivered, {now - started:.1f}s",
                file=sys.stderr,
                flush=True,
            )

    return update
