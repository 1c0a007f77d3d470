"""``kirim explore``: many seeded schedules of real workers; shrink and save failures."""

from __future__ import annotations

import importlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kirim.chaos import Tally
from kirim.cli.params import PathParam
from kirim.explore.scenario import WORKLOADS, Outcome, Settings, run_schedule
from kirim.explore.shrink import relevant, replay, replay_verdict, same_code, save, shrink

PROVIDERS = ("plain", "lookup", "idempotent")


@dataclass(slots=True)
class Summary:
    schedules: int = 0
    seconds: float = 0.0
    failing: list[Outcome] = field(default_factory=list)
    by_invariant: Counter[str] = field(default_factory=Counter)
    saved: list[str] = field(default_factory=list)
    shortest: list[str] = field(default_factory=list)
    #: every schedule's notifications, judged in ``kirim.chaos``'s words
    verdicts: Tally = field(default_factory=Tally)

    @property
    def rate(self) -> float:
        return self.schedules / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "schedules": self.schedules,
            "seconds": round(self.seconds, 3),
            "schedules_per_second": round(self.rate, 2),
            "failing_schedules": len(self.failing),
            "violations_by_invariant": dict(sorted(self.by_invariant.items())),
            "failing_seeds": [o.settings.seed for o in self.failing],
            "saved": self.saved,
            "shortest_failing_timeline": self.shortest,
            "verdicts": self.verdicts.as_dict(),
        }


def settings_for(seed: int, provider: str, **fixed: Any) -> Settings:
    """A seed's settings; ``provider="mix"`` rotates through the three providers."""
    chosen = PROVIDERS[seed % len(PROVIDERS)] if provider == "mix" else provider
    return Settings.draw(seed, provider=chosen, **fixed)


def run_seeds(
    seeds: range,
    *,
    provider: str = "mix",
    on_step: Callable[[Outcome], None] | None = None,
    **fixed: Any,
) -> Summary:
    """Run one schedule per seed; collect the failing ones."""
    summary = Summary()
    started = time.perf_counter()
    for seed in seeds:
        outcome = run_schedule(settings_for(seed, provider, **fixed))
        summary.schedules += 1
        summary.verdicts += outcome.verdicts
        if outcome.violations:
            summary.failing.append(outcome)
            for name in sorted({v.name for v in outcome.violations}):
                summary.by_invariant[name] += 1
        if on_step is not None:
            on_step(outcome)
    summary.seconds = time.perf_counter() - started
    return summary


def finish(summary: Summary, *, out: Path | None, shrink_budget: int, keep: int) -> None:
    """Shrink the first failure of each invariant (up to ``keep``), save, pick the shortest."""
    firsts: dict[str, Outcome] = {}
    for outcome in summary.failing:
        firsts.setdefault(outcome.violations[0].name, outcome)
    shortest: list[str] | None = None
    for name, outcome in list(firsts.items())[:keep]:
        small = shrink(outcome, invariant=name, budget=shrink_budget) if shrink_budget else outcome
        first = next(v for v in small.violations if v.name == name)
        lines = relevant(small.lines, first.delivery)
        if shortest is None or len(lines) < len(shortest):
            shortest = [str(first), *lines]
        if out is not None:
            path = out / f"seed-{small.settings.seed}-{name}.json"
            summary.saved.append(str(save(small, path, label=name)))
    summary.shortest = shortest or []


def _factory(spec: str | None) -> Any:
    if spec is None:
        return None
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise click.BadParameter("expected module:callable", param_hint="--provider-factory")
    return getattr(importlib.import_module(module), attr)


