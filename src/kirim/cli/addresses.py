"""``kirim addresses list|add|remove|retire``: recipients' addresses (``kirim.addresses``)."""

from __future__ import annotations

import click

from kirim import limits
from kirim.addresses import Address
from kirim.cli import params, render, runner
from kirim.cli.runner import State, pass_state
from kirim.text import visible
from kirim.views import iso


@click.group(name="addresses")
def addresses() -> None:
    """List, add, remove or retire a recipient's addresses.

    A recipient (the id given to notify_event or POST /v1/events) has addresses per
    channel: an email, an E.164 phone, APNs or FCM device tokens, Web Push
    subscriptions (their JSON), Slack ids. An event to it on a channel goes to each
    of its addresses there, a delivery each. A token the service calls dead is
    retired by the worker (kept, marked, never used again); adding it again
    registers it anew.

    \b
    Examples:
      kirim addresses add u-1007 ios 6a1f…e3 --label "Ana's iPhone"
      kirim addresses add u-1007 sms +6281234567890
      kirim addresses list u-1007 --json
      kirim addresses retire ios 6a1f…e3 --reason "app uninstalled"
    """


def _line(a: Address) -> str:
    state = f"retired {iso(a.retired_at)}: {a.retired_reason}" if a.retired else "in use"
    label = f" ({a.label})" if a.label else ""
    return f"{a.channel}  {a.address}{label}  {state}"


@addresses.command(name="list")
@click.argument("recipient_id", type=params.TextParam(limit=limits.RECIPIENT_ID))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def list_cmd(state: State, recipient_id: str, as_json: bool) -> None:
    """Print every address of a recipient, retired ones marked.

    \b
    Example:
      kirim addresses list u-1007
    """

    async def go() -> list[Address]:
        async with state.app() as app:
            return await app.addresses(recipient_id)

    found = runner.run(go)
    if as_json:
        render.emit_json({"recipient_id": recipient_id, "addresses": [a.to_json() for a in found]})
        return
    if not found:
        click.echo(visible(f"recipient {recipient_id!r} has no addresses"))
    for a in found:
        click.echo(visible(_line(a)))


@addresses.command(name="add")
@click.argument("recipient_id", type=params.TextParam(limit=limits.RECIPIENT_ID))
@click.argument("channel", type=params.TextParam(limit=limits.CHANNEL))
@click.argument("address", type=params.TextParam(limit=limits.RECIPIENT))
@click.option("--label", type=params.TextParam(limit=limits.CHANNEL), help="A name for it.")
@pass_state
def add_cmd(state: State, recipient_id: str, channel: str, address: str, label: str | None) -> None:
    """Add an address (checked as the channel's provider takes it).

    \b
    Example:
      kirim addresses add u-1007 sms +6281234567890
    """

    async def go() -> Address:
        async with state.app() as app:
            return await app.add_address(recipient_id, channel, address, label=label)

    click.echo(visible(_line(runner.run(go))))


@addresses.command(name="remove")
@click.argument("recipient_id", type=params.TextParam(limit=limits.RECIPIENT_ID))
@click.argument("channel", type=params.TextParam(limit=limits.CHANNEL))
@click.argument("address", type=params.TextParam(limit=limits.RECIPIENT))
@pass_state
def remove_cmd(state: State, recipient_id: str, channel: str, address: str) -> None:
    """Forget one address of a recipient. Exits 1 when it has none such.

    \b
    Example:
      kirim addresses remove u-1007 sms +6281234567890
    """

    async def go() -> bool:
        async with state.app() as app:
            return await app.remove_address(recipient_id, channel, address)

    if not runner.run(go):
        runner.fail(f"recipient {recipient_id!r} has no such address on {channel!r}")
    click.echo("removed")


@addresses.command(name="retire")
@click.argument("channel", type=params.TextParam(limit=limits.CHANNEL))
@click.argument("address", type=params.TextParam(limit=limits.RECIPIENT))
@click.option("--reason", default="retired by an operator", show_default=True, help="Why.")
@pass_state
def retire_cmd(state: State, channel: str, address: str, reason: str) -> None:
    """Retire an address on a channel for every recipient that has it, as the worker
    does when the service calls it dead.

    \b
    Example:
      kirim addresses retire ios 6a1f…e3 --reason "app uninstalled"
    """

    async def go() -> int:
        async with state.app() as app:
            return await app.retire_address(channel, address, reason=reason)

    click.echo(f"retired {runner.run(go)}")
