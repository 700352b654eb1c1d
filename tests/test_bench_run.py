"""bench/run.py's plumbing: a stack that fails to start is stopped, not left running; Chromium on the CPUs given."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import browser
from bench.run import QUICK, Bench
from rigdash.launcher import _cpu_numbers


def test_a_stack_that_fails_to_start_leaves_nothing_running():
    args = argparse.Namespace(flush_ms=None, flush_min_ms=None, database_url=None, redis_url=None, levels="1")
    bench = Bench(args, QUICK)
    started: list[subprocess.Popen[bytes]] = []

    def start(log: object = print) -> None:  # what happened when the web server exited at start: the rest was up
        started.append(bench.stack.stack.start("llama-stand-in", [sys.executable, "-c", "import time; time.sleep(60)"]))
        raise RuntimeError("process for http://127.0.0.1:1/static/rigdash/app.css exited with code 1")

    bench.stack.start = start  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="exited with code 1"):
        asyncio.run(bench.run())
    assert started and started[0].wait(timeout=10) is not None  # stopped by the benchmark, not by this test


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs, to pin the parent to one")
def test_under_a_split_chromium_is_started_on_every_cpu_though_the_benchmark_is_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--decode-cpus`` without ``--pin-browser``: under a split the benchmark keeps itself off the decode CPUs,
    and Chromium, started from it, would inherit that; a user's browser does not. A stand-in for Chromium prints
    its CPUs and arguments."""
    every = frozenset(os.sched_getaffinity(0))
    stand_in = tmp_path / "chromium stand-in"  # a space in the path: the script must quote it
    stand_in.write_text('#!/bin/sh\ngrep Cpus_allowed_list /proc/self/status\nprintf "%s|" "$@"\n')
    stand_in.chmod(0o755)
    monkeypatch.setattr(browser, "CHROMIUM", str(stand_in))
    script = browser.launcher_on_cpus(every, tmp_path / "bin")

    def pin() -> None:  # the benchmark under a split: every process it starts inherits this
        os.sched_setaffinity(0, {min(every)})

    def run_pinned(*command: str) -> tuple[set[int] | None, str]:
        out = subprocess.run(command, capture_output=True, text=True, check=True, preexec_fn=pin).stdout.splitlines()
        return _cpu_numbers(out[0].split(":", 1)[1]), out[1]

    assert run_pinned(str(stand_in), "--headless")[0] == {min(every)}  # started directly, it inherits the pin
    cpus, args = run_pinned(script, "--headless", "a b")
    assert cpus == set(every)
    assert args == "--headless|a b|"
