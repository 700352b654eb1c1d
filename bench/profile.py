"""``--profile``: sample RigDash's web, worker and sampler processes with py-spy while the benchmark runs.

py-spy (``pip install py-spy`` into the venv) writes folded stacks (``--format raw``); ``top`` turns them
into the functions where the samples fall: leaf ("self") and anywhere on the stack ("inclusive").
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

LINE = re.compile(r":\d+\)$")
# Leaf frames of threads that wait (py-spy cannot always tell idle threads here): left out of the counts.
IDLE = ("EpollSelector.select", "Condition.wait", "_worker (concurrent", "Connection._recv", "_epoll.poll",
        "select (selectors", "Event.wait", "sleep")  # fmt: skip


def start(pids: dict[str, int], out_dir: Path, rate: int = 250) -> list[tuple[str, subprocess.Popen[bytes], Path]]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = []
    for role, pid in pids.items():
        path = out_dir / f"{role}.folded"
        cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), "--nonblocking",
               "--subprocesses", "--gil", "--output", str(path)]  # fmt: skip
        log = open(out_dir / f"{role}.py-spy.log", "wb")  # noqa: SIM115 - lives as long as py-spy
        started.append((role, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), path))
    return started


def stop(started: list[tuple[str, subprocess.Popen[bytes], Path]]) -> dict[str, dict[str, list[tuple[str, int]]]]:
    summaries = {}
    for role, proc, path in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if path.exists():
            summaries[role] = top(path.read_text(errors="replace"))
    return summaries


def top(folded: str, n: int = 25) -> dict[str, list[tuple[str, int]]]:
    """The ``n`` functions with most samples as leaf and anywhere on the stack, from folded stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = busy = 0
    for line in folded.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [LINE.sub(")", f) for f in stack.split(";") if f]
        if not frames:
            continue
        if frames[-1].startswith(IDLE):
            continue
        busy += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return {
        "total": [("samples", total), ("busy", busy)],
        "self": own.most_common(n),
        "inclusive": inclusive.most_common(n),
    }
