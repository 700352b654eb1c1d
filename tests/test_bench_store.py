"""bench/store.py, run as a user runs it (its own process, a new SQLite file): it measures every burst size, and
a burst's statements do not grow with its size (one INSERT for the burst's turns, inference/turns/submit.py)."""

from __future__ import annotations

import re
import sys

from django.conf import settings

from tests.conftest import ROOT, run


def test_the_store_benchmark_runs_and_a_bursts_statements_do_not_grow_with_it():
    done = run([sys.executable, "-m", "bench.store", "--rounds", "3", "--redis-url", settings.REDIS_URL], cwd=ROOT,
               timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = re.findall(r"^\s*(\d+) submits: +([\d.]+) ms per burst .*, (\d+) statements$", done.stdout, re.M)
    assert [int(burst) for burst, _, _ in lines] == [1, 4, 16], done.stdout
    assert all(float(ms) > 0 for _, ms, _ in lines)
    assert len({statements for _, _, statements in lines}) == 1, done.stdout
