"""Under the CPU split, RigDash's processes keep off the decode's CPUs only while at most one reply streams.

``RIGDASH_DECODE_CPUS`` gives llama-server's decode CPUs of its own and runs RigDash on the rest (rigdash/launcher.py).
That suits one reply: nothing takes the decode's core from under it, and llama-server waits far less for a core.
With several replies llama.cpp decodes them together on its batch threads, every CPU, and RigDash, with every
stream's batches and frames to send, would have one core left: its added TTFT grows several times
(docs/changelog.md). So the split holds while one reply streams, and lifts while several do:

- the worker says when a reply starts and stops streaming (``StreamsSignal``): one byte on a pipe the launcher gave
  it, ``+`` or ``-``, twice a reply and never per token. The launcher adds them up, so replies streaming in
  different processes count together (a prefork pool's children share the pipe);
- the launcher (``CpuShare``) lets RigDash's processes, every thread of them, run on every CPU as soon as a second
  reply streams, and moves them back once at most one has streamed for ``HOLD_S``, so that a rig whose users send
  by turns does not move thirty threads back and forth at every reply.

``RIGDASH_DECODE_CPUS_HOLD=always`` keeps the split whatever streams.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import threading
import time
from collections.abc import Callable, Sequence

import psutil

from rigdash.cpus import CpuSplit, cpu_list, thread_cpus

ENV_FD = "RIGDASH_CPU_SHARE_FD"
START, STOP = b"+", b"-"
HOLD_S = 2.0
HOLD_MODES = ("one-reply", "always")


def hold_mode() -> str:
    """``RIGDASH_DECODE_CPUS_HOLD``: ``one-reply`` (the default) or ``always``; a clear error for anything else."""
    mode = os.environ.get("RIGDASH_DECODE_CPUS_HOLD", "").strip() or "one-reply"
    if mode not in HOLD_MODES:
        raise SystemExit(
            f"RIGDASH_DECODE_CPUS_HOLD={mode!r}: expected one-reply (the split holds while at most one reply "
            "streams) or always"
        )
    return mode


class StreamsSignal:
    """The worker's side: ``START`` when a reply starts streaming, ``STOP`` when it stops.

    Called from the worker's event loop (``inference.worker.pace.FlushPace``) with each step of a pace's count; the
    launcher keeps the sum, so a pace replaced, or a second loop, cannot skew it. The pipe is non-blocking: what a
    full pipe refuses is kept and sent with the next change, in order (the launcher adds the bytes up, so none may
    be lost), and a launcher that went away turns the signal off."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.unsent = b""
        if fd is not None:
            os.set_blocking(fd, False)

    @classmethod
    def from_env(cls) -> StreamsSignal:
        value = os.environ.get(ENV_FD, "")
        if not value.isdigit():
            return cls(None)
        try:
            return cls(int(value))
        except OSError:  # not an open descriptor of this process (an environment copied into another process)
            return cls(None)

    def streams(self, step: int) -> None:
        """``step``: +1 when a reply starts streaming, -1 when it stops."""
        if self.fd is None or step == 0:
            return
        data = self.unsent + (START if step > 0 else STOP) * abs(step)
        try:
            written = os.write(self.fd, data)
        except BlockingIOError:  # 64 KiB unread: the launcher is busy; the next change sends these first
            written = 0
        except OSError:  # the launcher is gone
            self.fd, self.unsent = None, b""
            return
        self.unsent = data[written:]


@functools.cache
def worker_signal() -> StreamsSignal:
    """This process's signal: off unless the launcher started it with the pipe (``CpuShare.worker_env``)."""
    return StreamsSignal.from_env()


def share_for(split: CpuSplit | None, *, log: Callable[[str], None]) -> CpuShare | None:
    """The launcher's ``CpuShare`` for ``split``: none without a split, or where it holds whatever streams
    (``RIGDASH_DECODE_CPUS_HOLD=always``)."""
    if split is None or hold_mode() == "always":
        return None
    return CpuShare(split, log=log)


class CpuShare:
    """The launcher's side: moves RigDash's processes, every thread and child of them, between the split's other
    CPUs and every CPU as the worker's ``StreamsSignal`` says. Start the worker with ``worker_env()`` and
    ``pass_fds``, then call ``watch`` with the processes to move."""

    def __init__(self, split: CpuSplit, *, hold_s: float = HOLD_S, log: Callable[[str], None] = print) -> None:
        self.split, self.hold_s, self.log = split, hold_s, log
        self._read_fd, self._write_fd = os.pipe()
        self.pids: list[int] = []
        self.shared = False  # RigDash's processes may run on every CPU now
        self.streaming = 0  # replies streaming, every process of the worker together
        self.moves = 0
        self._thread: threading.Thread | None = None

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._write_fd,)

    def worker_env(self) -> dict[str, str]:
        return {ENV_FD: str(self._write_fd)}

    def watch(self, pids: Sequence[int]) -> None:
        """Start moving ``pids`` (the worker among them, already started with the pipe) as the signal says."""
        self.pids = list(pids)
        os.close(self._write_fd)  # the worker holds the only writer now: its exit ends the watch
        self._thread = threading.Thread(target=self._run, name="rigdash-cpushare", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        back_at: float | None = None  # when RigDash's processes go back off the decode's CPUs
        while True:
            timeout = None if back_at is None else max(0.0, back_at - time.monotonic())
            readable, _, _ = select.select([self._read_fd], [], [], timeout)
            if not readable:  # one reply or none for hold_s
                self._move(shared=False)
                back_at = None
                continue
            data = os.read(self._read_fd, 4096)
            if not data:  # every writer exited: the worker and any children it forked
                os.close(self._read_fd)
                return
            self.streaming = max(0, self.streaming + data.count(START) - data.count(STOP))
            if self.streaming >= 2:
                back_at = None
                self._move(shared=True)
            elif self.shared and back_at is None:
                back_at = time.monotonic() + self.hold_s

    def _move(self, *, shared: bool) -> None:
        if shared == self.shared:
            return
        cpus = self.split.every if shared else self.split.rest
        threads = move_processes(self.pids, cpus)
        self.shared, self.moves = shared, self.moves + 1
        self.log(
            f"several replies stream: RigDash's processes may use every CPU ({threads} threads)"
            if shared
            else f"one reply or none: RigDash's processes back on CPU {cpu_list(self.split.rest)} ({threads} threads)"
        )


def move_processes(pids: Sequence[int], cpus: frozenset[int]) -> int:
    """Let every thread of ``pids`` and of their children run on ``cpus``; how many threads were moved. A process
    or thread that ends meanwhile is skipped."""
    every: set[int] = set()
    for pid in pids:
        every.add(pid)
        with contextlib.suppress(psutil.Error):
            every.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    moved = 0
    for pid in sorted(every):
        try:
            tids = thread_cpus(pid)
        except OSError:  # it ended
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
            except (ProcessLookupError, PermissionError):
                continue
            moved += 1
    return moved
