"""The CPU split lifts while several replies stream (rigdash/cpushare.py): the worker's signal, the launcher's moves.

Real processes, real pipes, and the kernel's own record of where each thread may run (/proc). The last test runs a
real Celery worker against the real llama-server with two replies at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import psutil
import pytest

from inference.turns import submit
from inference.worker.pace import FlushPace
from rigdash import cpushare
from rigdash.cpushare import START, STOP, CpuShare, StreamsSignal, hold_mode, share_for
from rigdash.launcher import ROOT, CpuSplit, Stack, cpu_list, thread_cpus, worker_command
from tests.conftest import LOG_DIR, wait_until


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def test_the_worker_says_when_each_reply_starts_and_stops_streaming():
    """One byte when a reply starts streaming and one when it stops, from the pace's own count: never per token."""
    read_fd, write_fd = os.pipe()
    signal = StreamsSignal(write_fd)
    pace = FlushPace(0.01, 0.033, on_change=signal.streams)
    with pace.streaming_turn():
        assert _read_all(read_fd) == START
        with pace.streaming_turn():
            assert _read_all(read_fd) == START
            pace.interval()  # a batch: nothing sent
            assert _read_all(read_fd) == b""
        assert _read_all(read_fd) == STOP
    assert _read_all(read_fd) == STOP
    assert pace.streaming == 0
    os.close(read_fd)
    os.close(write_fd)


def test_what_a_full_pipe_refuses_is_sent_with_the_next_change_in_order():
    """The launcher adds the bytes up: one lost would leave it counting a reply that ended."""
    read_fd, write_fd = os.pipe()
    signal = StreamsSignal(write_fd)
    os.set_blocking(write_fd, False)
    for size in (4096, 1):  # fill the pipe to its last byte
        while True:
            try:
                os.write(write_fd, b"x" * size)
            except BlockingIOError:
                break
    signal.streams(+1)
    signal.streams(+1)
    assert signal.unsent == START + START
    drained = b""
    while chunk := _read_all(read_fd):
        drained += chunk
    assert START not in drained
    signal.streams(-1)
    assert signal.unsent == b""
    assert _read_all(read_fd) == START + START + STOP
    os.close(read_fd)
    os.close(write_fd)


def test_a_worker_whose_launcher_went_away_streams_on():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    signal = StreamsSignal(write_fd)
    signal.streams(+1)  # EPIPE (Python ignores SIGPIPE): the signal turns itself off, nothing raised
    assert signal.fd is None
    signal.streams(-1)
    os.close(write_fd)


def test_without_the_launchers_pipe_the_signal_is_off(monkeypatch):
    monkeypatch.delenv(cpushare.ENV_FD, raising=False)
    assert StreamsSignal.from_env().fd is None
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    monkeypatch.setenv(cpushare.ENV_FD, str(write_fd))  # a number that is no open descriptor here
    assert StreamsSignal.from_env().fd is None
    os.close(read_fd)


@pytest.mark.parametrize("value, expected", [("", "one-reply"), ("one-reply", "one-reply"), (" always ", "always")])
def test_the_hold_is_one_reply_unless_always(monkeypatch, value, expected):
    monkeypatch.setenv("RIGDASH_DECODE_CPUS_HOLD", value)
    assert hold_mode() == expected


def test_a_bad_hold_stops_the_start_with_what_is_expected(monkeypatch):
    monkeypatch.setenv("RIGDASH_DECODE_CPUS_HOLD", "sometimes")
    with pytest.raises(SystemExit, match=r"RIGDASH_DECODE_CPUS_HOLD='sometimes': expected one-reply .* or always"):
        hold_mode()


