"""``kirim send``, ``status``, ``list`` and ``cancel``: one delivery or many, by the engine's
operator verbs."""

from __future__ import annotations

import contextlib

import click

from kirim import limits, views
from kirim.addresses import Address
from kirim.cli import params, render, runner, tables
from kirim.cli.runner import State, pass_state, run
from kirim.engine import Kirim, Notification
from kirim.errors import KirimError, NotFound
from kirim.keys import text_problem
from kirim.model import DeliveryStatus, RecordFilter
from kirim.operations import Page, not_found
from kirim.store.imports import IMPORTED
from kirim.text import visible
from kirim.topics import check_topic
from kirim.validation import MAX_ID, BadValue
from kirim.views import iso


@click.command()
@click.option(
    "--event",
    "event_id",
    required=True,
    type=params.TextParam(limit=limits.EVENT_ID),
    help="The business event's id.",
)
@click.option(
    "--recipient",
    required=True,
    type=params.TextParam(limit=limits.RECIPIENT),
    help="Who receives it (a user id, an address).",
)
@click.option(
    "--channel",
    required=True,
    type=params.TextParam(limit=limits.CHANNEL),
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
        render.emit_json(
            {
                "delivery_id": n.delivery_id,
                "idempotency_key": n.idempotency_key,
                "created": n.created,
                "status": str(n.status),
                "pruned": n.pruned,
            }
        )
    elif n.pruned and n.delivery_id == IMPORTED:
        click.echo(
            f"key {n.idempotency_key} was imported as already sent (kirim import-keys): not created"
        )
    elif n.pruned:
        click.echo(
            f"delivery {n.delivery_id} was pruned, its key kept (a tombstone): not created, "
            f"status {n.status}, key {n.idempotency_key}"
        )
    else:
        what = "created" if n.created else "already exists (same idempotency key), not created"
        key = visible(n.idempotency_key)
        click.echo(f"delivery {n.delivery_id} {what}: status {n.status}, key {key}")


# -- reading ---------------------------------------------------------------------------


@click.command()
@click.argument("key_or_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def status(state: State, key_or_id: str | None, as_json: bool) -> None:
    """Show one delivery, its job and every attempt as a timeline.

    KEY_OR_ID is the delivery's idempotency key, else its id, else the event id
    of its notification; id:N is always the id, key:K always the key and
    event:E always an event id (so that a key of digits is never taken for an
    id, nor an id for such a key). An event with several deliveries (one per
    recipient and channel) shows each, newest first (--json: a list of them).
    A missing delivery exits 1. JSON times are ISO-8601 UTC strings.
    run:N shows a workflow run as its steps; topic:T a topic, its subscriber
    count and its latest fan-outs (pending, expanding or done, how far each
    got); a key that begins so is key:K. Without KEY_OR_ID: the topics at a
    glance (how many topics and subscriptions, topic events pending fan-out,
    expanding and done).

    \b
    Examples:
      kirim status 42
      kirim status id:42
      kirim status key:48291 --json
      kirim status event:order-48291
      kirim status order-48291-push --json | jq '.attempts[].status'
      kirim status run:7           # a workflow run's steps (kirim run show 7)
      kirim status topic:project:42  # a topic (kirim topics show project:42)
      kirim status --json          # the topics at a glance
    """
    state.setup_logging()
    if key_or_id is None or key_or_id.startswith("topic:"):  # topics (kirim.cli.topics)
        from kirim.cli.topics import show_counts, show_topic

        if key_or_id is None:
            show_counts(state, as_json)
            return
        try:
            name = check_topic(key_or_id[6:])
        except BadValue as exc:
            raise click.BadParameter(f"topic:T: {exc.reason}", param_hint="KEY_OR_ID") from None
        show_topic(state, name, 10, as_json)
        return
    if key_or_id.startswith("run:"):  # a workflow run, as its steps (kirim.cli.runs)
        from kirim.cli.runs import show_run

        if not key_or_id[4:].isdigit() or int(key_or_id[4:]) < 1:
            raise click.BadParameter("run:N takes a run's id", param_hint="KEY_OR_ID")
        show_run(state, int(key_or_id[4:]), as_json)
        return
    event = key_or_id.startswith("event:")
    value, by = runner.delivery_ref(key_or_id)
    if event:
        value, by = key_or_id[6:], "auto"

    retired: dict[int, Address] = {}

    async def go() -> list[views.Record]:
        async with state.app(read_only=True) as app:
            if not event:
                found = await app.get(value, by=by)
                if found is not None:
                    retired.update(await _retired(app, [found]))
                    return [found]
            records = [] if by != "auto" else await _of_event(app, value)
            if not records:
                if event:
                    raise NotFound(f"no delivery of event {value!r}")
                if by != "auto":
                    raise NotFound(not_found(value, by))
                raise NotFound(f"{not_found(value, by)}, nor of that event id")
            retired.update(await _retired(app, records))
            return records

    records = run(go)
    if as_json:
        shown = [views.delivery_json(r) for r in records]
        for item, record in zip(shown, records, strict=True):
            gone = retired.get(record.delivery.id)
            if gone is not None:
                item["address_retired"] = {
                    "at": iso(gone.retired_at),
                    "reason": gone.retired_reason,
                }
        render.emit_json(shown[0] if len(shown) == 1 else shown)
        return
    for i, record in enumerate(records):
        if i:
            click.echo()
        tables.show_status(render.console(), record)
        gone = retired.get(record.delivery.id)
        if gone is not None:
            click.echo(
                visible(
                    f"address retired {iso(gone.retired_at)}: {gone.retired_reason} "
                    "(no later delivery uses it)"
                )
            )


async def _retired(app: Kirim, records: list[views.Record]) -> dict[int, Address]:
    """The retired address of each delivery whose recipient's address was retired
    (``kirim.addresses``), by delivery id."""
    out: dict[int, Address] = {}
    for record in records:
        d = record.delivery
        if d.recipient_id is None:
            continue
        with contextlib.suppress(KirimError):
            for a in await app.store.list_addresses(d.recipient_id):
                if a.retired and a.channel == d.channel and a.address == d.recipient:
                    out[d.id] = a
    return out


async def _of_event(app: Kirim, event_id: str) -> list[views.Record]:
    """The deliveries of one event (newest first, at most 50), with their jobs and
    attempts: the dashboard's search, kept to the event id."""
    if text_problem(event_id) is not None:  # no stored event id has a NUL or a surrogate
        return []
    found = [d for d in await app.store.search_deliveries(event_id) if d.event_id == event_id]
    records = [await app.get(d.id, by="id") for d in found]
    return [r for r in records if r is not None]


@click.command(name="list")
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
    older deliveries, ids below it; with --oldest-first, ids above it). When there
    is more, stderr says the --after of the next one. JSON gives the same
    objects as `kirim status --json`.

    \b
    Examples:
      kirim list --status in_doubt
      kirim list --channel push --limit 100 --after 200 --json
      kirim list --oldest-first --after 200
    """
    state.setup_logging()
    mark = min(after, MAX_ID)

    async def go() -> Page:
        async with state.app(read_only=True) as app:
            where = RecordFilter(
                status=None if status_ is None else DeliveryStatus(status_),
                channel=channel,
                oldest_first=oldest_first,
            )
            return await app.records(where, cursor=mark or None, limit=limit)

    page = run(go)
    if as_json:
        render.emit_json([views.delivery_json(r) for r in page.records])
        return
    title = f"deliveries ({len(page.records)})"
    tables.show_deliveries(render.console(), page.records, title=title)
    if page.next_cursor is not None:
        order = " --oldest-first" if oldest_first else ""
        click.echo(f"more: --after {page.next_cursor}{order}", err=True)


@click.command()
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

    async def action(app: Kirim, key_or_id: str) -> views.Record:
        return await app.cancel(key_or_id)

    runner.operate(state, (key_or_id,), action, "canceled")


@click.command()
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@pass_state
def reconcile(state: State, ids: tuple[str, ...]) -> None:
    """Ask the provider whether it has a delivery in doubt, and settle the doubt.

    For a delivery held in doubt or sent under an assumption, on a channel whose
    provider can be asked (lookup): found, it is sent (doubt resolved); not found,
    once no earlier request can still land, it goes back to the queue while its job
    has attempts left (to a fallback channel when its own refused it for good), else
    it is failed (doubt resolved), and a `kirim dead-letter retry` then sends it
    without any risk of a second copy.
    Exits 1 naming every ID it could not settle, and why (try again later when an
    earlier request may still land).

    \b
    Example:
      kirim reconcile 42
    """

    async def action(app: Kirim, key_or_id: str) -> views.Record:
        return await app.reconcile(key_or_id)

    runner.operate(state, ids, action, "reconciled")
