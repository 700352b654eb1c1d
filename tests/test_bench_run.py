"""bench/run.py's plumbing: a stack that fails to start is stopped, not left running."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

import pytest

from bench.run import QUICK, Bench


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
