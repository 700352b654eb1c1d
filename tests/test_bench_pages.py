"""bench.pages' slope table (docs/benchmarks.md, "Cost as the data grows"): the growth of p95 per 10x turns, and the
machine's speed beside each run's figures."""

from __future__ import annotations

import json

from bench.pages import slope_table


def _run(path, turns: int, p95: float, yardstick: list[float] | None) -> str:
    page = {"name": "chat list", "p50_ms": p95 / 2, "p95_ms": p95, "queries": 4}
    run = {"data": {"inference_turn": turns}, "pages": [page]}
    if yardstick:
        run["machine"] = {"yardstick_ms": yardstick}
    path.write_text(json.dumps(run))
    return str(path)


def test_the_slope_is_the_growth_of_p95_per_tenfold_turns_and_each_run_states_its_speed(tmp_path):
    small = _run(tmp_path / "a.json", 10_000, 20.0, [900.0, 950.0])
    large = _run(tmp_path / "b.json", 1_000_000, 80.0, [1400.0, 2100.0])
    table = slope_table([small, large])
    assert "10,000 turns p50 / p95 ms (queries); yardstick 900.0-950.0 ms" in table
    assert "1,000,000 turns p50 / p95 ms (queries); yardstick 1400.0-2100.0 ms" in table
    assert table.splitlines()[-1] == "| chat list | 10 / 20 (4) | 40 / 80 (4) | 2.00 |"  # 4x over two tenfold steps
    older = _run(tmp_path / "c.json", 100_000, 40.0, None)  # a run from before the yardstick
    assert "100,000 turns p50 / p95 ms (queries) |" in slope_table([small, older])
