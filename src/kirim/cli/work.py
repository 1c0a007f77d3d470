"""``kirim worker``: run a worker until a signal (or, with ``--burst``, until no work is left)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from typing import Any

import click

from kirim.cli import params, render
from kirim.cli.runner import State, pass_state, run
from kirim.errors import ConfigError
from kirim.observe.logging import get_logger
from kirim.store.pooler import Wakeups
from kirim.worker.settings import RULES as WORKER_RULES

# -- worker ----------------------------------------------------------------------------


def _finite_offset(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """``worker --clock-offset``: a finite number of seconds (not inf or nan)."""
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value!r} is not a finite number of seconds", ctx, param)
    return value


@click.command()
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
    channel with its provider and in-doubt policy, the lease and concurrency, where
    it listens for wake-ups; one worker_banner line with --log-format json); a
    LISTEN through a pooler or proxy is warned of (listen_through_pooler: set
    listen_url). Logs go to stderr (logfmt, or JSON
    lines with --log-format json). Options not given come from the [worker]
    table of the config file.

    --burst exits once no job is due, running, or waiting for a retry anywhere:
    a notification sent with a later send_after does not keep it alive (a
    later `kirim worker --burst`, or a long-running worker, delivers it). While
    it waits it says for what, in a burst_waiting line when that changes (and
    every 15 s): the retries and when the first is due, the deliveries running
    and when the last lease ends, the jobs scheduled later that it leaves;
    burst_done says what it left.

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
            # the handlers first: a SIGTERM once the banner is out stops the worker gracefully
            loop = asyncio.get_running_loop()
            installed = []

            def on_signal(sig: signal.Signals) -> None:
                w.stop()  # first: nothing (a log line to a closed pipe) may come between
                log.warning("signal_received", signal=sig.name, grace_s=settings.shutdown_grace)

            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, on_signal, sig)
                    installed.append(sig)
            facts = render.worker_facts(app, w, burst=burst, metrics_url=metrics_url)
            if state.log_format == "json":
                log.info("worker_banner", **facts)
            else:
                render.show_banner(facts)
            pooled = getattr(app.store, "wakeups", None)
            warning = pooled.warning() if isinstance(pooled, Wakeups) else None
            if warning is not None:
                log.warning("listen_through_pooler", reason=warning)
            if clock_offset is not None:
                log.info("clock_offset", seconds=clock_offset)
            if metrics is not None:
                log.info("metrics_serving", url=metrics_url)
            try:
                await w.run(burst=burst)
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)
                if metrics is not None:
                    metrics.close()

    run(go)
