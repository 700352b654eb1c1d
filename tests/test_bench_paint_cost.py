"""bench/paint_cost.py: each page it measures renders in the real headless Chromium, and its figures add up."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench import paint_cost
from bench.browser import CHROMIUM

pytestmark = pytest.mark.browser


def test_every_page_renders_frames_and_the_figures_are_consistent():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: scripts/test installs Debian's chromium package")
    rows = asyncio.run(paint_cost.measure(seconds=1.5, rounds=1, intervals=[33]))
    by_page = {row["page"]: row for row in rows}
    assert set(by_page) == {"text", "rigdash", "chat", "chat+bench"}
    for name, row in by_page.items():
        # A batch every 33 ms is about 30 rendered frames a second; a page whose script broke renders none.
        assert 15 <= row["frames_per_s"] <= 45, (name, row)
        assert row["chromium_cpu_ms_per_s"] > 0, (name, row)
        assert row["cpu_ms_per_frame"] == pytest.approx(row["chromium_cpu_ms_per_s"] / row["frames_per_s"], rel=0.01)
