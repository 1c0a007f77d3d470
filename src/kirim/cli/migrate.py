"""``kirim migrate``: apply the schema migrations, or say what they would do
(``--check``, ``--dry-run``) and whether older workers may run on meanwhile
(``kirim.store.migrations``; the procedure: docs/upgrading.md)."""

from __future__ import annotations

import textwrap

import click

from kirim.cli import render
from kirim.cli.runner import EXIT_FAILED, EXIT_USAGE, State, fail, pass_state, run
from kirim.store.migrations import Migration, OlderWorkers, Plan, plan
from kirim.store.schema import too_new
from kirim.text import redact_url
from kirim.version import __version__


def _older(m: Migration) -> str:
    if m.older_workers is OlderWorkers.SAFE:
        return "older workers may run on"
    return "stop older workers first"


def describe(p: Plan, url: str) -> list[str]:
    """The plan in lines: where the database stands and each migration still to run."""
    shown = redact_url(url)
    if p.current == 0:
        head = f"{shown}: no kirim schema yet; this kirim ({__version__}) creates version "
        head += f"{p.target}"
    else:
        head = f"{shown}: schema version {p.current}; this kirim ({__version__}) knows up to "
        head += f"version {p.target}"
    lines = [head]
    if p.too_new:
        lines.append("the database is newer than this kirim: nothing is applied")
        return lines
    if not p.pending:
        lines.append("nothing to migrate")
        return lines
    noun = "migration" if len(p.pending) == 1 else "migrations"
    lines.append(f"{len(p.pending)} {noun} to apply, in one transaction:")
    for m in p.pending:
        if not p.current:  # no schema yet: no worker can be running on it
            lines.append(f"  {m.name}  {m.title}")
            continue
        lines.append(f"  {m.name}  {m.title} ({_older(m)})")
        lines.extend(f"      {w}" for w in textwrap.wrap(m.why, 78))
    if p.stop_first:
        names = ", ".join(m.name for m in p.stop_first)
        lines.append(
            f"stop every worker older than this kirim before applying it ({names}); the "
            "others may run on while it runs: docs/upgrading.md"
        )
    elif p.current:
        lines.append(
            "older workers may keep running while it is applied; "
            "upgrade them to this kirim afterwards"
        )
    return lines


@click.command()
@click.option(
    "--check",
    is_flag=True,
    help="Say what would be applied and change nothing; exit 1 when a migration is pending.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan and the SQL of each pending migration; change nothing.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@pass_state
def migrate(state: State, check: bool, dry_run: bool, as_json: bool) -> None:
    """Create the schema or apply the migrations it is missing.

    Prints where the database stands (its schema version, the newest this kirim
    knows) and each migration to apply, with whether workers of the older kirim may
    keep running while it is applied or must be stopped first (docs/upgrading.md).
    The migrations run in one transaction: all or none. A database migrated by a
    newer kirim is never touched (exit 2). Unlike `kirim init` it writes no
    kirim.toml.

    --check changes nothing and exits 1 when a migration is pending (0 when the
    schema is current): for a deploy script. --dry-run changes nothing and prints
    the SQL of each pending migration as well.

    \b
    Examples:
      kirim migrate --check
      kirim --database postgresql://kirim@db/kirim migrate --dry-run
      kirim migrate
    """
    if check and dry_run:
        raise click.UsageError("give --check or --dry-run, not both")
    state.setup_logging()

    async def go() -> tuple[Plan, str, int | None]:
        async with state.app(check_schema=False, read_only=check or dry_run) as app:
            store = app.store
            current = await store.schema_version()
            found = plan(store.dialect, current)
            if check or dry_run or found.too_new or not found.pending:
                return found, store.url, None
            return found, store.url, await store.migrate()

    found, url, applied = run(go)
    if as_json:
        render.emit_json({"database": redact_url(url), **found.as_dict(), "applied": applied})
    else:
        for line in describe(found, url):
            click.echo(line)
    if found.too_new:
        fail(too_new(found.current), EXIT_USAGE)
    if dry_run:
        if not as_json:
            for m in found.pending:
                click.echo(f"\n-- {m.name}.sql\n{m.sql.strip()}")
            click.echo("\nnothing was changed (--dry-run)")
        return
    if check:
        if found.pending:
            raise click.exceptions.Exit(EXIT_FAILED)
        return
    if applied is not None and not as_json:
        click.echo(f"applied; schema version {applied} at {redact_url(url)}")
