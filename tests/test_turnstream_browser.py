"""The turn-stream client the chat and compare pages share (static/rigdash/turnstream.js), run in Debian's Chromium:
a batch that follows is appended, one already held is dropped, a gap asks for the turn's snapshot once and drops
what comes until it, and a turn the page does not know asks for its snapshot."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.browser]

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
SCRIPT = Path(__file__).resolve().parent.parent / "static" / "rigdash" / "turnstream.js"

CASES = """
() => {
  const asked = [];
  const turns = new Map([[7, { id: 7, text: "", seq: 0, stats: {}, resyncing: false }]]);
  const resync = (id) => asked.push(id);
  const batch = (turn, from, to, text) => ({ turn, seq_from: from, seq_to: to, text, stats: { tokens: to } });
  const steps = [
    RigDashTurnStream.accept(turns, batch(7, 1, 2, "Hel"), resync) !== null,   // follows: appended
    RigDashTurnStream.accept(turns, batch(7, 1, 2, "Hel"), resync) !== null,   // held already: dropped
    RigDashTurnStream.accept(turns, batch(7, 5, 6, "XX"), resync) !== null,    // a gap: resync asked
    RigDashTurnStream.accept(turns, batch(7, 3, 4, "lo"), resync) !== null,    // while resyncing: dropped
    RigDashTurnStream.accept(turns, batch(9, 1, 1, "?"), resync) !== null,     // unknown turn: resync asked
  ];
  const t = turns.get(7);
  return { steps, asked, text: t.text, seq: t.seq, stats: t.stats, resyncing: t.resyncing };
}
"""


@pytest.fixture(scope="module")
def page() -> Any:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: scripts/test installs Debian's chromium package")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.set_content("<!doctype html><title>turnstream</title>")
        page.add_script_tag(content=SCRIPT.read_text())
        yield page
        browser.close()


def test_batches_join_by_seq_and_a_gap_or_an_unknown_turn_asks_for_a_snapshot(page):
    result = page.evaluate(CASES)
    assert result["steps"] == [True, False, False, False, False]
    assert result["asked"] == [7, 9]  # the gap asked once; the batch during the resync asked nothing more
    assert (result["text"], result["seq"], result["stats"]) == ("Hel", 2, {"tokens": 2})
    assert result["resyncing"] is True