@click.command("explore")
@click.option("--seeds", default=200, show_default=True, help="How many schedules (seeds) to run.")
@click.option("--start", default=0, show_default=True, help="The first seed.")
@click.option(
    "--workers",
    type=click.Choice(["2", "3"]),
    default="3",
    show_default=True,
    help="Worker processes per schedule.",
)
@click.option(
    "--policy",
    default="host",
    show_default=True,
    metavar="host|random|pct:D",
    help="Scheduling policy: a host then its oldest callback; any callback; or PCT depth D "
    "(not with --workload flows, which draws its own order).",
)
@click.option(
    "--provider",
    type=click.Choice(["mix", *PROVIDERS]),
    default="mix",
    show_default=True,
    help="Provider model: honours keys (idempotent), does not (plain), or can be asked "
    "(lookup); mix rotates through the three by seed.",
)
@click.option(
    "--on-unknown",
    type=click.Choice(["assume_sent", "hold", "retry"]),
    help="The channel's in-doubt policy.  [default: drawn per seed]",
)
@click.option(
    "--workload",
    type=click.Choice([*WORKLOADS, "flows"]),
    default="notify",
    show_default=True,
    help="What the driver does: plain notify calls (notify); events of a plain and a "
    "digest notification type for 2-3 recipients with a preference flip at a seeded "
    "time (events; adds the suppressed_unsent, digest_once and opted_out_unsent checks); "
    "or the whole configuration drawn per seed: 1-3 channels with fallbacks, dedup "
    "windows, rates, failure classes and callbacks, 0-3 types with windows, throttles "
    "and digests, preferences and quiet hours that change, workers that differ, "
    "operator retries, cancels, reconciles and prunes (full; adds the checks of "
    "kirim.explore.checks, liveness among them); or workflow runs with steps, delays, "
    "branches, crashes and cancellations (flows: kirim.explore.flows; SQLite, or "
    "PostgreSQL with --database).",
)
@click.option(
    "--database",
    metavar="URL",
    help="PostgreSQL server (postgresql://…) for the PostgreSQL lane: a throw-away database "
    "per schedule.  [default: SQLite files in a scratch directory]",
)
@click.option(
    "--replay",
    "replay_file",
    type=PathParam(exists=True, dir_okay=False, path_type=Path),
    help="Replay a saved failure file exactly and print its timeline, or play a saved "
    "flows world (tests/explore/seeds/flows/*.json) and check it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--out",
    type=PathParam(file_okay=False, path_type=Path),
    help="Directory for failure files (shrunk).  [default: none saved]",
)
@click.option(
    "--shrink-budget",
    default=200,
    show_default=True,
    help="Replays spent shrinking each failure (0: no shrinking).",
)
@click.option(
    "--provider-factory",
    metavar="MODULE:CALLABLE",
    help="Your provider: called with the simulated remote service (kirim.explore."
    "provider.ProviderModel), returns the Provider the workers use.",
)
def explore(
    seeds: int,
    start: int,
    workers: str,
    policy: str,
    provider: str,
    on_unknown: str | None,
    workload: str,
    database: str | None,
    replay_file: Path | None,
    as_json: bool,
    out: Path | None,
    shrink_budget: int,
    provider_factory: str | None,
) -> None:
    """Drive real workers through seeded schedules, with faults; check the promise.

    Each seed is one deterministic schedule: 2–3 workers on one database, a provider
    model with slow, lost and late answers, crashes, stalls, clock skew, store
    faults and operator actions. Failures are shrunk and saved; replay one with
    --replay FILE. Exit status 1 when an invariant was violated.

    \b
    Examples:
      kirim explore --seeds 500 --out failures/
      kirim explore --provider lookup --policy pct:3 --seeds 200
      kirim explore --workload events --seeds 500
      kirim explore --workload full --seeds 500
      kirim explore --replay tests/explore/seeds/lookup-duplicate.json
    """
    console = Console(stderr=True)
    if replay_file is not None:
        _refuse_ignored(
            {"replay_file", "as_json", "database"},
            "--replay plays the saved schedule with the settings it was saved with",
        )
        saved = _saved(replay_file)
        if "world" in saved and "format" not in saved:  # a flows world (FlowWorld.to_json)
            raise SystemExit(_flows_world(replay_file, saved, as_json, database))
        outcome, exact = replay(replay_file)
        same = same_code(replay_file)
        held = not outcome.violations
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "exact": exact,
                        "same_code": same,
                        "promise_held": held,
                        "violations": [str(v) for v in outcome.violations],
                        "timeline": outcome.lines,
                    },
                    indent=1,
                )
            )
        else:
            for line in outcome.lines:
                click.echo(line)
            click.echo(f"replayed exactly: {replay_verdict(exact, same)}")
            n = len(outcome.violations)
            click.echo(
                "promise held: yes (no invariant violated)"
                if held
                else f"promise held: no ({n} violation{'s' if n != 1 else ''})"
            )
            for v in outcome.violations:
                click.echo(f"VIOLATION {v}")
        raise SystemExit(1 if outcome.violations else 0)
    if workload == "flows":  # workflow runs (kirim.explore.flows), a world per seed
        _refuse_ignored(
            {"seeds", "start", "workload", "as_json", "database"},
            "--workload flows draws each seed's world, hosts and order itself",
        )
        if database is not None and not database.startswith(("postgresql://", "postgres://")):
            raise click.BadParameter(
                "the flows lane takes a PostgreSQL server (postgresql://…)",
                param_hint="--database",
            )
        raise SystemExit(_flows(range(start, start + seeds), as_json, database))
    if provider_factory is not None:
        _factory(provider_factory)  # fail early on a bad spec
    fixed: dict[str, Any] = {
        "workers": int(workers),
        "policy": policy,
        "on_unknown": on_unknown,
        "workload": workload,
        "database": database,
        "provider_factory": provider_factory,
    }
    with Progress(
        TextColumn("explore"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[bad]} failing"),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
        transient=True,
    ) as progress:
        task = progress.add_task("seeds", total=seeds, bad=0)
        bad = 0

        def step(outcome: Outcome) -> None:
            nonlocal bad
            bad += bool(outcome.violations)
            progress.update(task, advance=1, bad=bad)

        summary = run_seeds(range(start, start + seeds), provider=provider, on_step=step, **fixed)
    finish(summary, out=out, shrink_budget=shrink_budget, keep=8)
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=1))
    else:
        console.print(
            f"[bold]{summary.schedules}[/] schedules in {summary.seconds:.1f} s "
            f"({summary.rate:.1f} schedules/s), {len(summary.failing)} failing"
        )
        t = summary.verdicts
        console.print(
            f"  notifications {t.notifications}: {t.delivered} delivered, {t.duplicates} "
            f"duplicated, {t.lost} lost, {t.in_doubt} in doubt ({t.unreported_in_doubt} "
            f"unreported), {t.failed} failed, {t.denied} denied, {t.unfinished} unfinished"
        )
        for name, count in sorted(summary.by_invariant.items()):
            console.print(f"  {name}: {count}")
        for path in summary.saved:
            console.print(f"  saved {path}")
        if summary.shortest:
            console.print("[bold]shortest failing timeline[/]")
            for line in summary.shortest:
                click.echo(line)
    raise SystemExit(1 if summary.failing else 0)


