"""``kirim import-keys``: the keys another system already sent, as tombstones, so that
kirim sends none of them again during a switch (``kirim.store.imports``;
docs/adopting.md)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import IO, cast

import click

from kirim.cli import params, render, runner
from kirim.cli.runner import EXIT_USAGE, State, fail, pass_state
from kirim.keys import default_key
from kirim.store.imports import BATCH, ImportResult, ImportsKeys
from kirim.text import plural
from kirim.validation import BadValue, check_key, check_text

_TRIPLE = ("event_id", "recipient", "channel")


def _key_of(fields: dict[str, object]) -> str:
    """The key a record names: its ``key``, else kirim's default key of its event id,
    recipient and channel."""
    if fields.get("key") not in (None, ""):
        return check_key(fields["key"])
    if all(fields.get(name) not in (None, "") for name in _TRIPLE):
        e, r, c = (check_text(name, fields[name]) for name in _TRIPLE)
        return default_key(e, r, c)
    raise BadValue("the record", "has neither key nor event_id, recipient and channel")


def records(stream: IO[str], fmt: str) -> Iterator[tuple[int, dict[str, object]]]:
    """``(line number, fields)`` of every record of ``stream`` (blank lines skipped);
    BadValue for a line that is no record of ``fmt``."""
    if fmt == "csv":
        reader = csv.DictReader(stream)
        columns = set(reader.fieldnames or ())
        if "key" not in columns and not set(_TRIPLE) <= columns:
            raise BadValue("the CSV header", "names neither key nor event_id, recipient, channel")
        for row in reader:
            yield reader.line_num, dict(row)
        return
    for number, line in enumerate(stream, 1):
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if fmt == "keys":
            yield number, {"key": text}
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadValue(f"line {number}", f"is not JSON ({exc.msg})") from exc
        if not isinstance(record, dict):
            raise BadValue(f"line {number}", "is not a JSON object")
        yield number, record


def distinct_keys(stream: IO[str], fmt: str, name: str) -> list[str]:
    """Every key of ``stream``, each once, in order; a bad record stops it all (exit 2,
    naming its line): nothing is written."""
    seen: dict[str, None] = {}
    where = [0]
    try:
        for where[0], fields in records(stream, fmt):
            seen.setdefault(_key_of(fields), None)
    except BadValue as exc:
        at = "" if str(exc).startswith(("line", "the CSV")) else f", line {where[0]}"
        fail(f"{name}{at}: {exc}; nothing was imported", EXIT_USAGE)
    except UnicodeDecodeError as exc:
        fail(f"{name} is not UTF-8 text ({exc.reason}); nothing was imported", EXIT_USAGE)
    return list(seen)


@click.command("import-keys")
@click.argument(
    "path", type=params.PathParam(dir_okay=False, exists=True, allow_dash=True), metavar="FILE"
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["keys", "csv", "jsonl"]),
    default="keys",
    show_default=True,
    help="keys: one idempotency key a line. csv: a header naming key, or event_id, "
    "recipient and channel (kirim's default key is made of them). jsonl: one JSON object "
    "a line with the same fields.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be imported; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def import_keys(state: State, path: str, fmt: str, dry_run: bool, as_json: bool) -> None:
    """Import keys another system already sent, so that kirim never sends them.

    Each key of FILE (`-`: standard input) becomes a tombstone, as a pruned
    delivery leaves: a notification given that key creates nothing (answered
    pruned, delivery id 0). A key kirim already holds, as a delivery or a
    tombstone, is left as it is, so a second import of the same file writes
    nothing. The tombstones expire like the others, [retention] keys (365 days
    by default) after the import, once the worker or `kirim prune` prunes.
    Every record is read and checked before anything is written; then the keys
    go in batches of 1,000, one transaction each. How to switch an existing
    system over with it: docs/adopting.md.

    \b
    Examples:
      kirim import-keys sent-keys.txt
      kirim import-keys --format csv --dry-run outbox-export.csv
      psql -c "COPY (SELECT key FROM sent) TO STDOUT" | kirim import-keys -
    """
    state.setup_logging()
    name = "standard input" if path == "-" else path

    async def go() -> tuple[ImportResult, float]:
        async with state.app(read_only=dry_run) as app:
            store = cast(ImportsKeys, app.store)  # both backends do
            with click.open_file(path, encoding="utf-8") as source:
                found = distinct_keys(source, fmt, name)  # read once the schema is checked
            total = ImportResult(dry_run=dry_run)
            for start in range(0, len(found), BATCH):
                batch = found[start : start + BATCH]
                total += await store.import_keys(batch, now=app.clock.now(), dry_run=dry_run)
            return total, app.config.worker.retention_keys

    result, expires = runner.run(go)
    if as_json:
        render.emit_json({**result.as_dict(), "expires_after_s": expires})
        return
    verb = "would import" if dry_run else "imported"
    imported = plural(result.imported, "key")
    line = f"{verb} {imported} as tombstones; {result.known:,} already known to kirim"
    click.echo(line + (" (nothing was written: --dry-run)" if dry_run else ""))
    if result.imported and not dry_run:
        click.echo(
            f"a notification with one of them now creates nothing, for {expires / 86400:g} "
            "days ([retention] keys) once pruning runs"
        )
