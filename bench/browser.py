"""A real headless Chromium tab on RigDash's chat page, timing when each reply's text is painted.

Debian's ``/usr/bin/chromium`` through Playwright, launched as in tests/test_browser.py. An init script
(before the page's own scripts) wraps ``ReplyRenderer.prototype.flush`` (static/rigdash/markdown.js) to
note the reply length each flush renders; a MutationObserver on the document stamps the DOM change, then
a MessageChannel task stamps the end of that frame's rendering work (style, layout, paint: "painted"),
and a requestAnimationFrame callback the start of the next frame (an upper bound). Times are
``performance.timeOrigin + performance.now()``, the same clock as Python's ``time.time()`` on this machine
(checked by ``clock_check``). A PerformanceObserver records long tasks (over 50 ms).
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from rigdash.cpus import cpu_list

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

INIT_SCRIPT = r"""
(() => {
  const now = () => performance.timeOrigin + performance.now();
  const B = (window.__bench = { flushes: [], longtasks: [], pending: [], last: {} });
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries())
        B.longtasks.push({ start: performance.timeOrigin + e.startTime, duration: e.duration, name: e.name });
    }).observe({ type: "longtask", buffered: true });
  } catch (e) { B.longtaskError = String(e); }
  const patch = (md) => {
    if (!md || !md.ReplyRenderer || md.ReplyRenderer.prototype.__benched) return;
    const proto = md.ReplyRenderer.prototype;
    const orig = proto.flush;
    proto.__benched = true;
    proto.flush = function () {
      const start = now();
      const len = this.text.length;
      orig.call(this);
      const el = this.container.closest(".turn");
      const rec = { turn: Number(el ? el.dataset.turn : 0), len, start, rendered: now(),
                    mutated: null, painted: null, frame: null };
      B.flushes.push(rec);
      B.pending.push(rec);
      B.last[rec.turn] = this.text;
    };
  };
  let md;
  Object.defineProperty(window, "RigDashMarkdown", {
    configurable: true, enumerable: true,
    get() { return md; },
    set(v) { md = v; patch(v); },
  });
  const observer = new MutationObserver(() => {
    if (!B.pending.length) return;
    const batch = B.pending.splice(0);
    const t = now();
    for (const r of batch) r.mutated = t;
    const ch = new MessageChannel();
    ch.port1.onmessage = () => { const p = now(); for (const r of batch) r.painted = p; ch.port1.close(); };
    ch.port2.postMessage(0);
    requestAnimationFrame(() => { const f = now(); for (const r of batch) r.frame = f; });
  });
  const opts = { subtree: true, childList: true, characterData: true };
  const start = () => observer.observe(document.documentElement, opts);
  if (document.documentElement) start(); else document.addEventListener("DOMContentLoaded", start);
})();
"""


def launcher_on_cpus(cpus: frozenset[int], folder: Path) -> str:
    """A script that starts Chromium on ``cpus`` (``taskset``), for Playwright's ``executable_path``: Chromium and
    every process it starts then run there, whatever this process's own CPUs (a user's browser, which RigDash's
    launcher does not pin, unlike the benchmark's processes, which ``keep_off_decode_cpus`` keeps off the decode's)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "chromium-on-cpus"
    script.write_text(f'#!/bin/sh\nexec taskset --cpu-list {cpu_list(cpus)} {shlex.quote(CHROMIUM)} "$@"\n')
    script.chmod(0o755)
    return str(script)


class BrowserTab:
    def __init__(
        self, web_port: int, cookie_value: str, cookie_name: str = "sessionid", *, executable: str | None = None
    ) -> None:
        """``executable``: what Playwright starts instead of Chromium itself (``launcher_on_cpus``)."""
        self.executable = executable or CHROMIUM
        self.base = f"http://127.0.0.1:{web_port}"
        self.cookie = {"name": cookie_name, "value": cookie_value, "url": self.base}
        self._pw: Any = None
        self.browser: Any = None
        self.page: Any = None
        self.errors: list[str] = []

    async def start(self) -> None:
        from playwright.async_api import async_playwright

        if not os.path.exists(CHROMIUM):
            raise SystemExit(f"Chromium not found at {CHROMIUM} (Debian: apt-get install chromium)")
        self._pw = await async_playwright().start()
        self.browser = await self._pw.chromium.launch(executable_path=self.executable, args=LAUNCH_ARGS)
        context = await self.browser.new_context(viewport={"width": 1200, "height": 800})
        await context.add_cookies([self.cookie])
        await context.add_init_script(INIT_SCRIPT)
        self.page = await context.new_page()
        self.page.set_default_timeout(60_000)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))

    async def open_session(self, session_id: int) -> None:
        await self.page.goto(f"{self.base}/sessions/{session_id}/")
        await self.page.wait_for_selector("[data-testid=connection][data-state=live]")

    async def wait_turn_done(self, turn_id: int, timeout_s: float = 60) -> None:
        selector = f".turn[data-turn='{turn_id}']:not([data-status=queued]):not([data-status=prompt])"
        selector += ":not([data-status=decoding])"
        await self.page.wait_for_selector(selector, timeout=timeout_s * 1000)
        await self.page.wait_for_timeout(150)  # the last flush's frame and its MessageChannel task

    async def collect(self, turn_id: int) -> dict[str, Any]:
        """The flushes of one turn (times in seconds), the text the renderer holds, long tasks so far."""
        data: dict[str, Any] = await self.page.evaluate(
            """(turn) => ({
                flushes: window.__bench.flushes.filter((f) => f.turn === turn),
                text: window.__bench.last[turn] || "",
                longtasks: window.__bench.longtasks,
                longtaskError: window.__bench.longtaskError || null,
            })""",
            turn_id,
        )
        for flush in data["flushes"]:
            for key in ("start", "rendered", "mutated", "painted", "frame"):
                if flush[key] is not None:
                    flush[key] /= 1000
        for task in data["longtasks"]:
            task["start"] /= 1000
        return data

    async def clock_check(self, samples: int = 15) -> dict[str, float]:
        """Page clock minus time.time(), from the round trip with the smallest RTT."""
        best: tuple[float, float] | None = None
        for _ in range(samples):
            t0 = time.time()
            page_ms = await self.page.evaluate("performance.timeOrigin + performance.now()")
            t1 = time.time()
            sample = (t1 - t0, page_ms / 1000 - (t0 + t1) / 2)
            if best is None or sample[0] < best[0]:
                best = sample
        assert best is not None
        return {"rtt_ms": round(best[0] * 1000, 3), "offset_ms": round(best[1] * 1000, 3)}

    async def close(self) -> None:
        if self.browser:
            await self.browser.close()
        if self._pw:
            await self._pw.stop()
