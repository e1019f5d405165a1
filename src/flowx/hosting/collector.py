"""CPython's cyclic garbage collector, given room while a node is open.

CPython collects its youngest generation each time 700 more container objects have been
allocated than freed, every tenth young collection collects the middle one too, and now and
then a collection walks every object the process holds. A node running many flows at once
allocates in bursts: a group commit's answer wakes tens of flows together, and each builds
its step's context, row and state before the next commit lets them go. At 700 such a burst
sets off a young collection every few dozen steps, and what is alive at that moment (the
burst itself) is promoted, so older collections follow. Measured at 64 flows in flight on
PostgreSQL (``benchmarks/gc_threshold.py``), collections took 14 µs of the 132 µs of CPU a
3-step flow's step cost the node, and 6.7 of 80 at 10 steps; with the threshold at 10,000 a
burst is freed before a collection is due: 0.25 and 0.17 µs.

So while at least one node of the process is open, the first threshold is raised to
``HostSettings.gc_threshold`` (10,000; ``0`` leaves the collector as it is). It is only ever
raised, never lowered, and nothing is frozen or disabled: a collector that was disabled
(``gc.disable()`` or a threshold of 0) is left so. Garbage caught in a reference cycle waits
longer to be collected (up to that many young objects more). The last node of the process
to close puts back the thresholds it found, unless something else changed them meanwhile.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
#: Nodes of this process that are open with a threshold to keep.
_holders = 0
#: The thresholds found before the first raise, and the ones set then (``None``: untouched).
_found: tuple[int, int, int] | None = None
_set: tuple[int, int, int] | None = None


def hold(young: int) -> bool:
    """A node opens: the young threshold at least ``young`` while it is open. Returns
    whether this node now holds it (pass that to ``release``); ``young`` 0: it does not."""
    global _holders, _found, _set
    if young <= 0:
        return False
    with _lock:
        current = gc.get_threshold()
        if _holders == 0 or current != _set:
            # The first node, or the application set its own since: what to put back.
            _found, _set = current, None
        if gc.isenabled() and 0 < current[0] < young:
            _set = (young, current[1], current[2])
            gc.set_threshold(*_set)
        _holders += 1
        return True


def release(held: bool) -> None:
    """A node that ``hold`` said holds the threshold has closed: the last one puts back
    what was found, if the thresholds are still the ones it set."""
    global _holders, _found, _set
    if not held:
        return
    with _lock:
        _holders = max(_holders - 1, 0)
        if _holders:
            return
        if _set is not None and _found is not None and gc.get_threshold() == _set:
            gc.set_threshold(*_found)
        _found = _set = None
