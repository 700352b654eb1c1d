"""What a browser painting a reply on the rig costs llama-server with no RigDash at all.

    ./scripts/bench --browser-floor [--quick]

Level 1's target for the backend's own rate (>= 0.98 of its rate with nothing attached) has missed on every AMD EPYC
with Chromium on the rig, and met without it (docs/benchmarks.md). This measures the floor under that figure: the
same prompt is read straight from llama-server (``bench/httpstream.py``, as the benchmark's direct reader) while the
benchmark's headless Chromium (``bench/browser.py``'s binary and flags) shows, in turn:

- ``blank``: ``about:blank``; the browser is open and draws nothing (the reference);
- ``text@10``: a page that appends a word every 10 ms and shows it once a frame with one ``textContent``
  assignment, the least a page can do to show a stream (``bench/paint_cost.py``);
- ``chat@10``: the chat page's layout, CSS and reply renderer fed a batch every 10 ms, RigDash's interval for one
  streaming turn: a frame at every vsync (``bench/paint_cost.py``'s ``chat`` page, without RigDash behind it);
- ``chat@33``: the same fed every 33 ms, RigDash's ceiling: about 30 frames a second.

The same for level 2's four streams: four prompts read at once (llama-server's four slots decode together, on
both cores), while the page is blank or gets a batch every 25 ms (RigDash's pace for four streaming turns) or 33 ms.

llama-server runs as in the benchmark (``bench/stack.py``: 4 slots, ``--no-cache-prompt``), and nothing of RigDash
runs. In every round each condition reads once, in an order rotated from round to round, so the machine's drift falls
on all of them alike. Reported per condition: llama-server's own decode rate (``timings.predicted_per_second``), its
rate over ``blank``'s in the same round (median over rounds), its prompt time, Chromium's CPU and frames a second,
and how long llama-server's threads waited, runnable, for a core (``/proc/<pid>/task/*/schedstat``) while the reply
was read. A condition's ratio is what that page alone costs the backend: RigDash's pipeline cannot bring the level's
figure above it. Traffic stays on 127.0.0.1; the run is bounded by its rounds, and each read by a timeout.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import paint_cost, procstat
from bench.browser import CHROMIUM, LAUNCH_ARGS
from bench.httpstream import chat_payload, direct_chat
from bench.run import PROMPTS, SEED  # the level-1 and level-2 prompts
from bench.stack import bench_llama_command
from rigdash.launcher import ROOT, Stack, free_port, wait_http

Shown = tuple[str, int] | None  # (bench/paint_cost.py's page, batch interval ms); None: about:blank
# Level 1: one stream. Level 2: four streams, as four RigDash turns decode at once; the chat page then gets a batch
# every 25 ms (runner.FlushPace: four streaming turns), and at most every 33 ms.
PARTS: dict[int, dict[str, Shown]] = {
    1: {"blank": None, "text@10": ("text", 10), "chat@10": ("chat", 10), "chat@33": ("chat", 33)},
    4: {"blank": None, "chat@25": ("chat", 25), "chat@33": ("chat", 33)},
}
READ_TIMEOUT_S = 120.0
SETTLE_S = 1.0  # after a page is shown, before the read: past its first layout


def rotated(names: list[str], round_no: int) -> list[str]:
    """The conditions' order in one round: each round starts one further along."""
    k = round_no % len(names)
    return names[k:] + names[:k]


def summarize(rounds: list[dict[str, dict[str, Any]]], reference: str = "blank") -> list[dict[str, Any]]:
    """Per condition: medians over the rounds of the backend's rate, its ratio to ``reference`` in the same round,
    the prompt time, and Chromium's CPU and frames a second. Rounds where a read failed are left out of the ratio."""
    names = list(rounds[0]) if rounds else []
    out = []
    for name in names:
        reads = [r[name] for r in rounds if name in r]
        ok = [x for x in reads if x.get("backend_tps")]
        ratios = [
            r[name]["backend_tps"] / r[reference]["backend_tps"]
            for r in rounds
            if r.get(name, {}).get("backend_tps") and r.get(reference, {}).get("backend_tps")
        ]

        def med(key: str, xs: list[dict[str, Any]] = ok) -> float | None:
            values = [x[key] for x in xs if x.get(key) is not None]
            return round(statistics.median(values), 3) if values else None

        out.append(
            {
                "condition": name,
                "reads": len(reads),
                "failed": len(reads) - len(ok),
                "backend_tps": med("backend_tps"),
                "ratio_to_blank": round(statistics.median(ratios), 4) if ratios else None,
                "ratio_min_max": [round(min(ratios), 4), round(max(ratios), 4)] if ratios else None,
                "prompt_ms": med("prompt_ms"),
                "chromium_cpu_ms_per_s": med("chromium_cpu_ms_per_s"),
                "frames_per_s": med("frames_per_s"),
                "llama_wait_ms_per_s": med("llama_wait_ms_per_s"),
                "steal_pct": med("steal_pct"),
            }
        )
    return out


