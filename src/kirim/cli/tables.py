"""``kirim status`` and the lists of deliveries at any terminal width, never breaking a
word nor cutting an id.

A table is printed when it fits the terminal whole: each of its columns but one holds
ids, names and statuses and is never wrapped, the one left (an error, a timeline's
detail) wraps between words and is never narrower than its longest word. When the
table cannot fit, the records are printed one at a time instead (a vertical layout),
each value on the line of its label if there is room, else on the next; a value that
is longer than the terminal is printed whole on a line of its own (the terminal wraps
it; no character of it is cut or replaced by ``…``, so it can be copied).
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from kirim.cli.render import status_text, styled, text_cell
from kirim.text import visible
from kirim.timeline import events
from kirim.views import Record, iso

#: fields of a timeline event its table row says already (in the time and what columns)
_SAID = frozenset({"action", "attempt"})
#: the width of a vertical layout's labels
_LABEL = 17
#: the narrowest a wrapped text is made beside its label (else below it)
_NARROWEST = 24


def fits(console: Console, table: Table, wrapping: int) -> bool:
    """Whether ``table`` fits the terminal with each column whole but column
    ``wrapping``, which may wrap down to its longest word."""
    probe = Table(
        box=table.box,
        show_edge=table.show_edge,
        padding=table.padding,
        show_header=table.show_header,
        collapse_padding=table.collapse_padding,
        pad_edge=table.pad_edge,
    )
    cells = []
    for index, column in enumerate(table.columns):
        probe.add_column(column.header)
        found = [c.plain if isinstance(c, Text) else str(c) for c in column.cells]
        if index == wrapping:
            found = [max(c.split() or [""], key=len) for c in found]
        cells.append(found)
    for row in zip(*cells, strict=True):
        probe.add_row(*row)
    unbounded = console.options.update_width(1_000_000)
    return Measurement.get(console, unbounded, probe).maximum <= console.width


def wrapped(text: str, width: int, indent: str) -> list[str]:
    """``text`` in lines of at most ``width`` (its first ones after ``indent``), broken
    between words only: a word longer than the line stays whole on its own line."""
    lines = textwrap.wrap(
        text,
        width=max(width, len(indent) + 1),
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [indent.rstrip()]


def _say(console: Console, line: Text | str) -> None:
    """One line as it is: never cropped, folded or ellipsized (a longer one wraps in
    the terminal only)."""
    console.print(line, overflow="ignore", crop=False, no_wrap=True, soft_wrap=True)


def _line(console: Console, line: Text, indent: str = "") -> None:
    """A line of a few words: as it is when it fits, else wrapped between its words."""
    if len(line.plain) <= console.width:
        _say(console, line)
        return
    for part in wrapped(line.plain, console.width, indent):
        _say(console, Text(part, style=line.style))


def _field(console: Console, label: str, value: Text, *, prose: bool, indent: str = "") -> None:
    """``label`` and its ``value``: on one line when they fit; ``prose`` (an error) is
    wrapped between words, any other value (an id, a key, a name) kept whole."""
    width = console.width
    head = f"{indent}{label:<{_LABEL}} "
    plain = value.plain
    if len(head) + len(plain) <= width:
        _say(console, Text.assemble((head, "bold"), value))
        return
    if prose:
        beside = width - len(head) >= _NARROWEST
        lines = wrapped(plain, width, " " * len(head) if beside else indent + "  ")
        if beside:
            _say(console, Text.assemble((head, "bold"), (lines[0][len(head) :], value.style)))
            lines = lines[1:]
        else:
            _say(console, Text(f"{indent}{label}", style="bold"))
        for line in lines:
            _say(console, Text(line, style=value.style))
        return
    _say(console, Text(f"{indent}{label}", style="bold"))
    _say(console, Text.assemble(f"{indent}  ", value))


# -- kirim status ----------------------------------------------------------------------


def show_status(console: Console, record: Record) -> None:
    """A delivery's facts (label and value, ids never cut), then its timeline."""
    d, job = record.delivery, record.job
    facts: list[tuple[str, Text, bool]] = [
        ("delivery", text_cell(d.id), False),
        ("key", text_cell(d.idempotency_key), False),
        ("event", text_cell(d.event_id), False),
        ("recipient", text_cell(d.recipient), False),
        ("channel", text_cell(d.channel), False),
    ]
    if d.type is not None:
        facts.append(("type", text_cell(f"{d.type} for {d.recipient_id}"), True))
    facts.append(("status", status_text(d), True))
    facts.append(("provider message", text_cell(d.provider_message_id), False))
    if d.last_error:
        facts.append(("last error", text_cell(d.last_error), True))
    if job is None:
        facts.append(("job", text_cell(None), False))
    else:
        line = Text.assemble(f"{job.id} ", styled(job.status))
        line.append(f" attempts {job.attempts}/{job.max_attempts}")
        if job.lease_owner:
            owner = visible(job.lease_owner)
            line.append(f" leased by {owner} until {iso(job.lease_expires_at)}")
        facts.append(("job", line, True))
        if job.last_error and job.last_error != d.last_error:
            facts.append(("job error", text_cell(job.last_error), True))
    for label, value, prose in facts:
        _field(console, label, value, prose=prose)
    _timeline(console, record)


