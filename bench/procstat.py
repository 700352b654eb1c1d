"""Two counters of the kernel's that tell a slow machine from a slow program (Linux; 0 where they are not kept).

- steal: CPU time the hypervisor gave to another guest while this VM's vCPUs wanted to run (``/proc/stat``);
- run delay: time a process's threads waited, runnable, for a core (``/proc/<pid>/task/*/schedstat``, the second
  field): how often something else on this machine held the core they were ready to run on.
"""

from __future__ import annotations

from pathlib import Path

import psutil


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
