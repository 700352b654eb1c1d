"""bench/render_flush.py: it renders a reply with code in the real headless Chromium and reports each fifth."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench import render_flush
from bench.browser import CHROMIUM

pytestmark = pytest.mark.browser


def test_the_renderer_benchmark_reports_every_fifth_of_the_reply():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: scripts/test installs Debian's chromium package")
    rows = asyncio.run(render_flush.measure(chars=3000, batch=100))
    assert [row["chars"] for row in rows] == ["0-600", "600-1200", "1200-1800", "1800-2400", "2400-3000"]
    for row in rows:
        assert row["flushes"] == 6 and 0 < row["median_ms"] <= row["p95_ms"], row


def test_summarise_puts_each_flush_in_its_fifth():
    rows = render_flush.summarise([[100, 1.0], [150, 3.0], [900, 2.0]], 1000)
    assert rows[0] == {"chars": "0-200", "flushes": 2, "median_ms": 2.0, "p95_ms": 3.0}
    assert rows[1]["chars"] == "800-1000" and rows[1]["flushes"] == 1
