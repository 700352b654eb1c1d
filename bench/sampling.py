"""Does watching a rig slow it down? llama-server's own decode tokens/s with RigDash's sampler at 1 Hz and
dashboards open, against the same with RigDash's monitoring stopped (issue 3's target: >= 0.98).

Run: ``./scripts/bench-sampling`` (or ``python -m bench.sampling --rounds 6``). It starts its own stack on free
ports (bench.stack), points a rig straight at llama-server, and alternates blocks of generations with the
sampler and N dashboard sockets running ("on") and without them ("off"), in ABBA order so drift on this
shared machine hits both. The figure is llama-server's ``timings.predicted_per_second`` for each reply,
not a client-side rate. The dashboards are websocket clients on /ws/monitoring/ (what a browser on
another machine costs the rig); a Chromium on the rig itself would cost more (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.stack import BenchStack
from bench.wsproto import WSClient
from rigdash.launcher import PYTHON, ROOT, Stack

PROMPT = "Write a long, detailed story about a lighthouse keeper during a winter storm."


def generate(port: int, *, max_tokens: int, seed: int) -> float:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0,
            "seed": seed, "stream": False}  # fmt: skip
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=180).json()
    return float(reply["timings"]["predicted_per_second"])


async def _watch(client: WSClient, counts: list[int], index: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            _, frame = await client.recv_json(timeout_s=0.5)
        except TimeoutError:
            continue
        if frame.get("type") == "rig.sample":
            counts[index] += 1


CPU = {"sampler_s": 0.0, "web_s": 0.0, "wall_s": 0.0}


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def block_on(stack: BenchStack, cookie: str, rig_id: int, viewers: int, run: Any) -> tuple[list[float], int]:
    """Sampler process and ``viewers`` dashboard sockets running while ``run`` generates."""
    sampler = Stack()
    proc = sampler.start("sampler", [PYTHON, "manage.py", "rigdash_sampler"], env=stack.env,
                         log_path=stack.log_dir / "sampler.log")  # fmt: skip
    web = psutil.Process(stack.pids["web"])
    paths = [f"/ws/monitoring/rigs/{rig_id}/"] * (viewers - 1) + ["/ws/monitoring/"]
    clients = [await WSClient.connect(stack.web_port, path, cookie=cookie) for path in paths]
    counts = [0] * len(clients)
    stop = asyncio.Event()
    readers = [asyncio.create_task(_watch(c, counts, i, stop)) for i, c in enumerate(clients)]
    await asyncio.sleep(3)  # the sampler is up and samples flow before the timed replies
    cpu_before = [_cpu(psutil.Process(proc.pid)), _cpu(web)]
    t0 = time.monotonic()
    rates = await asyncio.to_thread(run)
    elapsed = time.monotonic() - t0
    cpu_after = [_cpu(psutil.Process(proc.pid)), _cpu(web)]
    CPU["sampler_s"] += cpu_after[0] - cpu_before[0]
    CPU["web_s"] += cpu_after[1] - cpu_before[1]
    CPU["wall_s"] += elapsed
    stop.set()
    await asyncio.gather(*readers)
    for client in clients:
        await client.close()
    sampler.stop()
    return rates, sum(counts)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    var = ROOT / "var" / "bench" / f"sampling-{int(time.time())}"
    stack = BenchStack(var_dir=var, worker_concurrency=2)
    stack.start()
    try:
        stack.django_setup()
        prepared = stack.prepare()
        from inference.models import Rig
        from monitoring.models import RigProfile

        Rig.objects.update(enabled=False)  # only the rig under test is sampled
        rig = Rig.objects.create(name="bench-direct", kind="llamacpp", queue="rig.bench-direct",
                                 base_url=f"http://127.0.0.1:{stack.ports['llama']}")  # fmt: skip
        RigProfile.objects.create(rig=rig, bandwidth_gbs=25.0, bandwidth_source="setting")  # no probe mid-run
        llama_port = stack.ports["llama"]
        generate(llama_port, max_tokens=16, seed=0)  # warm-up

        def run() -> list[float]:
            return [generate(llama_port, max_tokens=args.tokens, seed=i) for i in range(args.replies)]

        results: dict[str, list[float]] = {"off": [], "on": []}
        frames = 0
        for round_index in range(args.rounds):
            order = ("off", "on") if round_index % 2 == 0 else ("on", "off")
            for mode in order:
                if mode == "off":
                    results["off"] += run()
                else:
                    rates, seen = await block_on(stack, prepared["cookie"], rig.pk, args.viewers, run)
                    results["on"] += rates
                    frames += seen
            print(f"round {round_index + 1}/{args.rounds}: off {statistics.median(results['off']):.1f} "
                  f"on {statistics.median(results['on']):.1f} tokens/s", flush=True)  # fmt: skip
        off, on = statistics.median(results["off"]), statistics.median(results["on"])
        return {
            "figure": "llama-server's own decode tokens/s (timings.predicted_per_second), median over replies",
            "off_median_tps": round(off, 2),
            "on_median_tps": round(on, 2),
            "ratio_on_over_off": round(on / off, 4),
            "off_mean_tps": round(statistics.mean(results["off"]), 2),
            "on_mean_tps": round(statistics.mean(results["on"]), 2),
            "replies_per_mode": len(results["off"]),
            "tokens_per_reply": args.tokens,
            "dashboard_sockets": args.viewers,
            "sample_frames_received": frames,
            "sampler_cpu_pct_of_a_core": round(100 * CPU["sampler_s"] / CPU["wall_s"], 2),
            "web_cpu_pct_of_a_core": round(100 * CPU["web_s"] / CPU["wall_s"], 2),
            "rates": results,
        }
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--replies", type=int, default=3, help="replies per block")
    parser.add_argument("--tokens", type=int, default=400, help="tokens per reply")
    parser.add_argument("--viewers", type=int, default=5, help="dashboard sockets open while sampling")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    out = Path(ROOT / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"sampling-{int(time.time())}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nbackend tokens/s with sampling+dashboards / without: {result['ratio_on_over_off']:.3f} "
          f"(on {result['on_median_tps']}, off {result['off_median_tps']}; {result['sample_frames_received']} "
          f"sample frames received by {args.viewers} sockets)\n"
          f"while sampling: sampler {result['sampler_cpu_pct_of_a_core']} % of a core, "
          f"web server {result['web_cpu_pct_of_a_core']} %\nwritten to {path}")  # fmt: skip


if __name__ == "__main__":
    main()
