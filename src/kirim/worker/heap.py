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

The youngest generation is collected after every 700 new containers (CPython's
threshold): a worker with hundreds of deliveries in flight holds thousands of young
objects that are alive (claims, rows, futures), and each of those passes walks them
and moves them up, where the next generation's passes walk them again. Measured on
``bench/profile_worker.py`` (5,000 deliveries, one worker, ``gc.callbacks`` timing
each pass; medians of 3), the passes took 32 ms on SQLite and 52 ms on PostgreSQL
(about 320 of them), 6-10 µs of CPU per delivery. While workers run, the youngest
generation's threshold is ``YOUNG`` instead: 3 passes, 5 and 8 ms (a batch claim's
objects are walked about once).
Garbage without cycles goes at once whatever the threshold (reference counting);
cyclic garbage waits at most ``YOUNG`` new containers. The threshold the process had
is put back when the last worker ends, unless the process changed it meanwhile; a
process that set a higher one, or turned automatic collection off (0), keeps its own.
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
#: the collector's thresholds when the first of them entered, and the ones set then
_thresholds_before: tuple[int, ...] = ()
_thresholds_set: tuple[int, ...] = ()

#: the youngest generation's collection threshold while workers run (see above)
YOUNG = 10_000


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze the heap and raise the youngest generation's threshold for the first
    worker that enters; give both back when the last leaves."""
    global _running, _frozen_before, _thresholds_before, _thresholds_set
    if _running == 0:
        _frozen_before = gc.get_freeze_count() > 0
        gc.freeze()
        _thresholds_before = _thresholds_set = gc.get_threshold()
        young, *older = _thresholds_before
        if 0 < young < YOUNG:  # 0: the process turned automatic collection off
            gc.set_threshold(YOUNG, *older)
            _thresholds_set = gc.get_threshold()
    _running += 1
    try:
        yield
    finally:
        _running -= 1
        if _running == 0:
            if gc.get_threshold() == _thresholds_set:  # not changed by the process since
                gc.set_threshold(*_thresholds_before)
            if not _frozen_before:
                gc.unfreeze()
