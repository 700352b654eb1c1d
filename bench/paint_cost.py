"""What a painted frame costs headless Chromium on this machine, with RigDash's reply renderer and without it.

    .venv/bin/python -m bench.paint_cost [--seconds 8] [--rounds 2]

The streaming benchmark's Chromium (same binary and flags: bench/browser.py) opens a page with no server
behind it. A timer appends a word to a reply every ``interval`` ms, as token batches arrive, and each kind of
page shows it at most once per animation frame:

- ``text``: one ``textContent`` assignment per frame, the least a page can do to show new text;
- ``rigdash``: RigDash's own ``ReplyRenderer`` (static/rigdash/markdown.js, with the vendored marked and
  DOMPurify), the chat page's renderer;
- ``chat``: the chat page's layout and app.css around that renderer, with the turn's stats line and context
  gauge updated for every batch as chat.js does;
- ``chat+bench``: the same with the streaming benchmark's timing script (bench/browser.py), which the
  benchmark's Chromium runs: what the measuring itself costs.

For each it reports the CPU seconds of Chromium's whole process tree per wall second, the frames the page
rendered per second, and the CPU per rendered frame. A batch every 10 ms (RigDash's shortest flush
interval, a turn streaming alone) means a frame at every vsync, 60 a second; every 33 ms, about 30. The
pages run one after another in the same browser, each round in the order above; each figure is the median
over the rounds. Nothing leaves the machine: the pages are set with ``set_content``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import psutil

from bench.browser import CHROMIUM, INIT_SCRIPT, LAUNCH_ARGS
from rigdash.launcher import ROOT

SCRIPTS = [
    ROOT / "static/vendor/marked.min.js",
    ROOT / "static/vendor/purify.min.js",
    ROOT / "static/rigdash/markdown.js",
]
CSS = ROOT / "static/rigdash/app.css"

# Each page counts the frames in which it changed the reply (window.rdFrames).
TEXT_PAGE = """<!doctype html><html><body style="font:15px/1.5 system-ui;max-width:900px">
<div id="reply"></div><script>
window.rdFrames = 0; let text = "", n = 0, frame = 0; const el = document.getElementById("reply");
setInterval(() => {
  text += "word" + (n++) + " ";
  if (!frame) frame = requestAnimationFrame(() => { frame = 0; el.textContent = text; window.rdFrames++; });
}, __INTERVAL__);
</script></body></html>"""

# RigDash's renderer on #reply, counting its flushes; a paragraph every 40 words. ``__SETUP__`` and ``__BATCH__``:
# what else the page sets up, and does for each batch.
RENDERER_SCRIPT = """<script>__SCRIPTS__</script><script>
window.rdFrames = 0; let text = "", n = 0;
const renderer = new RigDashMarkdown.ReplyRenderer(document.getElementById("reply"));
const flush = renderer.flush.bind(renderer);
renderer.flush = () => { flush(); window.rdFrames++; };
__SETUP__
setInterval(() => {
  text += (n % 40 === 39 ? "word" + n + ".\\n\\n" : "word" + n + " "); n++;
  renderer.set(text);
  __BATCH__
}, __INTERVAL__);
</script>"""

RIGDASH_PAGE = """<!doctype html><html><body style="font:15px/1.5 system-ui;max-width:900px">
<div id="reply" class="reply markdown"></div>__RENDERER__</body></html>""".replace(
    "__RENDERER__", RENDERER_SCRIPT.replace("__SETUP__", "").replace("__BATCH__", "")
)


# The chat page's layout (templates/base.html, templates/inference/chat.html) with app.css, and what chat.js does
# for a token batch: the renderer gets the text, the turn's stats line and context gauge are updated.
CHAT_PAGE = """<!doctype html><html><head><style>__CSS__</style></head><body>
<header class="topbar"><a class="brand" href="#">RigDash</a><nav><a href="#">Rigs</a><span>owner</span>
<a href="#">Usage</a><button type="button" class="link">Log out</button></nav></header>
<main><div class="chat-layout"><aside class="sidebar"><a href="#">+ New chat</a><ul class="sessions">
<li class="current"><a href="#">Session 1</a></li><li><a href="#">Session 2</a></li></ul></aside>
<section class="chat"><header class="chat-head"><h1>Session 1</h1><span class="muted">model on rig</span>
<span class="conn" data-state="live">live</span></header><ol class="turns">
<li class="turn" data-status="decoding"><div class="user-msg">Write a story.</div>
<div class="reply markdown" id="reply"></div><div class="stats muted" id="stats"></div>
<meter class="ctx-gauge" id="gauge" min="0" max="1" high="0.9"></meter></li></ol>
<form class="composer"><textarea rows="3"></textarea><div class="actions"><button type="submit" disabled>Send</button>
<button type="button">Stop</button></div></form></section></div></main>
__RENDERER__</body></html>""".replace(
    "__RENDERER__",
    RENDERER_SCRIPT.replace(
        "__SETUP__", 'const stats = document.getElementById("stats"), gauge = document.getElementById("gauge");'
    ).replace(
        "__BATCH__",
        'stats.textContent = "decoding · TTFT 95 ms · " + n + " tokens · "'
        ' + (140 + (n % 7) / 10).toFixed(1) + " tok/s";\n'
        "  gauge.value = Math.min(1, (200 + n) / 8192);",
    ),
)


def build_pages() -> dict[str, str]:
    """The pages by kind (``text``, ``rigdash``, ``chat``), each with ``__INTERVAL__`` left for the batch interval."""
    scripts = "\n".join(path.read_text() for path in SCRIPTS).replace("</script", "<\\/script")
    return {
        "text": TEXT_PAGE,
        "rigdash": RIGDASH_PAGE.replace("__SCRIPTS__", scripts),
        "chat": CHAT_PAGE.replace("__CSS__", CSS.read_text()).replace("__SCRIPTS__", scripts),
    }


def tree_cpu(root: psutil.Process) -> dict[int, float]:
    """CPU seconds so far of each process in the browser's tree, by pid."""
    out = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = times.user + times.system
    return out


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings by the processes alive at the second (a closed page's renderer
    that exits in between would otherwise take its whole past off the sum)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def browser_root() -> psutil.Process:
    """The browser process Playwright started for us (a descendant of this process: another Chromium on the
    machine is not counted)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = proc.cmdline()
        except psutil.Error:
            continue
        if cmd and Path(cmd[0]).name in ("chromium", "chrome") and not any(a.startswith("--type=") for a in cmd):
            return proc
    raise RuntimeError("the Chromium browser process this run started was not found")


async def measure(seconds: float, rounds: int, intervals: list[int]) -> list[dict[str, object]]:
    from playwright.async_api import async_playwright

    pages = build_pages()
    pages["chat+bench"] = pages["chat"]  # with the streaming benchmark's timing script (bench/browser.py)
    samples: dict[tuple[str, int], list[tuple[float, float]]] = {}
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1200, "height": 800})
            root = browser_root()
            for _ in range(rounds):
                for interval in intervals:
                    for name, html in pages.items():
                        page = await context.new_page()  # a fresh page each time; the last one is closed
                        if name.endswith("+bench"):
                            await page.add_init_script(INIT_SCRIPT)
                        await page.set_content(html.replace("__INTERVAL__", str(interval)))
                        await asyncio.sleep(1.0)  # past the first layout
                        cpu0, frames0, t0 = tree_cpu(root), await page.evaluate("window.rdFrames"), time.monotonic()
                        await asyncio.sleep(seconds)
                        cpu1, frames1, t1 = tree_cpu(root), await page.evaluate("window.rdFrames"), time.monotonic()
                        await page.close()
                        wall = t1 - t0
                        samples.setdefault((name, interval), []).append(
                            (cpu_between(cpu0, cpu1) / wall, (frames1 - frames0) / wall)
                        )
        finally:
            await browser.close()
    out = []
    for (name, interval), runs in samples.items():
        cpu = statistics.median(r[0] for r in runs)
        fps = statistics.median(r[1] for r in runs)
        out.append({
            "page": name, "batch_every_ms": interval, "chromium_cpu_ms_per_s": round(1000 * cpu, 1),
            "frames_per_s": round(fps, 1), "cpu_ms_per_frame": round(1000 * cpu / fps, 2) if fps else None,
            "rounds": [{"cpu_ms_per_s": round(1000 * c, 1), "frames_per_s": round(f, 1)} for c, f in runs],
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per page")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--intervals", default="10,33", help="ms between batches, comma-separated")
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if not (1 <= args.seconds <= 60 and 1 <= args.rounds <= 10):
        parser.error("--seconds must be 1..60 and --rounds 1..10")
    intervals = [int(x) for x in args.intervals.split(",") if x.strip()]
    if not intervals or any(not 1 <= i <= 1000 for i in intervals):
        parser.error("--intervals: milliseconds between 1 and 1000")
    rows = asyncio.run(measure(args.seconds, args.rounds, intervals))
    print(f"headless Chromium ({CHROMIUM}), {psutil.cpu_count()} cores, median of {args.rounds} rounds")
    print("| page | batch every | frames/s | Chromium CPU ms/s | CPU ms per frame |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['page']} | {row['batch_every_ms']} ms | {row['frames_per_s']} | {row['chromium_cpu_ms_per_s']} "
              f"| {row['cpu_ms_per_frame']} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
