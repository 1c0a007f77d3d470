"""The cyclic garbage collector while workers run: what was there before is frozen.

A worker allocates a few short-lived containers per delivery (rows, claims, futures),
so CPython's collector runs often, and each full pass walks every object the process
holds: the modules, the configuration, the templates. Measured on ``kirim bench``
(SQLite, one worker), those passes were about a tenth of the worker's CPU per
delivery. ``frozen_heap`` moves what exists when the first worker of the process
starts into the permanent generation (``gc.freeze``): the passes walk only what the
workers made since. When the last running worker ends, everything is handed back to
the collector (``gc.unfreeze``), so a process that runs workers one after another
(tests, the explorer) keeps no garbage for ever; unless the process had frozen its heap
itself before (an application that freezes before it forks): ``gc.unfreeze`` cannot
hand back only what kirim froze, so then nothing is handed back.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_heap"]

#: workers of this process inside ``frozen_heap`` now
_running = 0
#: whether the process had frozen objects of its own when the first of them entered
_frozen_before = False


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap for the first worker that enters; unfreeze when the last leaves."""
    global _running, _frozen_before
    if _running == 0:
        _frozen_before = gc.get_freeze_count() > 0
        gc.freeze()
    _running += 1
    try:
        yield
    finally:
        _running -= 1
        if _running == 0 and not _frozen_before:
            gc.unfreeze()
