"""Scheduling policies: which ready callback runs next.

Every decision with more than one candidate is one recorded ``int`` (the index of
the candidate taken), so that a run can be replayed exactly from its choice list
and shrunk: index 0 is always "the default order" (the oldest candidate), which is
what a truncated or zeroed choice list falls back to.

- ``host`` (default): choose a ready host uniformly, then run that host's oldest
  callback, as separate processes would (each one FIFO, their interleaving free).
- ``random``: uniform over all ready callbacks (finer than any real process).
- ``pct:D``: probabilistic concurrency testing with depth ``D`` (Burckhardt et al.,
  ASPLOS 2010): random priorities per task, the highest ready one runs, and at
  ``D - 1`` random steps the running task drops below every other.
- ``replay``: the recorded choices, then the default order.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Protocol

#: steps over which PCT spreads its priority change points
PCT_HORIZON = 20_000


class Policy(Protocol):
    #: True: candidates are hosts (their oldest callback runs); False: callbacks
    grouped: bool

    def pick(self, owners: Sequence[Hashable], step: int) -> int:
        """Index of the candidate to run; ``owners`` has at least two entries."""
        ...

    def describe(self) -> str: ...


class HostPolicy:
    """A ready host chosen uniformly by the seed, then its oldest callback."""

    grouped = True

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"host:{seed}")

    def pick(self, owners: Sequence[Hashable], step: int) -> int:
        return self.rng.randrange(len(owners))

    def describe(self) -> str:
        return "host"


class RandomPolicy:
    """Any ready callback, uniformly."""

    grouped = False

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"random:{seed}")

    def pick(self, owners: Sequence[Hashable], step: int) -> int:
        return self.rng.randrange(len(owners))

    def describe(self) -> str:
        return "random"


class PCTPolicy:
    """PCT with depth ``depth``: priorities per owner (a task, or a host for plain
    callbacks), ``depth - 1`` change points that demote the running owner."""

    grouped = False

    def __init__(self, seed: int, depth: int) -> None:
        if depth < 1:
            raise ValueError("PCT depth must be at least 1")
        self.depth = depth
        self.rng = random.Random(f"pct:{depth}:{seed}")
        self.priority: dict[Hashable, float] = {}
        points = self.rng.sample(range(1, PCT_HORIZON), depth - 1)
        #: step -> the (low) priority the running owner gets at that step
        self.change: dict[int, float] = {
            step: float(i) for i, step in enumerate(sorted(points), start=1)
        }

    def _priority(self, owner: Hashable) -> float:
        if owner not in self.priority:
            self.priority[owner] = self.depth + self.rng.random()
        return self.priority[owner]

    def pick(self, owners: Sequence[Hashable], step: int) -> int:
        best = max(range(len(owners)), key=lambda i: (self._priority(owners[i]), -i))
        low = self.change.get(step)
        if low is not None:
            self.priority[owners[best]] = low
        return best

    def describe(self) -> str:
        return f"pct:{self.depth}"


class ReplayPolicy:
    """The recorded choices in order, then index 0 (the default order)."""

    def __init__(self, choices: Sequence[int], *, grouped: bool) -> None:
        self.choices = list(choices)
        self.grouped = grouped
        self.at = 0

    def pick(self, owners: Sequence[Hashable], step: int) -> int:
        if self.at >= len(self.choices):
            return 0
        value = self.choices[self.at]
        self.at += 1
        return value % len(owners)

    def describe(self) -> str:
        return "replay"


def make_policy(spec: str, seed: int) -> Policy:
    """``host``, ``random`` or ``pct:D``."""
    if spec == "host":
        return HostPolicy(seed)
    if spec == "random":
        return RandomPolicy(seed)
    if spec.startswith("pct:"):
        try:
            depth = int(spec[4:])
        except ValueError:
            raise ValueError(f"bad PCT depth in {spec!r} (expected pct:D)") from None
        return PCTPolicy(seed, depth)
    raise ValueError(f"unknown policy {spec!r} (host, random or pct:D)")


def is_grouped(spec: str) -> bool:
    """Whether a policy spec chooses hosts (needed to replay its choices)."""
    return spec == "host"
