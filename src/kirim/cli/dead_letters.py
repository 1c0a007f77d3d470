"""``kirim dead-letter list|retry|cancel``: the deliveries whose job is dead."""

from __future__ import annotations

import click

from kirim import views
from kirim.cli import render, runner, tables
from kirim.cli.runner import State, pass_state, run
from kirim.engine import Kirim

# -- operating -------------------------------------------------------------------------


@click.group(name="dead-letter")
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
            return await app.dead_letters(limit=limit)

    records = run(go)
    if as_json:
        render.emit_json([views.delivery_json(r) for r in records])
    else:
        tables.show_deliveries(render.console(), records, title=f"dead letters ({len(records)})")


@dead_letter.command(name="retry")
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@pass_state
def dead_retry(state: State, ids: tuple[str, ...]) -> None:
    """Requeue dead-lettered deliveries with a fresh job (ID: delivery id or key).

    This releases any earlier doubt: for a delivery held in doubt, the operator
    accepts that the notification may arrive twice (a warning says so for each one
    where a second copy is possible; `kirim reconcile` first settles the doubt). On a
    channel whose provider can be asked, the doubt is kept instead and the worker asks
    the provider before it sends anything. Exits 1 naming every ID that was not
    dead-lettered.

    \b
    Example:
      kirim dead-letter retry 42 43
    """

    async def action(app: Kirim, key_or_id: str) -> views.Record:
        before = await app.get(key_or_id)
        if before is not None and app.second_copy_possible(before):
            click.echo(
                f"warning: delivery {before[0].id}: an earlier request may have reached the "
                "provider: the user may get a second copy",
                err=True,
            )
        return await app.retry(key_or_id)

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

    async def action(app: Kirim, key_or_id: str) -> views.Record:
        return await app.cancel(key_or_id, dead_only=True)

    runner.operate(state, ids, action, "canceled")