def test_the_launcher_shares_only_under_a_split_that_lifts(monkeypatch, decode_on_last_cpu):
    split = _split(decode_on_last_cpu)
    monkeypatch.delenv("RIGDASH_DECODE_CPUS_HOLD", raising=False)
    assert share_for(None, log=print) is None
    share = share_for(split, log=print)
    assert isinstance(share, CpuShare) and share.split == split
    os.close(share._read_fd)
    os.close(share._write_fd)
    monkeypatch.setenv("RIGDASH_DECODE_CPUS_HOLD", "always")
    assert share_for(split, log=print) is None


# A stand-in for the worker: it starts two threads and a child, then tells its StreamsSignal each step between the
# counts it reads.
STAND_IN = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    from rigdash.cpushare import StreamsSignal
    signal = StreamsSignal.from_env()
    for _ in range(2):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(child.pid, flush=True)
    count = 0
    for line in sys.stdin:  # each line: how many replies stream now
        signal.streams(int(line) - count)
        count = int(line)
    child.kill()
    """
)


def _cpus_of_tree(pids: list[int]) -> dict[int, frozenset[int]]:
    cpus: dict[int, frozenset[int]] = {}
    for pid in pids:
        cpus.update(thread_cpus(pid))
    return cpus


def _tree_of(pid: int) -> list[int]:
    return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]


def _split(allowed: list[int]) -> CpuSplit:
    return CpuSplit(decode=frozenset(allowed[-1:]), rest=frozenset(allowed[:-1]))


def _start_stand_in(share: CpuShare, allowed: list[int]) -> subprocess.Popen[str]:
    """STAND_IN off the decode's CPU with the launcher's pipe, as the launcher starts the worker."""
    return subprocess.Popen(
        ["taskset", "--cpu-list", ",".join(map(str, allowed[:-1])), sys.executable, "-c", STAND_IN],
        env={**os.environ, **share.worker_env()},
        pass_fds=share.pass_fds,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_every_thread_and_child_moves_to_every_cpu_with_several_replies_and_back_after_the_hold(decode_on_last_cpu):
    allowed = decode_on_last_cpu
    split = _split(allowed)
    said: list[str] = []
    share = CpuShare(split, hold_s=0.4, log=said.append)
    proc = _start_stand_in(share, allowed)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        child = int(proc.stdout.readline())
        share.watch([proc.pid])
        tree = [proc.pid, child]
        assert len(_cpus_of_tree(tree)) >= 4  # the main thread, two sleepers, the child
        assert set(_cpus_of_tree(tree).values()) == {split.rest}

        def tell(count: int) -> None:
            assert proc.stdin is not None
            proc.stdin.write(f"{count}\n")
            proc.stdin.flush()

        tell(1)
        tell(2)
        wait_until(lambda: set(_cpus_of_tree(tree).values()) == {split.every}, timeout_s=5, what="every CPU")
        assert share.shared and share.moves == 1
        tell(1)
        time.sleep(0.15)  # within the hold: they stay on every CPU
        assert set(_cpus_of_tree(tree).values()) == {split.every}
        tell(2)  # several again before the hold ran out: no move at all
        time.sleep(0.5)
        assert share.moves == 1 and set(_cpus_of_tree(tree).values()) == {split.every}
        started = time.monotonic()
        tell(1)
        wait_until(lambda: set(_cpus_of_tree(tree).values()) == {split.rest}, timeout_s=5, what="back on the rest")
        assert time.monotonic() - started >= 0.35  # not before the hold
        assert share.moves == 2 and not share.shared
        assert said[0].startswith("several replies stream: RigDash's processes may use every CPU")
        assert said[1].startswith(f"one reply or none: RigDash's processes back on CPU {cpu_list(split.rest)} (")
        proc.stdin.close()  # the stand-in exits: the pipe's writer is gone and the watch ends
        proc.wait(timeout=10)
        assert share._thread is not None
        share._thread.join(timeout=5)
        assert not share._thread.is_alive()
    finally:
        proc.kill()
        proc.wait()


def test_replies_streaming_in_two_processes_count_together(decode_on_last_cpu):
    """A prefork pool's children share the launcher's pipe, one reply each: together they are several."""
    allowed = decode_on_last_cpu
    split = _split(allowed)
    share = CpuShare(split, hold_s=0.3, log=lambda line: None)
    procs = [_start_stand_in(share, allowed) for _ in range(2)]
    try:
        tree = []
        for proc in procs:
            assert proc.stdout is not None
            tree += [proc.pid, int(proc.stdout.readline())]
        share.watch([proc.pid for proc in procs])

        def tell(proc: subprocess.Popen[str], count: int) -> None:
            assert proc.stdin is not None
            proc.stdin.write(f"{count}\n")
            proc.stdin.flush()

        tell(procs[0], 1)
        time.sleep(0.3)
        assert not share.shared  # one reply in all
        tell(procs[1], 1)
        wait_until(lambda: set(_cpus_of_tree(tree).values()) == {split.every}, timeout_s=5, what="every CPU")
        tell(procs[0], 0)
        wait_until(lambda: set(_cpus_of_tree(tree).values()) == {split.rest}, timeout_s=5, what="back on the rest")
        assert share.moves == 2 and share.streaming == 1
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_real_worker_lifts_the_split_while_two_replies_stream(
    decode_on_last_cpu, service_env, owner, llama_url, model_name, pool
):
    """A Celery worker as the launcher starts it under the split (off the decode's CPU, with the pipe), on a queue
    of its own, and two turns on the real llama-server at once: its threads may use every CPU while both
    stream, and go back to the rest once they have ended and the hold is over. Under a prefork pool each reply
    may stream in a child of its own: the launcher counts them together."""
    from inference.models import ChatSession, Rig, Turn

    allowed = decode_on_last_cpu
    split = _split(allowed)
    queue = f"rig.cpushare{os.getpid()}"
    rig = Rig.objects.create(name="cpushare-rig", kind=Rig.Kind.LLAMACPP, base_url=llama_url, queue=queue, slots=2)
    sessions = [ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name) for _ in range(2)]
    said: list[str] = []
    share = CpuShare(split, hold_s=0.5, log=said.append)
    stack = Stack()
    try:
        name = f"cpushare{os.getpid()}@localhost"
        worker = stack.start(
            "worker",
            ["taskset", "--cpu-list", ",".join(map(str, allowed[:-1])),
             *worker_command(queues=[queue], concurrency=2, name=name, beat_schedule=None)],
            env={**service_env, **share.worker_env(), "RIGDASH_WORKER_POOL": pool},
            log_path=LOG_DIR / f"worker-cpushare-{pool}.log",
            pass_fds=share.pass_fds,
        )  # fmt: skip
        share.watch([worker.pid])
        from rigdash.celery import app

        wait_until(lambda: any(name in r for r in app.control.ping(timeout=0.5)), timeout_s=60, what="the worker")
        assert set(_cpus_of_tree(_tree_of(worker.pid)).values()) == {split.rest}
        params: dict[str, Any] = {"temperature": 0, "max_tokens": 300}
        text = "Tell a long story about a lighthouse."
        requests = [submit.SubmitRequest(user=owner, session_id=s.pk, text=text, params=params) for s in sessions]
        # One submit each: two tasks, which a prefork pool runs in two children (a burst would be one task).
        turns = [submit.turn_submit_many([request])[0] for request in requests]
        assert all(isinstance(t, Turn) for t in turns), turns
        wait_until(lambda: share.shared, timeout_s=60, what="the split lifted")
        assert set(_cpus_of_tree(_tree_of(worker.pid)).values()) == {split.every}
        wait_until(
            lambda: all(Turn.objects.get(pk=t.pk).status == Turn.Status.DONE for t in turns if isinstance(t, Turn)),
            timeout_s=120,
            what="both replies",
        )
        wait_until(lambda: not share.shared, timeout_s=10, what="the split back")
        assert set(_cpus_of_tree(_tree_of(worker.pid)).values()) == {split.rest}
        assert share.moves == 2, said
    finally:
        stack.stop()