def _saved(path: Path) -> dict[str, Any]:
    """The JSON object of a file given to --replay; a usage error (exit 2) when it is
    none, or neither a failure file nor a saved flows world."""
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.BadParameter(f"{path}: not JSON ({exc})", param_hint="--replay") from exc
    if not isinstance(found, dict) or ("format" not in found and "world" not in found):
        raise click.BadParameter(
            f"{path}: neither an explorer failure file nor a saved flows world",
            param_hint="--replay",
        )
    return found


def _refuse_ignored(applies: set[str], why: str) -> None:
    """A usage error naming the options the user gave that this run would ignore."""
    ctx = click.get_current_context()
    given = [
        p
        for p in ctx.command.params
        if p.name is not None
        and p.name not in applies
        and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        names = ", ".join(p.opts[0] for p in given)
        raise click.UsageError(f"{names}: not used here ({why})")


def _flows_world(path: Path, saved: dict[str, Any], as_json: bool, database: str | None) -> int:
    """--replay of a saved flows world: played and checked; whether it still reaches
    the edges it was kept for (``reaches``). 1 on a violation or an edge not reached."""
    from kirim.explore import flows
    from kirim.observe.logging import configure

    try:
        world = flows.FlowWorld.from_json(saved["world"])
    except (KeyError, TypeError, ValueError) as exc:
        raise click.BadParameter(
            f"{path}: not a flows world ({exc})", param_hint="--replay"
        ) from exc
    configure(fmt="logfmt", level="error")
    (result,) = flows.run_worlds([world], database=database)
    missed = sorted(set(saved.get("reaches", [])) - result.reached)
    if as_json:
        shown = {
            "seed": result.seed,
            "why": saved.get("why"),
            "violations": result.violations,
            "reported": result.reported,
            "reached": sorted(result.reached),
            "missed": missed,
        }
        click.echo(json.dumps(shown, indent=1))
    else:
        if saved.get("why"):
            click.echo(f"kept because: {saved['why']}")
        for v in result.violations:
            click.echo(f"VIOLATION {v}")
        for r in result.reported:
            click.echo(f"reported: {r}")
        click.echo(f"reached: {', '.join(sorted(result.reached))}")
        if missed:
            click.echo(f"did not reach: {', '.join(missed)}")
        held = "yes" if not result.violations else f"no ({len(result.violations)} violations)"
        click.echo(f"flows world (seed {result.seed}): {result.runs} runs; promise held: {held}")
    return 1 if result.violations or missed else 0


def _flows(seeds: range, as_json: bool, database: str | None) -> int:
    """``--workload flows``: each seed's world played and checked (on SQLite, or with
    ``--database`` on PostgreSQL); 1 on a violation."""
    from kirim.explore import flows
    from kirim.observe.logging import configure

    configure(fmt="logfmt", level="error")  # the workers' own warnings: not the report
    results = flows.run_seeds(seeds, database=database)
    bad = [r for r in results if r.violations]
    if as_json:
        shown = [{"seed": r.seed, "violations": r.violations, "reported": r.reported} for r in bad]
        click.echo(json.dumps({"seeds": len(results), "failed": shown}, indent=1))
    else:
        for r in bad:
            for v in r.violations:
                click.echo(f"seed {r.seed}: VIOLATION {v}")
        reported = sum(len(r.reported) for r in results)
        click.echo(
            f"flows: {len(results)} seeds, {sum(r.runs for r in results)} runs, "
            f"{len(bad)} with a violation, {reported} reported"
        )
    return 1 if bad else 0
