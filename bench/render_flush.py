"""What one flush of the chat's reply renderer costs as a reply with code grows, with syntax highlighting.

    .venv/bin/python -m bench.render_flush [--chars 30000] [--batch 40] [--plain]

Headless Chromium (bench/browser.py's binary and flags) gets a page with no server behind it: the vendored marked,
DOMPurify and highlight.js and static/rigdash/markdown.js, the page's CSS, and a ``ReplyRenderer``. A reply of
prose paragraphs and fenced Python blocks (about one block per 1,000 characters) is fed ``--batch`` characters
at a time, one flush per animation frame, as the chat page does while a reply streams. For each fifth of the
reply it reports the median and the 95th percentile of the flush's time (``performance.now`` around
``flush``: Markdown, sanitising, highlighting, DOM updates; not style or paint). A cost that stays flat from the
first fifth to the last is the renderer's promise (finished blocks are rendered once). ``--plain`` leaves
highlight.js out, for what the colouring adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

from bench.browser import CHROMIUM, LAUNCH_ARGS
from rigdash.launcher import ROOT

SCRIPTS = [
    ROOT / "static/vendor/marked.min.js",
    ROOT / "static/vendor/purify.min.js",
    ROOT / "static/vendor/highlight.min.js",
    ROOT / "static/rigdash/markdown.js",
]
CSS = ROOT / "static/rigdash/app.css"

PAGE = """<!doctype html><html><head><style>__CSS__</style></head><body>
<div id="reply" class="reply markdown"></div><script>__SCRIPTS__</script><script>
window.runBench = async (total, batch) => {
  const unit = "The lighthouse keeper wrote in the log every night, word by word. ".repeat(6) + "\\n\\n" +
    "```python\\ndef keep(light, hours):\\n    for hour in range(hours):\\n" +
    "        light.turn(hour)  # once a night\\n    return light\\n```\\n\\n";
  let source = ""; while (source.length < total) source += unit;
  source = source.slice(0, total);
  const renderer = new RigDashMarkdown.ReplyRenderer(document.getElementById("reply"));
  const flush = renderer.flush.bind(renderer);
  const times = [];
  renderer.flush = () => {
    const t0 = performance.now();
    flush();
    times.push([renderer.text.length, performance.now() - t0]);
  };
  for (let at = batch; at <= source.length + batch - 1; at += batch) {
    renderer.set(source.slice(0, Math.min(at, source.length)));
    await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0)));
  }
  return times;
};
</script></body></html>"""


def _page(*, plain: bool = False) -> str:
    chosen = [path for path in SCRIPTS if not (plain and path.name == "highlight.min.js")]
    scripts = "\n".join(path.read_text() for path in chosen).replace("</script", "<\\/script")
    return PAGE.replace("__CSS__", CSS.read_text()).replace("__SCRIPTS__", scripts)


def summarise(times: list[list[float]], total: int) -> list[dict[str, Any]]:
    """Per fifth of the reply: flushes, median and p95 of the flush time in ms."""
    rows = []
    for fifth in range(5):
        low, high = total * fifth / 5, total * (fifth + 1) / 5
        spans = sorted(ms for length, ms in times if low < length <= high)
        if spans:
            p95 = spans[min(len(spans) - 1, int(0.95 * len(spans)))]
            rows.append({"chars": f"{int(low)}-{int(high)}", "flushes": len(spans),
                         "median_ms": round(statistics.median(spans), 2), "p95_ms": round(p95, 2)})  # fmt: skip
    return rows


async def measure(*, chars: int, batch: int, plain: bool = False) -> list[dict[str, Any]]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page()
            await page.set_content(_page(plain=plain))
            times = await page.evaluate("([total, batch]) => window.runBench(total, batch)", [chars, batch])
        finally:
            await browser.close()
    return summarise(times, chars)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=40)
    parser.add_argument("--plain", action="store_true", help="without highlight.js")
    args = parser.parse_args()
    for row in asyncio.run(measure(chars=args.chars, batch=args.batch, plain=args.plain)):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
