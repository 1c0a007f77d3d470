"""The analyzer's report (frozen value objects) and its text, JSON and Markdown renderings."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Literal, TypeAlias, get_args

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kirim.text import json_text, visible

JSON: TypeAlias = str | int | float | bool | list["JSON"] | dict[str, "JSON"] | None

#: the kinds of incident ``kirim analyze`` reports (the seed's diagnosis checklist)
IncidentKind = Literal[
    "duplicate_request", "overlapping_attempt", "late_status_write", "missing_correlation"
]
KINDS: tuple[IncidentKind, ...] = get_args(IncidentKind)


def iso(epoch: float | None) -> str | None:
    """Render epoch seconds as ``YYYY-MM-DDTHH:MM:SS.fffZ`` (``None`` stays ``None``)."""
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(round(epoch, 3), UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def label(value: str | None) -> JSON:
    """An attempt label as JSON: ``"2"`` becomes ``2``."""
    if value is None:
        return None
    return int(value) if value.isdigit() else value


@dataclass(frozen=True, kw_only=True, slots=True)
class Gap:
    """One provider-success → status-write gap, for the summary's ``worst_gaps``."""

    notification_id: str
    request_id: str
    gap_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Incident:
    """One finding about one notification (``notification_id`` is ``None`` when unknown)."""

    kind: IncidentKind
    notification_id: str | None
    proven: bool | None = None
    request_ids: tuple[str, ...] = ()
    provider_message_ids: tuple[str, ...] = ()
    attempts: tuple[str, ...] = ()
    evidence: Mapping[str, JSON] = field(default_factory=dict)
    timeline: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, JSON]:
        """Flatten into the JSON shape: ids, attempts, evidence keys, then the timeline."""
        out: dict[str, JSON] = {"notification_id": self.notification_id, "kind": self.kind}
        if self.proven is not None:
            out["proven"] = self.proven
        out["request_ids"] = list[JSON](self.request_ids)
        out["provider_message_ids"] = list[JSON](self.provider_message_ids)
        out["attempts"] = [label(a) for a in self.attempts]
        out.update(self.evidence)
        out["timeline"] = list[JSON](self.timeline)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Summary:
    """Exact counts over the whole input, whatever the incident list kept."""

    lines: int
    malformed_lines: int
    notifications: int
    duplicates: int
    duplicate_risks: int
    overlaps: int
    late_writes: int
    missing_correlation: int
    worst_gaps: tuple[Gap, ...]
    provider_latency_p99_s: float | None
    suggested_lease_s: int | None
    incidents_total: int
    open_notifications_peak: int

    def to_dict(self) -> dict[str, JSON]:
        """The summary as a JSON object (``worst_gaps`` as a list of objects)."""
        gaps: list[JSON] = [
            {"notification_id": g.notification_id, "request_id": g.request_id, "gap_s": g.gap_s}
            for g in self.worst_gaps
        ]
        return {
            "lines": self.lines,
            "malformed_lines": self.malformed_lines,
            "notifications": self.notifications,
            "duplicates": self.duplicates,
            "duplicate_risks": self.duplicate_risks,
            "overlaps": self.overlaps,
            "late_writes": self.late_writes,
            "missing_correlation": self.missing_correlation,
            "worst_gaps": gaps,
            "provider_latency_p99_s": self.provider_latency_p99_s,
            "suggested_lease_s": self.suggested_lease_s,
            "incidents_total": self.incidents_total,
            "open_notifications_peak": self.open_notifications_peak,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Report:
    """The analyzer's result: exact summary plus the (possibly capped) incident list."""

    summary: Summary
    incidents: tuple[Incident, ...]
    incidents_truncated: bool = False

    @property
    def exit_code(self) -> int:
        """1 when a proven duplicate was found (to gate CI), else 0."""
        return 1 if self.summary.duplicates else 0

    def to_dict(self) -> dict[str, JSON]:
        """The report as one JSON object."""
        return {
            "summary": self.summary.to_dict(),
            "incidents": [i.to_dict() for i in self.incidents],
            "incidents_truncated": self.incidents_truncated,
        }


def unattributed(count: int, examples: list[str]) -> Incident:
    """The one missing_correlation incident for lines no notification could be found for."""
    evidence: dict[str, JSON] = {
        "count": count,
        "fields": ["notification_id"],
        "examples": list[JSON](examples),
    }
    return Incident(kind="missing_correlation", notification_id=None, evidence=evidence)


class Tally:
    """Collects incidents as notifications close; counts stay exact when the list is capped."""

    def __init__(self, *, max_incidents: int, worst_gaps: int) -> None:
        self._max, self._top = max_incidents, worst_gaps
        self._incidents: list[Incident] = []
        self._gaps: list[tuple[float, str, str]] = []  # min-heap of the largest gaps
        self._latency: dict[float, int] = {}  # histogram, ms resolution below 10 s
        self.counts = dict.fromkeys(("dup", "risk", "overlap", "late", "missing", "total"), 0)

    def latency(self, given: str | None, requested: float | None, answered: float | None) -> None:
        """Record one provider latency: ``latency_s`` if logged, else response minus request."""
        seconds: float | None = None
        if given is not None:
            try:
                seconds = float(given)
            except ValueError:
                seconds = None
        elif requested is not None and answered is not None:
            seconds = answered - requested
        if seconds is not None and seconds >= 0:
            key = round(seconds, 3) if seconds < 10 else round(seconds, 1)
            self._latency[key] = self._latency.get(key, 0) + 1

    def add(self, incident: Incident) -> None:
        """Count ``incident`` and keep it unless the list is full."""
        counts = self.counts
        counts["total"] += 1
        kind, evidence = incident.kind, incident.evidence
        if kind == "duplicate_request":
            counts["dup" if incident.proven else "risk"] += 1
        elif kind == "overlapping_attempt":
            counts["overlap"] += 1
        elif kind == "missing_correlation":
            count = evidence.get("count")
            counts["missing"] += count if isinstance(count, int) else 0
        elif kind == "late_status_write":
            counts["late"] += 1
            gap = evidence.get("gap_s")
            if isinstance(gap, float) and incident.notification_id and incident.request_ids:
                item = (gap, incident.notification_id, incident.request_ids[0])
                if len(self._gaps) < self._top:
                    heapq.heappush(self._gaps, item)
                else:
                    heapq.heappushpop(self._gaps, item)
        if len(self._incidents) < self._max:
            self._incidents.append(incident)

    def p99(self) -> float | None:
        """Nearest-rank 99th percentile of the recorded latencies."""
        total = sum(self._latency.values())
        rank, seen = math.ceil(0.99 * total), 0
        for value in sorted(self._latency):
            seen += self._latency[value]
            if seen >= rank:
                return round(value, 3)
        return None

    def build(
        self, *, lines: int, malformed_lines: int, notifications: int, open_notifications_peak: int
    ) -> Report:
        """The final report."""
        counts, p99 = self.counts, self.p99()
        gaps = sorted(self._gaps, reverse=True)
        summary = Summary(
            lines=lines,
            malformed_lines=malformed_lines,
            notifications=notifications,
            duplicates=counts["dup"],
            duplicate_risks=counts["risk"],
            overlaps=counts["overlap"],
            late_writes=counts["late"],
            missing_correlation=counts["missing"],
            worst_gaps=tuple(Gap(notification_id=n, request_id=r, gap_s=g) for g, n, r in gaps),
            provider_latency_p99_s=p99,
            suggested_lease_s=None if p99 is None else math.ceil(max(3 * p99, p99 + 5)),
            incidents_total=counts["total"],
            open_notifications_peak=open_notifications_peak,
        )
        truncated = counts["total"] > len(self._incidents)
        return Report(
            summary=summary, incidents=tuple(self._incidents), incidents_truncated=truncated
        )


def render_json(report: Report) -> str:
    """One JSON object, pretty-printed (no control character raw: ``json_text``)."""
    return json_text(report.to_dict(), indent=2)


def _verdict(incident: Incident) -> str:
    if incident.kind == "duplicate_request":
        return "duplicate_request: PROVEN" if incident.proven else "duplicate_request: risk"
    return incident.kind


def _show(value: JSON) -> str:
    """A value of the evidence as the text and Markdown reports show it: control
    characters escaped (a log's line may hold any: ``kirim.text.visible``)."""
    return visible(value) if isinstance(value, str) else json_text(value)


def _facts(incident: Incident) -> list[tuple[str, str]]:
    facts: list[tuple[str, str]] = []
    for name, values in (
        ("request ids", incident.request_ids),
        ("provider message ids", incident.provider_message_ids),
        ("attempts", incident.attempts),
    ):
        if values:
            facts.append((name, visible(", ".join(values))))
    for key, value in incident.evidence.items():
        if key == "requests" and isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    facts.append(("request", "  ".join(f"{k}={_show(v)}" for k, v in item.items())))
        else:
            facts.append((key, _show(value)))
    return facts


def _groups(report: Report) -> list[list[Incident]]:
    """Consecutive incidents of one notification (they close together) form one group."""
    groups: list[list[Incident]] = []
    for incident in report.incidents:
        if groups and groups[-1][0].notification_id == incident.notification_id:
            groups[-1].append(incident)
        else:
            groups.append([incident])
    return groups


def _title(group: list[Incident]) -> str:
    nid = group[0].notification_id
    who = "lines without a notification" if nid is None else f"notification {visible(nid)}"
    return f"{who} · " + ", ".join(_verdict(i) for i in group)


def _marks(group: list[Incident]) -> list[str]:
    marks: list[str] = []
    for incident in group:
        marks += [*incident.request_ids, *incident.provider_message_ids]
        marks += [
            v for k, v in incident.evidence.items() if k.endswith("_at") and isinstance(v, str)
        ]
    return [m for m in marks if m]


#: the most lines of a notification's timeline the reports show without ``verbose``
EXCERPT = 8


def excerpt(timeline: tuple[str, ...], marks: list[str]) -> tuple[str, ...]:
    """A short excerpt of an incident's evidence: the lines that name its requests, its
    message ids or its times (at most ``EXCERPT``), else the first three."""
    hot = tuple(line for line in timeline if any(m in line for m in marks))
    return (hot or timeline[:3])[:EXCERPT]


def _more(shown: int, kept: int) -> str:
    return f"… {kept - shown} more line(s) of this notification: --verbose shows them"


_STYLE = {
    "duplicate_request": "red",
    "overlapping_attempt": "yellow",
    "late_status_write": "magenta",
    "missing_correlation": "cyan",
}


def render_text(report: Report, console: Console, *, verbose: bool = False) -> None:
    """A readable terminal report: summary, then per notification its incidents and a
    short excerpt of its evidence (``verbose``: every line kept of its timeline)."""
    s = report.summary
    table = Table(title="kirim analyze", show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value")
    p99 = "n/a" if s.provider_latency_p99_s is None else f"{s.provider_latency_p99_s} s"
    lease = "n/a" if s.suggested_lease_s is None else f"{s.suggested_lease_s} s"
    rows = [
        ("lines", f"{s.lines} ({s.malformed_lines} malformed)"),
        ("notifications", str(s.notifications)),
        ("proven duplicates", str(s.duplicates)),
        ("duplicate risks (unproven)", str(s.duplicate_risks)),
        ("overlapping attempts", str(s.overlaps)),
        ("late / missing status writes", str(s.late_writes)),
        ("missing correlation (lines)", str(s.missing_correlation)),
        ("provider latency p99", p99),
        ("suggested lease", lease),
    ]
    rows += [
        ("worst gap", visible(f"{g.gap_s} s  {g.notification_id} / {g.request_id}"))
        for g in s.worst_gaps
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if not report.incidents:
        console.print(Text("No incidents found.", style="green"))
    for group in _groups(report):
        styles = [_STYLE[i.kind] for i in group if i.kind in _STYLE and i.proven is not False]
        body: list[Text] = []
        for incident in group:
            body.append(Text(_verdict(incident), style=f"bold {_STYLE.get(incident.kind, '')}"))
            for name, value in _facts(incident):
                body.append(Text.assemble("  ", (f"{name}: ", "bold"), value))
        timeline = group[0].timeline
        if timeline:
            marks = _marks(group)
            shown = timeline if verbose else excerpt(timeline, marks)
            body.append(Text("timeline" if verbose else "evidence", style="bold underline"))
            for raw in shown:
                hot = any(m in raw for m in marks)
                line = f"{'▶' if hot else ' '} {visible(raw)}"
                body.append(Text(line, style="bold" if hot else "dim"))
            if len(shown) < len(timeline):
                body.append(Text(f"  {_more(len(shown), len(timeline))}", style="dim italic"))
        border = styles[0] if styles else "yellow"
        console.print(Panel(Group(*body), title=_title(group), border_style=border))
    if report.incidents_truncated:
        kept = len(report.incidents)
        console.print(Text(f"(incident list truncated: {kept} of {s.incidents_total} shown)"))


def render_markdown(report: Report, *, verbose: bool = False) -> str:
    """A Markdown report: summary table and one section per notification with incidents
    (a short excerpt of its evidence; ``verbose``: every line kept)."""
    s = report.summary
    out = ["# kirim analyze report", "", "| metric | value |", "|---|---|"]
    for key, value in s.to_dict().items():
        if key != "worst_gaps":
            out.append(f"| {key} | {'n/a' if value is None else value} |")
    if s.worst_gaps:
        out += ["", "## Worst status-write gaps", "", "| notification | request | gap (s) |"]
        out.append("|---|---|---|")
        out += [
            visible(f"| `{g.notification_id}` | `{g.request_id}` | {g.gap_s} |")
            for g in s.worst_gaps
        ]
    out += ["", "## Incidents", ""]
    if not report.incidents:
        out.append("No incidents found.")
    for group in _groups(report):
        out += [f"### {_title(group)}", ""]
        for incident in group:
            out += [f"**{_verdict(incident)}**", ""]
            out += [f"- {name}: `{value}`" for name, value in _facts(incident)]
            out.append("")
        timeline = group[0].timeline
        if timeline:
            shown = timeline if verbose else excerpt(timeline, _marks(group))
            out += ["```", *(visible(line) for line in shown), "```", ""]
            if len(shown) < len(timeline):
                out += [f"_{_more(len(shown), len(timeline))}_", ""]
    if report.incidents_truncated:
        out.append(f"_Incident list truncated: {len(report.incidents)} of {s.incidents_total}._")
    return "\n".join(out).rstrip() + "\n"


def write_report(
    report: Report, fmt: str, stream: IO[str], *, color: bool, verbose: bool = False
) -> None:
    """Render ``report`` as ``fmt`` (text, json or markdown) onto ``stream``; the JSON
    always has every kept line, the others an excerpt unless ``verbose``."""
    if fmt == "json":
        stream.write(render_json(report) + "\n")
    elif fmt == "markdown":
        stream.write(render_markdown(report, verbose=verbose))
    else:
        width = None if color else 120
        console = Console(file=stream, force_terminal=color, no_color=not color, width=width)
        render_text(report, console, verbose=verbose)