async def _read_under(
    page: Any, root: psutil.Process, llama_pid: int, port: int, payloads: list[dict[str, Any]]
) -> dict[str, Any]:
    """The payloads read at once while ``page`` shows what it shows; Chromium's CPU and the page's frames meanwhile,
    and how long llama-server's threads waited for a core. Rates and times are medians over the streams."""
    cpu0, counters0 = paint_cost.tree_cpu(root), procstat.Counters.read(llama_pid)
    frames0 = await page.evaluate("window.rdFrames || 0")
    records = await asyncio.gather(*(direct_chat(port, p, timeout_s=READ_TIMEOUT_S) for p in payloads))
    cpu1, window = paint_cost.tree_cpu(root), procstat.Counters.read(llama_pid).since(counters0)
    frames1 = await page.evaluate("window.rdFrames || 0")
    wall = window["wall_s"]
    errors = [r.error for r in records if r.error]

    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known and not errors else None

    return {
        "backend_tps": med([r.backend_tps for r in records]),
        "decode_tps": med([r.decode_tps for r in records]),
        "ttft_ms": med([r.ttft_ms for r in records]),
        "prompt_ms": med([(r.timings or {}).get("prompt_ms") for r in records]),
        "tokens": sum(len(r.times) for r in records),
        "error": "; ".join(e for e in errors if e) or None,
        "chromium_cpu_ms_per_s": round(1000 * paint_cost.cpu_between(cpu0, cpu1) / wall, 1),
        "frames_per_s": round((frames1 - frames0) / wall, 1),
        "llama_wait_ms_per_s": round(window["llama_wait_ms_per_s"] or 0.0, 1),
        "steal_pct": round(100 * (window["steal_share"] or 0.0), 2),
    }


async def measure(
    port: int, llama_pid: int, model: str, *, streams: int, rounds: int, tokens: int, log: Any = print
) -> list[dict[str, Any]]:
    """``rounds`` rounds of ``streams`` streams read at once under each of that part's conditions."""
    from playwright.async_api import async_playwright

    conditions = PARTS[streams]
    pages = paint_cost.build_pages()
    payloads = [
        chat_payload(model=model, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=tokens, seed=SEED)
        for i in range(streams)
    ]
    await asyncio.gather(*(direct_chat(port, p, timeout_s=READ_TIMEOUT_S) for p in payloads))  # warm-up, not counted
    results: list[dict[str, Any]] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1200, "height": 800})
            root = paint_cost.browser_root()
            page = await context.new_page()
            for r in range(rounds):
                got: dict[str, dict[str, Any]] = {}
                for name in rotated(list(conditions), r):
                    shown = conditions[name]
                    if shown is None:
                        await page.goto("about:blank")
                    else:
                        kind, interval = shown
                        await page.set_content(pages[kind].replace("__INTERVAL__", str(interval)))
                    await asyncio.sleep(SETTLE_S)
                    got[name] = await _read_under(page, root, llama_pid, port, payloads)
                    await page.goto("about:blank")  # the page's timers stop between reads
                results.append({name: got[name] for name in conditions})
                log(
                    f"{streams} stream(s), round {r + 1}/{rounds}: "
                    + ", ".join(f"{n} {stats_text(got[n])}" for n in conditions)
                )
        finally:
            await browser.close()
    return results


def stats_text(read: dict[str, Any]) -> str:
    if read.get("error"):
        return f"failed ({read['error']})"
    waited = read["llama_wait_ms_per_s"]
    return f"{read['backend_tps']:.1f} tok/s ({read['frames_per_s']:.0f} fps, llama-server waited {waited:.0f} ms/s)"


def run(*, rounds: int, tokens: int, out: Path | None = None) -> dict[int, list[dict[str, Any]]]:
    """Start llama-server as the benchmark does, measure each part, stop it; print the tables and write the JSON."""
    stack = Stack()
    port = free_port()
    log_dir = ROOT / "var" / "bench" / f"{time.strftime('%Y%m%d-%H%M%S')}-browser-floor"
    log_dir.mkdir(parents=True, exist_ok=True)
    data: dict[int, list[dict[str, Any]]] = {}
    try:
        llama = stack.start(
            "llama-server",
            bench_llama_command(port),
            log_path=log_dir / "llama-server.log",
        )
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=180, proc=llama)
        model = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10, trust_env=False).json()["data"][0]["id"]
        for streams in PARTS:
            data[streams] = asyncio.run(measure(port, llama.pid, model, streams=streams, rounds=rounds, tokens=tokens))
    finally:
        stack.stop()
    summaries = {streams: summarize(rounds_data) for streams, rounds_data in data.items()}
    print(f"llama-server alone (4 slots), read directly ({tokens} tokens a stream, {rounds} rounds), while headless "
          f"Chromium shows each page; {psutil.cpu_count()} cores; medians: streams, then rounds")  # fmt: skip
    print("| streams | page | backend tok/s | / blank, same round (median; min..max) | prompt ms | Chromium CPU ms/s "
          "| frames/s | llama-server's threads waiting for a core, ms/s | steal % |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for streams, rows in summaries.items():
        for row in rows:
            span = row["ratio_min_max"] or [None, None]
            cells = [streams, row["condition"], row["backend_tps"], f"{row['ratio_to_blank']} ({span[0]}..{span[1]})",
                     row["prompt_ms"], row["chromium_cpu_ms_per_s"], row["frames_per_s"], row["llama_wait_ms_per_s"],
                     row["steal_pct"]]  # fmt: skip
            print("| " + " | ".join(str(c) for c in cells) + " |")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        parts = [{"streams": n, "summary": summaries[n], "rounds": data[n]} for n in data]
        out.write_text(json.dumps({"tokens": tokens, "parts": parts}, indent=2))
        print(f"results: {out}")
    return data
