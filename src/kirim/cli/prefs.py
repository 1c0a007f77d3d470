"""``kirim prefs show|set|clear``: recipients' preferences (``kirim.preferences``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import click

from kirim import limits
from kirim.cli import params, render, runner
from kirim.cli.runner import State, pass_state
from kirim.preferences import Preferences, Window, check_known, check_pattern, check_timezone
from kirim.text import visible
from kirim.validation import BadValue, shown
from kirim.views import iso, preferences_json

_SWITCH = {"on": True, "off": False, "unset": None}
_NONE = "none"


# -- the command line ------------------------------------------------------------------


@click.group(name="prefs")
def prefs() -> None:
    """Show, set or clear a recipient's preferences.

    A recipient (the id given to notify_event or POST /v1/events) may opt out of
    everything, turn a type off or on per channel, and have quiet hours in its own
    time zone. Deliveries already queued follow a change when a worker claims them:
    a suppressed one is recorded `suppressed` with the reason. Critical types ignore
    opt-outs and quiet hours.

    \b
    Examples:
      kirim prefs set u-1007 --timezone Asia/Jakarta --quiet-hours 22:00-07:00
      kirim prefs set u-1007 --channel order_shipped:sms=off --channel '*:push=on'
      kirim prefs show u-1007 --json
      kirim prefs clear u-1007
    """


@prefs.command(name="show")
@click.argument("recipient_id", type=params.TextParam(limit=limits.RECIPIENT_ID))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def show_cmd(state: State, recipient_id: str, as_json: bool) -> None:
    """Print a recipient's preferences. Exits 1 when it has none (each type's defaults
    apply to it then).

    \b
    Example:
      kirim prefs show u-1007
    """
    state.setup_logging()

    async def go() -> Preferences | None:
        async with state.app() as app:
            return await app.preferences(recipient_id)

    found = runner.run(go)
    if found is None:
        runner.fail(f"recipient {recipient_id!r} has no preferences (each type's defaults apply)")
    if as_json:
        render.emit_json(preferences_json(found))
        return
    for line in describe(found):
        click.echo(visible(line))


@prefs.command(name="set")
@click.argument("recipient_id", type=params.TextParam(limit=limits.RECIPIENT_ID))
@click.option(
    "--opt-out/--opt-in",
    "opt_out",
    default=None,
    help="Opt out of everything (critical types still go), or back in.",
)
@click.option(
    "--channel",
    "channels",
    multiple=True,
    metavar="TYPE:CHANNEL=on|off|unset",
    help="A type on a channel on or off (TYPE or CHANNEL may be *; the most specific "
    "wins, and beats the type's default); unset forgets it. Repeatable.",
)
@click.option(
    "--timezone",
    metavar="ZONE",
    help="IANA time zone of the quiet hours and the types' send windows, such as "
    "Asia/Jakarta; none: UTC.",
)
@click.option(
    "--quiet-hours",
    metavar="HH:MM-HH:MM",
    help="Nothing but critical types is sent then (22:00-07:00 spans midnight); "
    "deliveries wait for the end. none: no quiet hours.",
)
@click.option("--replace", is_flag=True, help="Start from the defaults, not from what is stored.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@pass_state
def set_cmd(
    state: State,
    recipient_id: str,
    opt_out: bool | None,
    channels: Sequence[str],
    timezone: str | None,
    quiet_hours: str | None,
    replace: bool,
    as_json: bool,
) -> None:
    """Change a recipient's preferences: what the options name, the rest as stored
    (with --replace, the rest at its default). Prints the result.

    \b
    Examples:
      kirim prefs set u-1007 --opt-out
      kirim prefs set u-1007 --channel 'digest_weekly:*=off' --quiet-hours none
    """
    state.setup_logging()
    with runner.reported():
        changes = _changes(opt_out, timezone, quiet_hours)
        switches = [_switch(text) for text in channels]

    async def go() -> Preferences:
        async with state.app() as app:
            named = [pattern for pattern, on in switches if on is not None]
            check_known(named, types=app.types, channels=app.channel_names)
            stored = None if replace else await app.preferences(recipient_id)
            base = stored or Preferences(recipient_id=recipient_id)
            table = dict(base.channels)
            for pattern, on in switches:
                if on is None:
                    table.pop(pattern, None)
                else:
                    table[pattern] = on
            wanted = dataclasses.replace(base, channels=table, **changes)
            return await app.set_preferences(wanted)

    done = runner.run(go)
    if as_json:
        render.emit_json(preferences_json(done))
        return
    for line in describe(done):
        click.echo(visible(line))


@prefs.command(name="clear")
@click.argument("recipient_id", type=params.TextParam(limit=limits.RECIPIENT_ID))
@pass_state
def clear_cmd(state: State, recipient_id: str) -> None:
    """Forget a recipient's preferences (each type's defaults apply again). Exits 1 when
    it had none.

    \b
    Example:
      kirim prefs clear u-1007
    """
    state.setup_logging()

    async def go() -> bool:
        async with state.app() as app:
            return await app.delete_preferences(recipient_id)

    if not runner.run(go):
        runner.fail(f"recipient {recipient_id!r} has no preferences")
    click.echo(f"preferences of {recipient_id!r} cleared")


# -- parts -----------------------------------------------------------------------------


def describe(p: Preferences) -> list[str]:
    """The preferences as lines of text."""
    lines = [
        f"recipient    {p.recipient_id}  (updated {iso(p.updated_at)})",
        f"opt_out      {'yes' if p.opt_out else 'no'}",
        f"timezone     {p.timezone or 'UTC (none set)'}",
        f"quiet_hours  {p.quiet_hours or 'none'}",
    ]
    entries = sorted(p.channels.items())
    if not entries:
        return [*lines, "channels     none set (each type's defaults)"]
    for i, (pattern, on) in enumerate(entries):
        lines.append(f"{'channels' if i == 0 else '':<12} {pattern} {'on' if on else 'off'}")
    return lines


def _changes(opt_out: bool | None, timezone: str | None, quiet_hours: str | None) -> dict[str, Any]:
    """The fields the options set (BadValue naming the option for a bad one)."""
    changes: dict[str, Any] = {}
    if opt_out is not None:
        changes["opt_out"] = opt_out
    if timezone is not None:
        try:
            changes["timezone"] = None if timezone == _NONE else check_timezone(timezone)
        except BadValue as exc:
            raise BadValue("--timezone", exc.reason) from None
    if quiet_hours is not None:
        none = quiet_hours == _NONE
        changes["quiet_hours"] = None if none else Window.parse(quiet_hours, "--quiet-hours")
    return changes


def _switch(text: str) -> tuple[str, bool | None]:
    """``TYPE:CHANNEL=on|off|unset`` as (pattern, on/off/None)."""
    pattern, sep, value = text.rpartition("=")
    if not sep or value.lower() not in _SWITCH:
        raise BadValue("--channel", f"must be TYPE:CHANNEL=on|off|unset, not {shown(text)}")
    try:
        check_pattern(pattern)
    except BadValue as exc:
        raise BadValue("--channel", f"{shown(pattern)} {exc.reason}") from None
    return pattern, _SWITCH[value.lower()]
