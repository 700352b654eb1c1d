"""Measure RigDash's streaming against reading the backend directly, in one run; print a table, write JSON.

    ./scripts/bench            # full run, bounded to about 15 minutes
    ./scripts/bench --quick    # smoke run, about 2 minutes on a quiet machine

Parts: (1) one session on llama-server, direct and RigDash turns interleaved A/B with the same prompt,
seed and temperature 0, a websocket tab and a real Chromium tab on each RigDash turn; a 2,000-token
reply from a synthetic source at llama-server's nominal 140 tokens/s (display lag growth); (2) 4
llama-server slots, 4 sessions each watched by 2 tabs, 50 viewers on a session with no turns (stand-in
for dashboard viewers) and 200 idle sockets; (3) a synthetic llama-server-format source at 16 x 100
tokens/s with 200 viewers; and a render run that grows one reply to 30,000 characters in the browser.
Definitions: docs/benchmarks.md. Everything runs on 127.0.0.1, on free ports, with its own database and
Redis; every loop is bounded in count and time, and work that would not fit the time budget is skipped
(and said so in the results).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import analyze, procstat, profile, report, stats
from bench.httpstream import StreamRecord, chat_payload, direct_chat
from bench.rigclient import Tab, TurnWatch, run_turn
from bench.stack import PYTHON, BenchStack
from bench.synthetic import synthetic_token
from rigdash.cpus import cpu_list
from rigdash.launcher import ROOT, cpu_split, keep_off_decode_cpus

RESULTS_DIR = ROOT / "bench" / "results"
SEED = 42
PROMPTS = [
    "Explain in detail how a lighthouse works, step by step.",
    "Write a long story about a cat who learns to sail.",
    "List 500 different fruits, numbered.",
    "Describe the water cycle for a school report, with many details.",
    "Write a detailed guide to baking bread at home.",
    "Tell me about the history of the bicycle in many paragraphs.",
    "Write a long poem about mountains and rivers.",
    "Explain how computers store numbers, with examples.",
]
LONG_PROMPT = "Write a very long story about a lighthouse keeper, in many chapters."
RENDER_CHARS = 30_000


@dataclass(frozen=True)
class Plan:
    name: str
    l1_pairs: int  # llama-server prompts, each read directly and through RigDash
    l1_tokens: int
    llama_long: int  # 2,000-token llama-server replies, each paired with a direct read
    long_tokens: int
    lag_rate: int  # the synthetic 2,000-token reply's rate (llama-server's nominal rate here)
    l2_rounds: int  # each: a direct round and a RigDash round of 4 concurrent streams
    l2_tokens: int
    l2_viewers: int
    l2_idle: int
    l3_rounds: int
    l3_streams: int
    l3_rate: int
    l3_tokens: int
    l3_viewers: int
    idle_s: float
    budget_s: float  # no new work starts that would end after this (from the start of the run)


QUICK = Plan("quick", 3, 128, 0, 2000, 140, 1, 96, 50, 200, 1, 16, 100, 300, 200, 5, 150)
FULL = Plan("full", 12, 400, 1, 2000, 140, 4, 300, 50, 200, 4, 16, 100, 500, 200, 10, 14 * 60)


class Budget:
    def __init__(self, limit_s: float) -> None:
        self.start = time.monotonic()
        self.limit_s = limit_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def ok(self, need_s: float) -> bool:
        return self.elapsed() + need_s <= self.limit_s


T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[bench +{time.monotonic() - T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 - a content fingerprint


class Swarm:
    """The viewer/idle-socket subprocess (bench/swarm.py)."""

    def __init__(self, port: int, cookie: str, groups: list[dict[str, Any]]) -> None:
        self.config = {"port": port, "cookie": cookie, "groups": groups, "deadline_s": 1500, "concurrency": 16}
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout_s: float = 180) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            PYTHON, "-m", "bench.swarm", json.dumps(self.config), cwd=ROOT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line.startswith(b"READY"):
            raise RuntimeError(f"swarm did not start: {line!r}")
        return line.decode().strip()

    async def stop(self, timeout_s: float = 60) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(b"stop\n")
            await self.proc.stdin.drain()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                line = await asyncio.wait_for(self.proc.stdout.readline(), max(0.1, deadline - time.monotonic()))
                if not line:
                    break
                if line.startswith(b"RESULT "):
                    return dict(json.loads(line[7:]))
            return {"error": "no result from the swarm"}
        finally:
            with contextlib.suppress(ProcessLookupError):
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class Bench:
    def __init__(self, args: argparse.Namespace, plan: Plan) -> None:
        self.args = args
        self.plan = plan
        self.budget = Budget(plan.budget_s)
        self.stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        self.var_dir = ROOT / "var" / "bench" / self.stamp
        self.stack = BenchStack(
            var_dir=self.var_dir,
            flush_ms=args.flush_ms,
            flush_min_ms=args.flush_min_ms,
            database_url=args.database_url,
            redis_url=args.redis_url,
        )
        self.levels = {f"l{x}" if x.isdigit() else x for x in args.levels.split(",")}
        self.browser: Any = None
        self.chromium_cpus: str | None = None  # the CPUs Chromium may run on, read once it started
        self.cookie = ""
        self.model = ""
        self.skipped: list[str] = []
        self.llama_tps = 100.0  # measured in the warm-up
        self.llama_ttft_s = 0.5

    # --- plumbing ---------------------------------------------------------------------------------------

    def est_llama_s(self, tokens: int, streams: int = 1) -> float:
        """Expected seconds for one llama-server reply (from the warm-up's rate; parallel slots share it)."""
        per_stream = self.llama_tps / max(1.0, streams / 2)
        return self.llama_ttft_s * streams + tokens / per_stream

    def timeout_s(self, expected_s: float) -> float:
        return min(900.0, max(180.0, 3 * expected_s + 60))  # this machine's speed can drop tenfold mid-run

    def fits(self, what: str, need_s: float, later: list[str], *, first: bool = False) -> bool:
        """Does this fit the time budget, keeping time for the first item of each later part?

        The first item of every part always runs (a smoke run covers everything); repetitions need budget.
        """
        reserve = sum({"lag": 20, "l2": 20, "l3": 20, "render": 20}[x] for x in later if x in self.levels)
        if first or self.budget.ok(need_s + reserve):
            return True
        self.skipped.append(f"{what} (needs about {need_s:.0f} s; {self.budget.elapsed():.0f} s of the budget gone)")
        log(f"skipping {what}: it would not fit the time budget")
        return False

    async def fetch_ref(self, kind: str) -> list[dict[str, Any]]:
        port = self.stack.ports["tap" if kind == "tap" else "synthetic"]
        path = "/_tap/streams" if kind == "tap" else "/_synthetic/streams"
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            return list((await client.get(f"http://127.0.0.1:{port}{path}")).json())

    def costs(self) -> tuple[dict[str, float], dict[str, int], procstat.Counters]:
        return self.stack.cpu(), self.stack.redis_calls(), procstat.Counters.read(self.stack.pids.get("llama"))

    @staticmethod
    def cost_delta(
        before: tuple[dict[str, float], dict[str, int], procstat.Counters], after: tuple[Any, Any, procstat.Counters]
    ) -> dict[str, Any]:
        """CPU per process and Redis calls over the window, with its length, steal and llama-server's wait for a core
        (``procstat.Counters.since``)."""
        cpu = {k: after[0].get(k, 0.0) - v for k, v in before[0].items()}
        return {"cpu_s": cpu, "redis": stats.calls_delta(before[1], after[1]), **after[2].since(before[2])}

    async def direct_round(self, port: int, payloads: list[dict[str, Any]], timeout_s: float) -> list[StreamRecord]:
        """The payloads read straight from the backend, at once; each record notes the CPU the hypervisor took
        from this machine meanwhile (steal), the figure that tells a slow VM from a slow pipeline, and how long
        llama-server's threads waited for a core."""
        pid = self.stack.pids.get("llama")
        before = procstat.Counters.read(pid)
        records = list(await asyncio.gather(*(direct_chat(port, p, timeout_s=timeout_s) for p in payloads)))
        window = procstat.Counters.read(pid).since(before)
        for record in records:
            record.steal_share, record.llama_wait_ms_per_s = window["steal_share"], window["llama_wait_ms_per_s"]
        return records

    async def open_tabs(self, sessions: list[int], per_session: int) -> list[list[Tab]]:
        return [[await Tab.open(self.stack.web_port, sid, self.cookie) for _ in range(per_session)] for sid in sessions]

    @staticmethod
    async def close_tabs(tabs: list[list[Tab]]) -> None:
        await asyncio.gather(*(tab.close() for group in tabs for tab in group), return_exceptions=True)

    async def rigdash_round(
        self,
        *,
        tabs: list[list[Tab]],
        prompts: list[str],
        params: dict[str, Any],
        ref: str,
        timeout_s: float,
        browser_session: int | None = None,
        keep_render: bool = False,
    ) -> dict[str, Any]:
        """One turn per session, all at once; the first tab of each session sends, the others watch."""
        if browser_session is not None and self.browser:
            await self.browser.open_session(browser_session)
        await self.fetch_ref(ref)  # forget anything recorded before this round
        before = self.costs()
        watches = await asyncio.gather(
            *(
                run_turn(group[0], group[1:], prompt, params, timeout_s=timeout_s)
                for group, prompt in zip(tabs, prompts, strict=True)
            )
        )
        browser_turn = None
        if browser_session is not None and self.browser:
            idx = [group[0].session_id for group in tabs].index(browser_session)
            browser_turn = watches[idx][0].turn_id
            if browser_turn is not None:
                with contextlib.suppress(Exception):
                    await self.browser.wait_turn_done(browser_turn, timeout_s=30)
        delta = self.cost_delta(before, self.costs())
        page = await self.browser.collect(browser_turn) if browser_turn is not None else None
        by_prompt = {}
        for record in await self.fetch_ref(ref):
            messages = (record.get("request") or {}).get("messages") or [{}]
            by_prompt[messages[-1].get("content")] = record
        turns = [
            self._turn_result(
                mine, others, by_prompt.get(prompt), page if mine.turn_id == browser_turn else None, keep_render
            )
            for (mine, others), prompt in zip(watches, prompts, strict=True)
        ]
        longtasks = []
        if page:
            window = (before[2].t - time.monotonic() + time.time(), time.time())  # this round, on time.time()
            longtasks = [
                analyze.place_longtask(t, page["flushes"])
                for t in page["longtasks"]
                if window[0] <= t["start"] <= window[1]
            ]
        tokens = sum(t.get("tokens_backend", 0) for t in turns)
        return {"turns": turns, "cost": delta, "tokens": tokens, "longtasks": longtasks}

    def _turn_result(
        self, mine: TurnWatch, others: list[TurnWatch], ref: dict[str, Any] | None, page: dict[str, Any] | None,
        keep_render: bool,
    ) -> dict[str, Any]:  # fmt: skip
        result: dict[str, Any] = {"turn": mine.turn_id, "error": mine.error}
        if mine.turn_id is None or mine.t_send is None:
            return result
        stored = self.stack.stored_turn(mine.turn_id)
        result.update({"status": stored["status"], "finish_reason": stored["finish_reason"]})
        if ref is None:
            result["error"] = (result["error"] or "") + " no direct-reader record for this turn"
            return result
        figures = analyze.turn_figures(
            t_send=mine.t_send,
            batches=mine.batches,
            ref_events=[(t, x) for t, x in ref["events"]],
            ref_t_request=ref.get("t_request"),
            stored_reply=stored["reply"],
            flushes=None if page is None else page["flushes"],
            page_text=None if page is None else page["text"],
        )
        result.update(figures)
        if "ttft_parts_ms" in result and stored["started_at"] and ref.get("t_request"):
            # send->backend request, split: the web stores the turn / it reaches the worker, which sends its request;
            # and when the worker's claim came, from the request (after it for a ticketed turn: queue/tickets.py)
            result["ttft_parts_ms"] |= {
                "submit": (stored["created_at"] - mine.t_send) * 1000,
                "stored_to_request": (ref["t_request"] - stored["created_at"]) * 1000,
                "claim_from_request": (stored["started_at"] - ref["t_request"]) * 1000,
            }
        result["watchers"] = len(others)
        result["watchers_identical_in_order"] = all(
            w.delivery().text == stored["reply"] and w.delivery().in_order and w.end is not None for w in others
        )
        timings = ref.get("timings") or {}
        result["backend_tps"] = (stored["stats"] or {}).get("backend_decode_tps") or timings.get("predicted_per_second")
        result["stored_sha1"] = sha1(stored["reply"])
        result["request"] = ref.get("request")
        for key in ("ws_lag_ms", "display_lag_ms"):
            if key in result:
                series = [round(x, 2) for x in result[key]]
                result[key] = series
                result[key + "_summary"] = stats.summarize(series)
                result[key + "_growth"] = stats.growth(series)
        if "render" in result:
            result["render_flatness"] = analyze.render_flatness(result["render"], max_len=RENDER_CHARS)
            if not keep_render:
                del result["render"]
        return result

    # --- parts ------------------------------------------------------------------------------------------

    async def warm_up(self) -> dict[str, Any]:
        """One direct and one RigDash turn, not counted; the direct one sets the time estimates."""
        payload = chat_payload(model=self.model, prompt=PROMPTS[1], max_tokens=48, seed=SEED)
        record = await direct_chat(self.stack.ports["llama"], payload, timeout_s=300)
        if record.decode_tps:
            self.llama_tps = record.decode_tps
        if record.ttft_ms:
            self.llama_ttft_s = record.ttft_ms / 1000
        sid = self.stack.new_session("llama")
        tabs = await self.open_tabs([sid], 1)
        try:
            if self.browser:
                await self.browser.open_session(sid)
            params = {"max_tokens": 16, "temperature": 0.0, "seed": SEED}
            await run_turn(tabs[0][0], [], "Say hello.", params, timeout_s=self.timeout_s(self.est_llama_s(16)))
        finally:
            await self.close_tabs(tabs)
        await self.fetch_ref("tap")
        # A first turn in a worker child is slower (connections, loop thread): warm every child once with
        # a short synthetic turn each, so each part measures warm workers, as a running server has.
        n = self.stack.worker_concurrency
        sids = [self.stack.new_session("synthetic") for _ in range(n)]
        tabs = await self.open_tabs(sids, 1)
        try:
            await self.rigdash_round(
                tabs=tabs, prompts=[f"[synthetic rate=200 tokens=4 ttft=5] warm {j}" for j in range(n)],
                params={"max_tokens": 4}, ref="synthetic", timeout_s=120,
            )  # fmt: skip
        finally:
            await self.close_tabs(tabs)
        return {"llama_decode_tps": self.llama_tps, "llama_ttft_ms": self.llama_ttft_s * 1000}

    async def idle_baseline(self, seconds: float) -> dict[str, Any]:
        """RigDash's processes with nothing streaming: CPU and Redis operations per second."""
        await asyncio.sleep(1)
        before = self.costs()
        await asyncio.sleep(seconds)
        cost = self.cost_delta(before, self.costs())
        wall = cost["wall_s"]
        return {
            "seconds": wall,
            "cpu_s_per_s": {k: v / wall for k, v in cost["cpu_s"].items()},
            "cpu_pct_of_core": 100 * sum(v for k, v in cost["cpu_s"].items() if k in report.RIGDASH_ROLES) / wall,
            "redis_ops_per_s": sum(cost["redis"].values()) / wall,
            "redis": cost["redis"],
        }

    async def level1(self) -> dict[str, Any]:
        plan = self.plan
        jobs = [(PROMPTS[i % len(PROMPTS)], plan.l1_tokens) for i in range(plan.l1_pairs)]
        jobs += [(LONG_PROMPT, plan.long_tokens)] * plan.llama_long
        out: dict[str, Any] = {"pairs": []}
        for i, (prompt, max_tokens) in enumerate(jobs):
            expected = self.est_llama_s(max_tokens)
            if not self.fits(
                f"L1 pair {i + 1} ({max_tokens} tokens)", 2 * expected + 5, ["lag", "l2", "l3", "render"], first=i == 0
            ):
                continue
            timeout = self.timeout_s(expected)
            params = {"max_tokens": max_tokens, "temperature": 0.0, "seed": SEED}
            payload = chat_payload(model=self.model, prompt=prompt, max_tokens=max_tokens, seed=SEED)
            direct_first = i % 2 == 0
            direct: StreamRecord | None = None
            if direct_first:
                direct = (await self.direct_round(self.stack.ports["llama"], [payload], timeout))[0]
            sid = self.stack.new_session("llama")
            tabs = await self.open_tabs([sid], 1)
            try:
                rd = await self.rigdash_round(
                    tabs=tabs, prompts=[prompt], params=params, ref="tap", timeout_s=timeout, browser_session=sid
                )
            finally:
                await self.close_tabs(tabs)
            if not direct_first:
                direct = (await self.direct_round(self.stack.ports["llama"], [payload], timeout))[0]
            assert direct is not None
            turn = rd["turns"][0]
            out["pairs"].append(
                {
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "order": "direct-first" if direct_first else "rigdash-first",
                    "rigdash": turn,
                    "cost": rd["cost"],
                    "tokens": rd["tokens"],
                    "longtasks": rd["longtasks"],
                    "direct": {
                        **direct.summary(),
                        "text_equals_stored": None if direct.error else turn.get("stored_sha1") == sha1(direct.text),
                        "request_equals_rigdash": payload == turn.get("request"),
                    },
                }
            )
            log(
                f"L1 {i + 1}/{len(jobs)}: {turn.get('tokens_delivered')} tokens at {stats.fmt(direct.decode_tps, 0)}"
                f" tok/s; TTFT RigDash {stats.fmt(turn.get('ttft_ms'), 0)} ms, direct {stats.fmt(direct.ttft_ms, 0)}"
                f" ms; display lag p50 {stats.fmt((turn.get('display_lag_ms_summary') or {}).get('p50'), 1)} ms"
            )
        return out

    async def lag_run(self) -> dict[str, Any] | None:
        """A 2,000-token reply at llama-server's nominal rate from the synthetic source, watched in Chromium."""
        plan = self.plan
        expected = plan.long_tokens / plan.lag_rate * 1.3 + 5
        if not self.fits("the synthetic 2,000-token reply", expected, ["l2", "l3", "render"], first=True):
            return None
        prompt = f"[synthetic rate={plan.lag_rate} tokens={plan.long_tokens} ttft=20] lag over a long reply"
        sid = self.stack.new_session("synthetic")
        tabs = await self.open_tabs([sid], 1)
        try:
            rd = await self.rigdash_round(
                tabs=tabs, prompts=[prompt], ref="synthetic", timeout_s=self.timeout_s(expected), browser_session=sid,
                params={"max_tokens": plan.long_tokens, "temperature": 0.0, "seed": SEED},
            )  # fmt: skip
        finally:
            await self.close_tabs(tabs)
        turn = rd["turns"][0]
        log(
            f"2,000-token reply at {plan.lag_rate} tok/s: display lag p50/p99 "
            f"{stats.fmt((turn.get('display_lag_ms_summary') or {}).get('p50'), 1)}/"
            f"{stats.fmt((turn.get('display_lag_ms_summary') or {}).get('p99'), 1)} ms, growth "
            f"{turn.get('display_lag_ms_growth')}"
        )
        return {"rate": plan.lag_rate, "turn": turn, "cost": rd["cost"], "tokens": rd["tokens"],
                "longtasks": rd["longtasks"]}  # fmt: skip

    async def level2(self) -> dict[str, Any]:
        plan = self.plan
        out: dict[str, Any] = {"rounds": []}
        idle = self.stack.new_session("llama")
        # The dashboard viewers watch the llama rig's live monitoring page socket (a rig.sample every second from
        # the sampler); the idle sockets are chat pages of a session with no turns.
        dashboard = f"/ws/monitoring/rigs/{self.stack.rig_id('llama')}/"
        groups: list[dict[str, Any]] = [
            {"path": dashboard, "count": plan.l2_viewers},
            {"session": idle, "count": plan.l2_idle},
        ]
        swarm = Swarm(self.stack.web_port, self.cookie, groups)
        log(f"L2: connecting {plan.l2_viewers} viewers and {plan.l2_idle} idle sockets")
        out["swarm_ready"] = await swarm.start()
        try:
            out["idle"] = await self.idle_baseline(plan.idle_s)
            log(f"L2 idle with {out['swarm_ready']}: {out['idle']['cpu_pct_of_core']:.2f} % of a core")
            params = {"max_tokens": plan.l2_tokens, "temperature": 0.0, "seed": SEED}
            expected = self.est_llama_s(plan.l2_tokens, streams=4)
            for r in range(plan.l2_rounds):
                if not self.fits(f"L2 round {r + 1}", 2 * expected + 8, ["l3", "render"], first=r == 0):
                    continue
                prompts = [PROMPTS[(r * 4 + j) % len(PROMPTS)] for j in range(4)]
                payloads = [
                    chat_payload(model=self.model, prompt=p, max_tokens=plan.l2_tokens, seed=SEED) for p in prompts
                ]
                entry: dict[str, Any] = {"order": "direct-first" if r % 2 == 0 else "rigdash-first"}
                for step in ("direct", "rigdash") if r % 2 == 0 else ("rigdash", "direct"):
                    if step == "direct":
                        records = await self.direct_round(self.stack.ports["llama"], payloads, self.timeout_s(expected))
                        entry["direct"] = [rec.summary() | {"sha1": sha1(rec.text)} for rec in records]
                        continue
                    sids = [self.stack.new_session("llama") for _ in range(4)]
                    tabs = await self.open_tabs(sids, 2)
                    try:
                        rd = await self.rigdash_round(
                            tabs=tabs, prompts=prompts, params=params, ref="tap", timeout_s=self.timeout_s(expected),
                            browser_session=sids[0] if self.browser else None,
                        )  # fmt: skip
                    finally:
                        await self.close_tabs(tabs)
                    entry.update({"rigdash": rd["turns"], "cost": rd["cost"], "tokens": rd["tokens"]})
                    entry["longtasks"] = rd["longtasks"]
                for d, t in zip(entry["direct"], entry["rigdash"], strict=True):
                    d["text_equals_stored"] = None if d.get("error") else d["sha1"] == t.get("stored_sha1")
                out["rounds"].append(entry)
                log(
                    f"L2 round {r + 1}/{plan.l2_rounds}: TTFT RigDash "
                    + ", ".join(stats.fmt(t.get("ttft_ms"), 0) for t in entry["rigdash"])
                    + " ms; direct "
                    + ", ".join(stats.fmt(d.get("ttft_ms"), 0) for d in entry["direct"])
                    + " ms"
                )
        finally:
            out["swarm"] = await swarm.stop()
        return out

    async def level3(self) -> dict[str, Any]:
        plan = self.plan
        out: dict[str, Any] = {"rounds": []}
        sids = [self.stack.new_session("synthetic") for _ in range(plan.l3_streams)]
        groups = [{"session": sid, "count": 0} for sid in sids]
        for v in range(plan.l3_viewers):
            groups[v % len(groups)]["count"] += 1
        viewers_of = {g["session"]: g["count"] for g in groups}
        log(f"L3: {plan.l3_streams} synthetic sessions, connecting {plan.l3_viewers} viewers")
        swarm = Swarm(self.stack.web_port, self.cookie, groups)
        out["swarm_ready"] = await swarm.start()
        tabs = await self.open_tabs(sids, 1)
        stored_by_turn: dict[int, str] = {}
        session_of_turn: dict[int, int] = {}
        try:
            params = {"max_tokens": plan.l3_tokens, "temperature": 0.0, "seed": SEED}
            expected = plan.l3_tokens / plan.l3_rate * 1.5 + 3
            for r in range(plan.l3_rounds):
                if not self.fits(f"L3 round {r + 1}", 2 * expected + 5, ["render"], first=r == 0):
                    continue
                prompts = [
                    f"[synthetic rate={plan.l3_rate} tokens={plan.l3_tokens} ttft=20] stress round {r} session {j}"
                    for j in range(plan.l3_streams)
                ]
                payloads = [
                    chat_payload(model="synthetic", prompt=p, max_tokens=plan.l3_tokens, seed=SEED) for p in prompts
                ]
                entry: dict[str, Any] = {"order": "direct-first" if r % 2 == 0 else "rigdash-first"}
                for step in ("direct", "rigdash") if r % 2 == 0 else ("rigdash", "direct"):
                    if step == "direct":
                        await self.fetch_ref("synthetic")
                        records = await self.direct_round(
                            self.stack.ports["synthetic"], payloads, self.timeout_s(expected)
                        )
                        sources = {
                            s["request"]["messages"][-1]["content"]: s for s in await self.fetch_ref("synthetic")
                        }
                        entry["direct"] = [
                            rec.summary() | {"source_timings": sources.get(p, {}).get("timings")}
                            for rec, p in zip(records, prompts, strict=True)
                        ]
                        continue
                    rd = await self.rigdash_round(
                        tabs=tabs, prompts=prompts, params=params, ref="synthetic", timeout_s=self.timeout_s(expected)
                    )
                    entry.update({"rigdash": rd["turns"], "cost": rd["cost"], "tokens": rd["tokens"]})
                    for turn, sid in zip(rd["turns"], sids, strict=True):
                        if turn.get("turn") is not None:
                            stored_by_turn[turn["turn"]] = turn.get("stored_sha1", "")
                            session_of_turn[turn["turn"]] = sid
                out["rounds"].append(entry)
                log(
                    f"L3 round {r + 1}/{plan.l3_rounds}: RigDash TTFT max "
                    f"{stats.fmt(max((t.get('ttft_ms') or 0.0) for t in entry['rigdash']), 1)} ms"
                )
        finally:
            await self.close_tabs(tabs)
            result = await swarm.stop()
        out["swarm"] = result
        out["viewer_check"] = report.check_viewers(result, stored_by_turn, session_of_turn, viewers_of)
        return out

    async def render_run(self) -> dict[str, Any] | None:
        """Grow one reply to 30,000 characters in the browser and time each flush (synthetic source)."""
        total, n = 0, 0
        while total < RENDER_CHARS:
            total += stats.utf16_len(synthetic_token(n))
            n += 1
        rate = 300
        expected = n / rate * 1.3 + 5
        if not self.fits("the render run", expected, [], first=True):
            return None
        prompt = f"[synthetic rate={rate} tokens={n} ttft=20] render growth"
        sid = self.stack.new_session("synthetic")
        tabs = await self.open_tabs([sid], 1)
        try:
            rd = await self.rigdash_round(
                tabs=tabs, prompts=[prompt], params={"max_tokens": n, "temperature": 0.0, "seed": SEED},
                ref="synthetic", timeout_s=self.timeout_s(expected), browser_session=sid, keep_render=True,
            )  # fmt: skip
        finally:
            await self.close_tabs(tabs)
        turn = rd["turns"][0]
        series = turn.pop("render", [])
        for key in ("ws_lag_ms", "display_lag_ms"):
            turn.pop(key, None)
        flat = analyze.render_flatness(series, max_len=RENDER_CHARS)
        log(f"render run: {total} chars, p50 render ms by fifth {[b['p50_ms'] for b in flat['bins']]}")
        return {
            "tokens": n, "chars": total, "rate": rate, "turn": turn, "flatness": flat, "longtasks": rd["longtasks"],
            "cost": rd["cost"], "series_sample": series[:: max(1, len(series) // 300)],
        }  # fmt: skip

    # --- the run ----------------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        sys_before, own_before, load_before = psutil.cpu_times(), _tree_cpu(), os.getloadavg()
        counters_before = procstat.Counters.read()  # the whole run's steal
        log(f"{self.plan.name} run; starting the stack in {self.var_dir}")
        try:
            await asyncio.to_thread(self.stack.start, log)
            self.stack.django_setup()
            prepared = self.stack.prepare()
        except BaseException:  # e.g. the web server exited at start: stop what had started (llama-server, worker...)
            await asyncio.to_thread(self.stack.stop)
            raise
        self.cookie, self.model = prepared["cookie"], prepared["llama_model"]
        results: dict[str, Any] = {}
        profilers = []
        if self.args.profile:
            pids = {role: self.stack.pids[role] for role in ("web", "worker", "sampler")}
            profilers = profile.start(pids, self.var_dir / "profile")
        try:
            if not self.args.no_browser:
                from bench.browser import BrowserTab, launcher_on_cpus

                # Under a split the benchmark keeps itself, and so what it starts, off the decode's CPUs. A browser
                # the user starts is not RigDash's to move: Chromium runs on every CPU unless --pin-browser.
                executable = None
                if not self.args.pin_browser and (split := cpu_split()) is not None:
                    executable = launcher_on_cpus(split.every, self.var_dir)
                self.browser = BrowserTab(self.stack.web_port, prepared["cookie_value"], executable=executable)
                await self.browser.start()
                chromium = _chromium_pid()
                if chromium:
                    self.stack.pids["chromium"] = chromium
                    self.chromium_cpus = _cpus_of(chromium)
            log("stack up; warming up (one direct and one RigDash turn, not counted)")
            results["warm_up"] = await self.warm_up()
            log(f"warm-up: llama-server decodes {self.llama_tps:.0f} tok/s here now")
            results["idle"] = await self.idle_baseline(self.plan.idle_s)
            if self.browser:
                results["clock_check"] = await self.browser.clock_check()
            if "l1" in self.levels:
                results["level1"] = await self.level1()
            if "lag" in self.levels or "l1" in self.levels:
                results["lag"] = await self.lag_run()
            if "l2" in self.levels:
                results["level2"] = await self.level2()
            if "l3" in self.levels:
                results["level3"] = await self.level3()
            if "render" in self.levels and self.browser:
                results["render"] = await self.render_run()
            if self.browser:
                results["browser_errors"] = self.browser.errors
        finally:
            own = _tree_cpu() - own_before
            if profilers:
                results["profile"] = profile.stop(profilers)
            if self.browser:
                with contextlib.suppress(Exception):
                    await self.browser.close()
            await asyncio.to_thread(self.stack.stop)
        wall = self.budget.elapsed()
        busy = _busy(psutil.cpu_times()) - _busy(sys_before)
        results["meta"] = self._meta(started, wall, busy, own, load_before)
        share = procstat.Counters.read().since(counters_before)["steal_share"]
        results["meta"]["steal_pct_of_machine"] = None if share is None else round(100 * share, 2)
        return results

    def _meta(
        self, started: str, wall: float, busy: float, own: float, load_before: tuple[float, ...]
    ) -> dict[str, Any]:
        cpu_model = ""
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
        from django.conf import settings

        conf = settings.RIGDASH
        git = ["git", "-C", str(ROOT)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
        dirty = subprocess.run([*git, "status", "--porcelain", "-uno"], capture_output=True, text=True, check=False)
        return {
            "started": started, "mode": self.plan.name, "plan": asdict(self.plan), "wall_s": round(wall, 1),
            "command": " ".join(["./scripts/bench", *sys.argv[1:]]),
            "nproc": os.cpu_count(), "cpu_model": cpu_model, "python": platform.python_version(),
            "model": self.model, "llama_server": os.environ.get("LLAMA_SERVER_BIN", ""),
            "git": commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else ""),
            # The stack's own settings, read as its processes read them (the same environment).
            "flush_interval_ms": conf.flush_interval_ms, "flush_min_interval_ms": conf.flush_min_interval_ms,
            "sample_interval_s": conf.sample_interval_s, "sample_idle_interval_s": conf.sample_idle_interval_s,
            "seed": SEED, "temperature": 0.0,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "machine_busy_cores": round(busy / wall, 2) if wall else None,
            "benchmark_busy_cores": round(own / wall, 2) if wall else None,
            "other_busy_cores": round(max(0.0, busy - own) / wall, 2) if wall else None,
            "database": "own SQLite file" if not self.args.database_url else "--database-url",
            "redis": "private redis-server" if not self.args.redis_url else "--redis-url",
            "skipped": self.skipped,
            "cpu_split": f"{split.describe()}; {self.stack.llama_cpus}" if (split := cpu_split()) else None,
            "chromium_cpus": self.chromium_cpus,
            "cpu_split_holds": None if split is None else ("always" if self.stack.cpu_share is None else "one-reply"),
            "cpu_share_moves": None if self.stack.cpu_share is None else self.stack.cpu_share.moves,
        }  # fmt: skip


def _cpus_of(pid: int | None) -> str | None:
    """The CPUs a process may run on, as a list (``0,1``); None without the process."""
    if pid is None:
        return None
    with contextlib.suppress(psutil.Error):
        return cpu_list(frozenset(psutil.Process(pid).cpu_affinity() or ()))
    return None


def _chromium_pid() -> int | None:
    """The top Chromium process Playwright started (its tree holds renderer and GPU processes)."""
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "chrom" in proc.name() and "chrom" not in proc.parent().name():
                return int(proc.pid)
    return None


def _busy(times: Any) -> float:
    """CPU seconds this machine's own processes and kernel ran (steal, the hypervisor's, is counted apart; before
    2026-12-03 it was in here, and so in the header's "other processes")."""
    return float(times.user + times.nice + times.system + times.irq + times.softirq)


def _tree_cpu() -> float:
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./scripts/bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (about 2 minutes on a quiet machine)")
    parser.add_argument("--levels", default="1,2,3,render", help="parts to run: 1 (with lag), lag, 2, 3, render")
    parser.add_argument("--flush-ms", type=int, default=None, help="RIGDASH_FLUSH_INTERVAL_MS for the stack")
    parser.add_argument(
        "--flush-min-ms", type=int, default=None, help="RIGDASH_FLUSH_MIN_INTERVAL_MS (= --flush-ms: a fixed interval)"
    )
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file under var/bench/")
    parser.add_argument("--redis-url", default=None, help="default: a private redis-server on a free port")
    parser.add_argument("--no-browser", action="store_true", help="skip Chromium (no display lag figures)")
    parser.add_argument("--budget-s", type=float, default=None, help="override the plan's time budget")
    parser.add_argument("--idle-s", type=float, default=None, help="override each idle window's length (seconds)")
    parser.add_argument("--profile", action="store_true", help="sample web and worker with py-spy (pip install)")
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/<time>-<mode>.json)")
    parser.add_argument(
        "--decode-cpus",
        default=None,
        help="RIGDASH_DECODE_CPUS: llama-server's decode alone on these CPUs (1, 2-7), its prompts on every CPU;"
        " RigDash and the clients on the rest, Chromium on every CPU (see --pin-browser)",
    )
    parser.add_argument(
        "--pin-browser",
        action="store_true",
        help="with --decode-cpus: Chromium off the decode's CPUs too, as a browser started with taskset; without it"
        " Chromium runs on every CPU, as a browser the user starts (RigDash's launcher pins only what it starts)",
    )
    parser.add_argument(
        "--split-always",
        action="store_true",
        help="with --decode-cpus: RigDash off the decode's CPUs whatever streams (RIGDASH_DECODE_CPUS_HOLD=always);"
        " without it RigDash's processes use every CPU while several replies stream",
    )
    parser.add_argument(
        "--browser-floor",
        action="store_true",
        help="instead: what Chromium painting a reply costs llama-server with no RigDash (bench/browser_floor.py)",
    )
    args = parser.parse_args(argv)
    if args.decode_cpus is not None:
        os.environ["RIGDASH_DECODE_CPUS"] = args.decode_cpus
    if args.split_always:
        os.environ["RIGDASH_DECODE_CPUS_HOLD"] = "always"
    # Under a split everything the benchmark starts but llama-server inherits the other CPUs: RigDash, the tap,
    # the synthetic source and the benchmark's own clients, in the direct reads and through RigDash alike. Chromium
    # is started on every CPU again, as a user's browser would run (unless --pin-browser).
    keep_off_decode_cpus(cpu_split())
    if args.browser_floor:
        from bench import browser_floor

        mode = "quick" if args.quick else "full"
        out = (
            Path(args.out) if args.out else RESULTS_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}-browser-floor-{mode}.json"
        )
        browser_floor.run(rounds=3 if args.quick else 8, tokens=200 if args.quick else 400, out=out)
        return 0
    plan = QUICK if args.quick else FULL
    if args.budget_s:
        plan = Plan(**{**asdict(plan), "budget_s": args.budget_s})
    if args.idle_s:
        plan = Plan(**{**asdict(plan), "idle_s": args.idle_s})
    bench = Bench(args, plan)
    results = asyncio.run(bench.run())
    results["aggregate"] = report.aggregate(results)
    header = report.header(results["meta"])
    rows = report.table_rows(results["aggregate"])
    print(header)
    print(stats.render_table(["part", "figure", "measured", "target", ""], rows))
    results["table"] = {"header": header, "rows": rows}
    out = Path(args.out) if args.out else RESULTS_DIR / f"{bench.stamp}-{plan.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nresults: {out}\nlogs: {bench.var_dir / 'log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
