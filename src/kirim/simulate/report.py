"""What a simulation found: a rich table, one JSON object, and the lease/latency plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kirim.errors import ConfigError
from kirim.simulate.result import SimResult

PLOT_HINT = "--plot needs matplotlib: pip install 'kirim[plot]'"


def _count(value: int, *, bad: bool) -> Text:
    return Text(f"{value:,}", style="bold red" if bad and value else "")


def show(console: Console, r: SimResult) -> None:
    """The result as a table, with kirim's promise (or the baseline's failure) below it."""
    over = "" if r.channel == "webhook" else f" over {r.channel}"
    title = (
        f"kirim simulate: {r.strategy}{over} on {r.backend}, seed {r.seed}, "
        f"{r.seconds:.1f}s, lease {r.lease:g}s, latency {r.latency}"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("")
    table.add_column("count", justify="right")
    receiver = "honours keys" if r.idempotent else "honours nothing"
    p50 = "-" if r.latency_p50_s is None else f"{r.latency_p50_s:.3f}s"
    p99 = "-" if r.latency_p99_s is None else f"{r.latency_p99_s:.3f}s"
    f = r.faults
    rows: list[tuple[str, Text | str]] = [
        ("notifications", f"{r.notifications:,}"),
        (f"delivered (the receiver, which {receiver}, saw it)", f"{r.delivered:,}"),
        ("duplicate requests seen by the receiver", f"{r.duplicate_requests:,}"),
        ("duplicates (a user received it more than once)", _count(r.duplicates, bad=True)),
        ("lost (neither delivered nor reported)", _count(r.lost, bad=True)),
        ("in doubt, reported (assumed sent or held)", f"{r.in_doubt:,}"),
        ("in doubt, not reported", _count(r.unreported_in_doubt, bad=True)),
        ("in doubt, then resolved as sent (late success or lookup)", f"{r.resolved:,}"),
        ("failed (reported)", f"{r.failed:,}"),
        ("retries", f"{r.retries:,}"),
        ("dead-lettered", f"{r.dead_lettered:,}"),
        ("throughput", f"{r.throughput_per_s:,.1f}/s"),
        ("latency, enqueue to first request: p50 / p99", f"{p50} / {p99}"),
        (
            "faults: kills / stalls / timeouts / errors",
            f"{f['kills']} / {f['stalls']} / {f['timeouts']} / {f['errors']}",
        ),
        ("worker processes started", str(r.workers_started)),
    ]
    if r.clock_skew:
        rows.append((f"worker clocks, skew ±{r.clock_skew:g}s", clock_offsets(r.clock_offsets)))
    if r.lookup:
        found, missing = r.lookups.get("found", 0), r.lookups.get("not_found", 0)
        rows.append(("lookups at the receiver: found / not found", f"{found:,} / {missing:,}"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for crash in r.worker_crashes:
        console.print(Text(f"worker crashed: {crash}", style="red"))
    if r.timed_out:
        console.print(f"[bold red]the run hit its deadline[/] with {r.unfinished} unfinished")
    if r.promise_kept is True:
        console.print("[bold green]kirim kept its promise:[/] 0 duplicates, 0 lost.")
    elif r.promise_kept is False:
        console.print("[bold red]kirim broke its promise[/]: see the counts above.")
    elif r.duplicates:
        console.print(
            f"[yellow]the naive flow sent {r.duplicates} notification(s) more than once.[/]"
        )


def clock_offsets(offsets: dict[str, float]) -> str:
    """``worker-1 +1.204s, worker-2 -0.310s, …`` (ordered by worker number)."""

    def number(worker_id: str) -> tuple[int, str]:
        tail = worker_id.rpartition("-")[2]
        return (int(tail) if tail.isdigit() else 0, worker_id)

    return ", ".join(f"{w} {offsets[w]:+.3f}s" for w in sorted(offsets, key=number))


def show_sweep(console: Console, runs: Sequence[tuple[float, SimResult]], plot: str) -> None:
    table = Table(title=f"lease/latency sweep (plot: {plot})", title_justify="left")
    for name in ("lease/latency", "lease", "strategy", "duplicates / 1,000", "duplicates", "lost"):
        table.add_column(name, justify="right")
    for ratio, r in runs:
        table.add_row(
            f"{ratio:g}",
            f"{r.lease:g}s",
            r.strategy,
            f"{per_thousand(r):.1f}",
            _count(r.duplicates, bad=r.strategy == "kirim"),
            _count(r.lost, bad=True),
        )
    console.print(table)


def per_thousand(r: SimResult) -> float:
    return 1000 * r.duplicates / r.notifications


def sweep_json(runs: Sequence[tuple[float, SimResult]], plot: str) -> dict[str, Any]:
    return {
        "plot": plot,
        "runs": [{"ratio": ratio, **r.as_json()} for ratio, r in runs],
    }


def check_plotting() -> None:
    """Raise ConfigError (exit 2) when matplotlib is not installed."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        raise ConfigError(PLOT_HINT) from None


def plot(runs: Sequence[tuple[float, SimResult]], path: Path, *, subtitle: str) -> None:
    """Duplicates per 1,000 notifications against lease/latency, one line per strategy."""
    check_plotting()
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"naive": ("tab:red", "o"), "kirim": ("tab:green", "s")}
    for strategy, (colour, marker) in styles.items():
        points = sorted((ratio, per_thousand(r)) for ratio, r in runs if r.strategy == strategy)
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=marker, color=colour, label=strategy)
    ax.set_xscale("log")
    ratios = sorted({ratio for ratio, _ in runs})
    ax.set_xticks(ratios, [f"{x:g}" for x in ratios])
    ax.minorticks_off()
    ax.set_xlabel("lease / median provider latency")
    ax.set_ylabel("duplicates per 1,000 notifications")
    ax.set_title(f"Notifications a user received twice\n{subtitle}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
