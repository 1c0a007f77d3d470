"""``kirim prune``: delete finished deliveries older than the retention, in batches,
keeping their keys a while longer as tombstones (``kirim.store.retention``), and the
workflow runs over, topic events fanned out and ended subscriptions
(``kirim.store.retention_records``)."""

from __future__ import annotations

import click

from kirim.cli import params, render, runner
from kirim.store.retention import BATCH, PruneResult
from kirim.text import plural
from kirim.worker.settings import RULES as WORKER_RULES


def _line(result: PruneResult) -> str:
    return (
        f"{plural(result.deliveries, 'delivery')} ({plural(result.jobs, 'job')}, "
        f"{plural(result.attempts, 'attempt')}, {plural(result.requests, 'HTTP request row')}), "
        f"{plural(result.tombstones_expired, 'expired key')}"
    )


def summary(result: PruneResult) -> str:
    kept = plural(result.tombstones_written, "key")
    one = result.tombstones_written == 1
    if result.dry_run:
        return (
            f"would prune {_line(result)}; {kept} would be kept "
            f"{'as a tombstone' if one else 'as tombstones'}{_notify_line(result)} "
            "(nothing was deleted: --dry-run)"
        )
    return (
        f"pruned {_line(result)}; {kept} kept {'as a tombstone' if one else 'as tombstones'}"
        f"{_notify_line(result)}"
    )


def _notify_line(result: PruneResult) -> str:
    """The notification layer's rows (digests, their events, throttle counters, feed
    messages), when there were any, then the runs' and topics' (``_records_line``)."""
    records = _records_line(result)
    if not (
        result.digests
        or result.digest_events
        or result.digest_events_expired
        or result.throttle_expired
        or result.feed_items
    ):
        return records
    return (
        f"; {plural(result.digests, 'digest')} ({plural(result.digest_events, 'event')} "
        f"emptied, {result.digest_events_expired:,} expired), "
        f"{plural(result.throttle_expired, 'throttle counter')}, "
        f"{plural(result.feed_items, 'feed message')}{records}"
    )


def _records_line(result: PruneResult) -> str:
    """Workflow runs, topic events, subscriptions and their tombstones, when any."""
    if not (
        result.runs
        or result.run_digests
        or result.topic_events
        or result.subscriptions
        or result.record_tombstones_expired
    ):
        return ""
    windows = f", {plural(result.run_digests, 'digest window')}" if result.run_digests else ""
    return (
        f"; {plural(result.runs, 'run')} ({plural(result.run_steps, 'step')}{windows}), "
        f"{plural(result.topic_events, 'topic event')}, "
        f"{plural(result.subscriptions, 'ended subscription')}, "
        f"{plural(result.record_tombstones_expired, 'expired run or topic event key')}"
    )


@click.command()
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
@click.option(
    "--keep",
    metavar="DURATION",
    type=params.DurationParam(WORKER_RULES["retention_keep"]),
    help="Prune deliveries finished longer ago than this (30d, 12h, 90m, or seconds).  "
    "[default: the config's [retention] keep]",
)
@click.option(
    "--keys",
    metavar="DURATION",
    type=params.DurationParam(WORKER_RULES["retention_keys"]),
    help="How long after the prune a pruned delivery's key still creates nothing.  "
    "[default: the config's [retention] keys, else 365d]",
)
@click.option(
    "--archived",
    metavar="DURATION",
    type=params.DurationParam(WORKER_RULES["retention_archived"]),
    help="Prune archived (and deleted) feed messages archived longer ago than this, "
    "if sooner than --keep.  [default: the config's [retention] archived, else --keep]",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=BATCH,
    show_default=True,
    help="Deliveries deleted per transaction.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@runner.pass_state
def prune(
    state: runner.State,
    dry_run: bool,
    keep: float | None,
    keys: float | None,
    archived: float | None,
    batch: int,
    as_json: bool,
) -> None:
    """Delete finished deliveries older than the retention; keep their keys a while.

    A delivery goes with its jobs, attempts and HTTP request rows when it is
    sent, failed or canceled (never in_doubt), has no active job, no attempt that
    may still land, and was last changed more than --keep ago. Its idempotency
    key stays (as its sha256, a tombstone) for --keys more: a notification with
    that key still creates nothing. The in-app inbox's feed messages go --keep
    after they came, archived ones --archived after they were archived (never
    while their delivery has an attempt that may still land). A workflow run
    goes with its steps once it is over (done, or canceled with nothing to come
    back for) and none of its deliveries is kept (they go only once it is over);
    a topic event once fully fanned out; a subscription ended --keep ago once no
    fan-out reads it. A pruned run's and topic event's keys stay for --keys: the
    event given again starts nothing. Deletes in batches of --batch, one
    transaction each, with a line per batch on stderr. Without --keep and
    without [retention] keep in the config, exits 2. The worker prunes by itself
    every minute when [retention] keep is set.

    \b
    Examples:
      kirim prune --dry-run --keep 30d
      kirim prune --keep 90d --keys 365d
      kirim prune --json
    """
    state.setup_logging()
    with runner.reported():
        worker = state.config().worker
    keep = worker.retention_keep if keep is None else keep
    keys = worker.retention_keys if keys is None else keys
    archived = worker.retention_archived if archived is None else archived
    if keep is None:
        runner.fail(
            "no retention to prune by: give --keep (such as --keep 30d) or set keep in "
            'the config\'s [retention] table (keep = "30d")',
            runner.EXIT_USAGE,
        )

    async def go() -> PruneResult:
        async with state.app(read_only=dry_run) as app:
            store = app.store
            if dry_run:
                return await store.prune(
                    now=app.clock.now(), keep=keep, keys=keys, dry_run=True, archived=archived
                )
            total, n = PruneResult(), 0
            while True:
                done = await store.prune(
                    now=app.clock.now(), keep=keep, keys=keys, limit=batch, archived=archived
                )
                total, n = total + done, n + 1
                click.echo(f"prune: batch {n}: {_line(done)}", err=True)
                if not done.more or not done.removed_anything:
                    return total

    result = runner.run(go)
    if as_json:
        render.emit_json(
            {**result.as_dict(), "keep_s": keep, "keys_s": keys, "archived_s": archived}
        )
    else:
        click.echo(summary(result))