def _timeline(console: Console, record: Record) -> None:
    d = record.delivery
    rows: list[tuple[str, str, str, Text, str]] = []
    for e in events(record, now=time.time()):
        style = "yellow" if e.warn else ""
        detail = Text(e.detail(leave_out=_SAID), style=style)  # escaped by the timeline
        rows.append((iso(e.at) or "-", f"{e.at - d.created_at:.3f}", e.summary, detail, style))
    table = Table(title="timeline", title_justify="left")
    table.add_column("time (UTC)", no_wrap=True)
    table.add_column("+s", justify="right", no_wrap=True)
    table.add_column("what", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for at, plus, what, detail, style in rows:
        table.add_row(at, plus, Text(visible(what), style=style), detail)
    if fits(console, table, 3):
        console.print(table)
        return
    _say(console, Text("timeline", style="italic"))
    for at, plus, what, detail, style in rows:
        _line(console, Text(f"{at}  +{plus}  {visible(what)}", style=style or "bold"))
        for line in wrapped(detail.plain, console.width, "    "):
            _say(console, Text(line, style=style))


# -- kirim list, kirim dead-letter list ------------------------------------------------


def show_deliveries(console: Console, records: Sequence[Record], *, title: str) -> None:
    """A table of deliveries when it fits, else one delivery at a time."""
    rows: list[tuple[str, Text, Text, Text, Text, Text, str, Text]] = []
    for record in records:
        d, job, attempts = record.delivery, record.job, record.attempts
        tries = str(len(attempts)) if job is None else f"{len(attempts)}/{job.max_attempts}"
        said = d.last_error or (job.last_error if job is not None else None)
        job_status = text_cell(None) if job is None else styled(job.status)
        rows.append(
            (
                str(d.id),
                text_cell(d.event_id),
                text_cell(d.recipient),
                text_cell(d.channel),
                status_text(d),
                job_status,
                tries,
                text_cell(said),
            )
        )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("id", no_wrap=True, justify="right")
    for name in ("event", "recipient", "channel", "status", "job", "tries"):
        table.add_column(name, no_wrap=True)
    table.add_column("last error", overflow="fold")
    for row in rows:
        table.add_row(*row)
    if fits(console, table, 7):
        console.print(table)
        return
    _say(console, Text(title, style="italic"))
    for number, event, recipient, channel, status, job_status, tries, error in rows:
        _say(console, "")
        head = Text.assemble((number, "bold"), "  ", status, "  job ", job_status)
        _line(console, head.append(f"  tries {tries}"))
        for label, value, prose in (
            ("event", event, False),
            ("recipient", recipient, False),
            ("channel", channel, False),
            ("last error", error, True),
        ):
            _field(console, label, value, prose=prose, indent="  ")
