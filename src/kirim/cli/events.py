"""``kirim render``: a notification type's messages for some data, as ``notify_event``
would record them (``kirim.notify``; the configuration only, no database); ``kirim
event``: one event of a type recorded for its recipients (``Kirim.notify_event``)."""

from __future__ import annotations

import json
from typing import Any

import click

from kirim import limits
from kirim.cli import params, runner
from kirim.cli import render as output
from kirim.cli.runner import EXIT_USAGE, State, pass_state
from kirim.notify.fanout import EventResult
from kirim.notify.messages import preview
from kirim.notify.shapes import segments
from kirim.text import visible
from kirim.views import iso


@click.command(name="render")
@click.argument("type_name", metavar="TYPE", type=params.TextParam())
@click.option(
    "--data",
    default="{}",
    show_default=True,
    metavar="JSON",
    help="The event's data: JSON text, @FILE to read a file, - for stdin (a digest "
    "type: one event's data or a list of them).",
)
@click.option(
    "--locale",
    metavar="LOCALE",
    help="Write it for this locale (id, id_ID, pt-BR).  [default: the type's default_locale]",
)
@click.option("--channel", type=params.TextParam(), help="Only this channel's message.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: channel -> payload.")
@pass_state
def render(
    state: State,
    type_name: str,
    data: str,
    locale: str | None,
    channel: str | None,
    as_json: bool,
) -> None:
    """Preview a notification type's messages: its templates rendered per channel.

    TYPE is a [types.NAME] table of kirim.toml. The templates are rendered as
    notify_event renders them (sandboxed, strict: a variable the data lacks is an
    error, exit 2), with each part from the locale's variant, else the type's
    default locale. Nothing is read from or written to the database.

    \b
    Examples:
      kirim render order_shipped --data '{"order_id": "48291"}' --locale id
      kirim render order_shipped --data @event.json --channel email --json
    """
    state.setup_logging()
    value = runner.parse_payload(data, "--data")
    with runner.reported():
        types = state.config().types
        ntype = types.get(type_name)
        if ntype is None:
            known = ", ".join(sorted(types)) or "none in the configuration"
            runner.fail(f"no notification type {type_name!r} (known: {known})", EXIT_USAGE)
        payloads = preview(ntype, value, locale=locale, channel=channel)  # errors: exit 2
    if as_json:
        output.emit_json(payloads)
        return
    for name, payload in payloads.items():
        _show(name, payload)


def _show(channel: str, payload: dict[str, Any]) -> None:
    """One channel's message: a heading, then each part (a text of many lines below
    its name, indented; a service's JSON part as JSON); an SMS's encoding and
    segments, with a warning on stderr past ``SMS_WARN_SEGMENTS``."""
    click.echo(visible(f"[{channel}] locale {payload['locale']}"))
    for part, value in payload.items():
        if part in ("type", "locale"):
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if part == "sms":
            counted = segments(text)
            click.echo(
                f"  sms segments: {counted.segments} ({counted.encoding}, {counted.units} units)"
            )
            if counted.warning is not None:
                click.echo(visible(f"Warning: [{channel}] {counted.warning}"), err=True)
        lines = text.split("\n") or [""]  # other line ends are shown escaped
        if len(lines) == 1:
            click.echo(f"  {part}: {visible(lines[0])}")
        else:
            click.echo(f"  {part}:")
            for line in lines:
                click.echo(f"    {visible(line)}")


@click.command(name="event")
@click.argument("type_name", metavar="TYPE", type=params.TextParam())
@click.option(
    "--event",
    "event_id",
    required=True,
    type=params.TextParam(limit=limits.EVENT_ID),
    help="The business event's id (each delivery's key comes from it).",
)
@click.option(
    "--recipient",
    "recipients",
    required=True,
    multiple=True,
    metavar="ID|JSON",
    help='A recipient id, or {"id": ..., "locale": ..., "to": {CHANNEL: ADDRESS}}. Repeatable.',
)
@click.option(
    "--data",
    default="{}",
    show_default=True,
    metavar="JSON",
    help="The templates' variables: JSON text, @FILE to read a file, - for stdin.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def event(
    state: State,
    type_name: str,
    event_id: str,
    recipients: tuple[str, ...],
    data: str,
    as_json: bool,
) -> None:
    """Record one event of a notification type for its recipients.

    One delivery per recipient and channel of TYPE, rendered now and recorded in
    one transaction (notify_event): each recipient's preferences may suppress
    it (with the reason) or defer it to their send window; throttles and
    digests apply. The same event again creates nothing (created false). A
    template error or a missing variable writes nothing (exit 2).

    \b
    Examples:
      kirim event order_shipped --event order-48291 --recipient u-1007 \\
                  --recipient '{"id": "u-1008", "locale": "id"}' \\
                  --data '{"order_id": "48291"}'
    """
    state.setup_logging()
    value = runner.parse_payload(data, "--data")
    who = [_recipient(r) for r in recipients]

    async def go() -> EventResult:
        async with state.app() as app:
            return await app.notify_event(type_name, who, value, event_id=event_id)

    result = runner.run(go)
    if as_json:
        output.emit_json(result.to_json())
        return
    for d in result.deliveries:
        what = "created" if d.created else "exists"
        why = f" ({d.reason})" if d.reason else ""
        due = "" if d.run_at is None else f", due {iso(d.run_at)}"
        click.echo(
            f"{d.recipient_id} {d.channel}: delivery {d.delivery_id} {what}, {d.status}{why}{due}"
        )


def _recipient(text: str) -> Any:
    """``--recipient``: an id, or a JSON object when it starts with ``{``."""
    if text.lstrip().startswith("{"):
        return runner.parse_payload(text, "--recipient")
    return text
