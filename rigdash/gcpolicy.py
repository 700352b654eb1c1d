"""Garbage collection in RigDash's long-running processes: the web servers, the worker and the sampler.

CPython's full collection (generation 2) walks every tracked object the process holds. In a web process holding
hundreds of sockets it stopped the event loop for about 100 ms on a 2-core VM, and every token frame due meanwhile
reached its browser that much later (docs/benchmarks.md, "Many viewers"). Most of those objects are what the
process built while it started (Django, the apps, their modules, classes and functions) and keeps until it exits.
``settle()`` collects once and moves them to the permanent generation, which later collections do not walk
(https://docs.python.org/3/library/gc.html#gc.freeze): a full collection then costs what the process has made
since, sockets and turns, not what it loaded.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)


def settle(process: str) -> int:
    """Collect, then freeze every object that survives (call once the process has loaded what it serves with);
    returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.info("%s: %d objects moved to the permanent generation", process, frozen)
    return frozen
