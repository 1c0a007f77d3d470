"""The cyclic garbage collector while workers run: what was there before is frozen.

A worker allocates a few short-lived containers per delivery (rows, claims, futures),
so CPython's collector runs often, and each full pass walks every object the process
holds: the modules, the configuration, the templates. Measured on ``kirim bench``
(SQLite, one worker), those passes were about a tenth of the worker's CPU per
delivery. ``frozen_heap`` moves what exists when the first worker of the process
starts into the permanent generation (``gc.freeze``): the passes walk only what the
workers made since. When the last running worker ends, everything is handed back to
the collector (``gc.unfreeze``), so a process that runs workers one after another
(tests, the explorer) keeps no garbage for ever.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap"]

#: workers of this process inside ``frozen_heap`` now
_running = 0


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap for the first worker that enters; unfreeze when the last leaves."""
    global _running
    if _running == 0:
        gc.freeze()
    _running += 1
    try:
        yield
    finally:
        _running -= 1
        if _running == 0:
            gc.unfreeze()
