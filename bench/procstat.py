"""Two counters of the kernel's that tell a slow machine from a slow program (Linux; 0 where they are not kept).

- steal: CPU time the hypervisor gave to another guest while this VM's vCPUs wanted to run (``/proc/stat``);
- run delay: time a process's threads waited, runnable, for a core (``/proc/<pid>/task/*/schedstat``, the second
  field): how often something else on this machine held the core they were ready to run on.

``Counters.read`` takes both (with the clock) at one moment; ``since`` turns two readings into a window's figures.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import stats


def steal_s() -> float:
    """CPU seconds the hypervisor has taken from this VM since boot, all cores."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def run_delay_s(pid: int) -> float:
    """Seconds the process's threads have waited, runnable, for a core, since each started."""
    total = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            fields = path.read_text().split()
        except OSError:  # a thread that ended meanwhile
            continue
        if len(fields) >= 2 and fields[1].isdigit():
            total += int(fields[1])
    return total / 1e9


@dataclass(frozen=True)
class Counters:
    """The clock, steal, and one process's run delay (llama-server's; 0 without a pid), read together."""

    t: float
    steal_s: float
    wait_s: float

    @classmethod
    def read(cls, pid: int | None = None) -> Counters:
        return cls(time.monotonic(), steal_s(), run_delay_s(pid) if pid else 0.0)

    def since(self, before: Counters) -> dict[str, Any]:
        """The window from ``before`` to this reading: its length, the share of the machine's CPU the hypervisor
        took, and how long the process's threads waited for a core, in ms a second."""
        wall = self.t - before.t
        return {
            "wall_s": wall,
            "steal_share": stats.steal_share(self.steal_s - before.steal_s, wall, os.cpu_count() or 1),
            "llama_wait_ms_per_s": 1000 * (self.wait_s - before.wait_s) / wall if wall > 0 else None,
        }
