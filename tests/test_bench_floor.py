"""The browser floor's pure parts (bench/browser_floor.py): the rotation of conditions and the per-round ratios.

The measurement itself needs llama-server and Chromium, and runs from ./scripts/bench --browser-floor, outside
the suite."""

from __future__ import annotations

from bench import browser_floor, procstat


def test_each_round_starts_one_condition_further_and_keeps_them_all():
    names = list(browser_floor.PARTS[1])
    orders = [browser_floor.rotated(names, r) for r in range(len(names) + 1)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert [o[0] for o in orders[: len(names)]] == names  # every condition goes first once
    assert orders[len(names)] == orders[0]


def _read(tps, **extra):
    return {"backend_tps": tps, "prompt_ms": 100.0, "chromium_cpu_ms_per_s": 5.0, "frames_per_s": 0.0} | extra


def test_ratios_are_taken_within_a_round_so_the_machines_drift_cancels():
    # The machine is twice as fast in round 2; the page costs 10 % in both rounds.
    rounds = [
        {"blank": _read(100.0), "chat@10": _read(90.0, frames_per_s=60.0)},
        {"blank": _read(200.0), "chat@10": _read(180.0, frames_per_s=60.0)},
    ]
    rows = {row["condition"]: row for row in browser_floor.summarize(rounds)}
    assert rows["chat@10"]["ratio_to_blank"] == 0.9 and rows["chat@10"]["ratio_min_max"] == [0.9, 0.9]
    assert rows["blank"]["ratio_to_blank"] == 1.0
    assert rows["chat@10"]["backend_tps"] == 135.0  # the median across rounds, which carries the drift
    assert rows["chat@10"]["frames_per_s"] == 60.0


def test_a_failed_read_is_counted_and_left_out_of_the_ratio():
    rounds = [
        {"blank": _read(100.0), "chat@10": _read(None, error="timed out after 120 s")},
        {"blank": _read(100.0), "chat@10": _read(80.0)},
    ]
    row = {r["condition"]: r for r in browser_floor.summarize(rounds)}["chat@10"]
    assert row["failed"] == 1 and row["reads"] == 2
    assert row["ratio_to_blank"] == 0.8


def test_run_delay_counts_the_time_a_process_waited_for_a_core():
    """More busy processes than cores (bounded to about a second): this one must wait for a core meanwhile."""
    import os
    import subprocess
    import sys
    import time

    burn = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.2)  # the burners are running
        before = procstat.run_delay_s(os.getpid())
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            pass
        waited = procstat.run_delay_s(os.getpid()) - before
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    assert waited > 0.02  # about 0.6 / (cores + 1) s expected
    assert procstat.run_delay_s(2**22 + 12345) == 0.0  # no such process: nothing counted
