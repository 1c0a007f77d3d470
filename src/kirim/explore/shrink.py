"""Shrink a failing schedule, save it, replay it.

A failure is kept while a replay still violates the same invariant. Shrinking
tries, in order: fewer workers and deliveries, dropping faults one by one, the
shortest prefix of the choice list (the rest in default order), then zeroing
chunks of what is left (delta debugging, halving the chunk size). Every try is a
full replay, so the result is a real schedule, replayable from its file.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kirim.explore.faults import Fault
from kirim.explore.scenario import Outcome, Settings, run_schedule
from kirim.explore.trace import read_failure, write_failure

#: timeline lines that matter to every delivery
GLOBAL = ("fault ", " heal", "process_start", "operator_", "lease_expired")


def _fails(outcome: Outcome, invariant: str) -> bool:
    return any(v.name == invariant for v in outcome.violations)


def _strip(choices: list[int]) -> list[int]:
    end = len(choices)
    while end and choices[end - 1] == 0:
        end -= 1
    return choices[:end]


def shrink(
    outcome: Outcome,
    *,
    invariant: str | None = None,
    budget: int = 300,
    progress: Callable[[int], None] | None = None,
) -> Outcome:
    """The smallest failing variant found within ``budget`` replays."""
    target = invariant or outcome.violations[0].name
    best = outcome
    runs = 0

    def attempt(settings: Settings, plan: list[Fault], choices: list[int]) -> bool:
        nonlocal best, runs
        if runs >= budget:
            return False
        runs += 1
        if progress is not None:
            progress(runs)
        got = run_schedule(settings, plan=plan, choices=choices)
        if _fails(got, target):
            got.choices = _strip(got.choices)
            best = got
            return True
        return False

    s = best.settings
    for field, low in (("workers", 2), ("deliveries", 1)):
        while getattr(best.settings, field) > low and attempt(
            replace(best.settings, **{field: getattr(best.settings, field) - 1}),
            best.plan,
            best.choices,
        ):
            pass
    del s
    changed = True
    while changed:
        changed = False
        for i in range(len(best.plan)):
            plan = best.plan[:i] + best.plan[i + 1 :]
            if attempt(best.settings, plan, best.choices):
                changed = True
                break
    lo, hi = 0, len(best.choices)
    while lo < hi:  # the shortest prefix that still fails (assumed monotone; checked)
        mid = (lo + hi) // 2
        if attempt(best.settings, best.plan, best.choices[:mid]):
            hi = min(mid, len(best.choices))
        else:
            lo = mid + 1
    chunk = max(1, len(best.choices) // 2)
    while chunk >= 1 and runs < budget:
        i = 0
        while i < len(best.choices) and runs < budget:
            piece = best.choices[i : i + chunk]
            if any(piece):
                trial = best.choices[:i] + [0] * len(piece) + best.choices[i + chunk :]
                attempt(best.settings, best.plan, trial)
            i += chunk
        chunk //= 2
    return best


def relevant(lines: list[str], delivery: int | None) -> list[str]:
    """The timeline of one delivery (its requests and effects), with the faults."""
    if delivery is None:
        return list(lines)
    mark = f"delivery={delivery} "
    requests = {
        m.group(1)
        for line in lines
        if mark in line + " " and (m := re.search(r"req=(r\d+)", line)) is not None
    }
    out = []
    for line in lines:
        req = re.search(r"req=(r\d+)", line)
        if (
            mark in line + " "
            or any(g in line for g in GLOBAL)
            or (req is not None and req.group(1) in requests)
        ):
            out.append(line)
    return out


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The sha256 of kirim's own code (every .py and .sql file of the package): a
    replay by the same code that gives another timeline is a determinism bug."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".sql")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def record(outcome: Outcome, *, label: str = "") -> dict[str, Any]:
    """What a failure file holds."""
    first = outcome.violations[0] if outcome.violations else None
    return {
        "label": label,
        "code": code_fingerprint(),
        "settings": outcome.settings.as_dict(),
        "plan": [f.as_dict() for f in outcome.plan],
        "choices": outcome.choices,
        "violations": [str(v) for v in outcome.violations],
        "invariant": None if first is None else first.name,
        "digest": outcome.digest,
        "steps": outcome.steps,
        "timeline": relevant(outcome.lines, None if first is None else first.delivery),
    }


def save(outcome: Outcome, path: Path, *, label: str = "") -> Path:
    return write_failure(path, record(outcome, label=label))


def load(path: Path) -> tuple[Settings, list[Fault], list[int], dict[str, Any]]:
    data = read_failure(path)
    settings = Settings(**data["settings"])
    plan = [Fault.from_dict(f) for f in data["plan"]]
    return settings, plan, list(data["choices"]), data


def replay(path: Path) -> tuple[Outcome, bool]:
    """Run a saved failure again; True when it replayed exactly (same trace hash)."""
    settings, plan, choices, data = load(path)
    outcome = run_schedule(settings, plan=plan, choices=choices)
    return outcome, outcome.digest == data.get("digest")


def same_code(path: Path) -> bool:
    """Whether the file was saved by this very code (``code_fingerprint``)."""
    return bool(read_failure(path).get("code") == code_fingerprint())


def replay_verdict(exact: bool, same: bool) -> str:
    """What ``replayed exactly`` means for a file: the same timeline; another because
    the code changed since the file was saved (expected: the schedule ran again on
    today's code); or another from the same code: a determinism bug."""
    if exact:
        return "yes"
    if same:
        return "no: the same code gave another timeline, a determinism bug (report it)"
    return "no: saved by other code; its schedule ran again on this code"
