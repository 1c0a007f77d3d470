"""``kirim run show|cancel|list``: workflow runs as their steps on one timeline
(``kirim.runs.timeline``; docs/workflows.md)."""

from __future__ import annotations

from typing import Any

import click

from kirim.cli import render
from kirim.cli.runner import State, pass_state
from kirim.cli.runner import run as run_async
from kirim.runs import RunStatus, run_json
from kirim.workflows import canceled_json


@click.group(name="run")
def run() -> None:
    """Workflow runs: one per event and recipient of a type with steps."""


@run.command()
@click.argument("run_id", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def show(state: State, run_id: int, as_json: bool) -> None:
    """Show a run as its steps on one timeline: what ran (each send with its
    delivery's status now), what waits until when (a delay until a time of the
    recipient's day: in their local time and zone), what was skipped and why.

    \b
    Example:
      kirim run show 42
      kirim status run:42          # the same
    """
    show_run(state, run_id, as_json)


def show_run(state: State, run_id: int, as_json: bool) -> None:
    """``kirim run show`` (and ``kirim status run:N``)."""

    async def body() -> dict[str, Any]:
        async with state.app(read_only=True) as app:
            return run_json(await app.must_get_run(run_id))

    shown = run_async(body)
    if as_json:
        render.emit_json(shown)
        return
    click.echo(
        f"run {shown['id']}  {shown['type']}  event {shown['event_id']}  "
        f"recipient {shown['recipient_id']}  {shown['status']}"
        + (f" ({shown['why']})" if shown["why"] else "")
    )
    if shown.get("unreadable"):
        click.echo(f"  its steps are a newer kirim's: {shown['unreadable']}")
    for step in shown["steps"]:
        click.echo("  " + _line(step))


def _line(step: dict[str, Any]) -> str:
    kind = step["kind"]
    what = {
        "send": f"send {step.get('channel')}",
        "delay": f"delay until {step['time_of_day']}"
        if step.get("time_of_day")
        else f"delay {step.get('seconds', 0):g}s",
        "branch": f"branch {step.get('condition')}"
        + (f" on {step['step']}" if step.get("step") else ""),
        "digest": f"digest {step.get('window', 0):g}s"
        + (f" by {step['key']}" if step.get("key") not in (None, "recipient") else ""),
    }.get(kind, str(kind))
    parts = [f"{step['index']:>2} {what:<28} {step.get('summary') or step['state']}"]
    if step.get("delivery_id") is not None:
        doubt = f" ({step['doubt']})" if step.get("doubt") else ""
        parts.append(f"delivery {step['delivery_id']} {step.get('delivery_status')}{doubt}")
    if step.get("local_until"):
        verb = "waits until" if step["state"] == "waits" else "until"
        parts.append(f"{verb} {step['local_until']}  ({step['until']})")
    elif step.get("until"):
        parts.append(f"until {step['until']}")
    if step.get("at"):
        parts.append(f"at {step['at']}")
    if step.get("why") and kind != "send" and not step.get("summary"):
        parts.append(f"- {step['why']}")
    return "  ".join(parts)


@run.command()
@click.argument("run_id", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def cancel(state: State, run_id: int, as_json: bool) -> None:
    """Cancel a run: no further step is taken, and each of its deliveries that may
    be canceled is (one whose request may have reached the user: canceled (held));
    one in flight or sent is named, with why. Exits 1 when the run is over already,
    or was gathered into another run's digest already (a digest step's member).

    \b
    Example:
      kirim run cancel 42
    """

    async def body() -> dict[str, Any]:
        async with state.app() as app:
            return canceled_json(await app.cancel_run(run_id))

    done = run_async(body)
    if as_json:
        render.emit_json(done)
    else:
        if done["changed"]:
            click.echo(f"run {run_id} canceled")
        elif done.get("too_late"):
            click.echo(f"run {run_id} not canceled: {done['too_late']}")
        else:
            click.echo(f"run {run_id} is {done['status']} already: nothing canceled")
        for did in done["canceled"]:
            click.echo(f"  delivery {did} canceled")
        for did in done["held"]:
            click.echo(f"  delivery {did} canceled (held): a request may have reached the user")
        for did, why in done["left"].items():
            click.echo(f"  delivery {did} not canceled: {why}")
    if not done["changed"]:
        raise SystemExit(1)


@run.command(name="list")
@click.option(
    "--status", type=click.Choice([str(s) for s in RunStatus]), help="Only runs of this status."
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@pass_state
def list_(state: State, status: str | None, limit: int, as_json: bool) -> None:
    """List the newest runs.

    \b
    Example:
      kirim run list --status waiting
    """

    async def body() -> list[dict[str, Any]]:
        async with state.app(read_only=True) as app:
            which = None if status is None else RunStatus(status)
            return [run_json(r) for r in await app.store.list_runs(status=which, limit=limit)]

    found = run_async(body)
    if as_json:
        render.emit_json(found)
        return
    for r in found:
        click.echo(
            f"{r['id']:>6}  {r['type']:<20} {r['recipient_id']:<16} {r['status']:<9} "
            f"next {r['next_at'] or '-'}"
        )
