"""CPU sets for the CPU split (RIGDASH_DECODE_CPUS): the split itself, and the CPUs a process's threads may run on."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuSplit:
    """``RIGDASH_DECODE_CPUS``: CPUs llama-server has to itself (``decode``) and the rest, for everything else."""

    decode: frozenset[int]
    rest: frozenset[int]

    @property
    def every(self) -> frozenset[int]:
        return self.decode | self.rest

    def describe(self) -> str:
        decode, rest = cpu_list(self.decode), cpu_list(self.rest)
        return f"llama-server's decode alone on CPU {decode}, RigDash's processes on CPU {rest}"


def cpu_list(cpus: frozenset[int]) -> str:
    """CPUs as Linux and taskset write them: 0,1,3."""
    return ",".join(str(c) for c in sorted(cpus))


def thread_cpus(pid: int) -> dict[int, frozenset[int]]:
    """Each thread of a running process and the CPUs the kernel lets it run on (Linux's /proc)."""
    cpus: dict[int, frozenset[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            for line in (task / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    cpus[int(task.name)] = frozenset(_cpu_numbers(line.split(":", 1)[1]) or ())
    return cpus


def _cpu_numbers(text: str) -> set[int] | None:
    """A CPU list as Linux writes it (``1``, ``2-7``, ``0,2-3``) as a set of CPUs; None if the text is not one."""
    cpus: set[int] = set()
    for part in "".join(text.split()).split(","):
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())) or (sep and int(hi) < int(lo)):
            return None
        cpus.update(range(int(lo), int(hi if sep else lo) + 1))
    return cpus
