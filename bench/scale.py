"""Cost as the work grows (issue 43): many rigs, many viewers on two web processes, GPU-class decode rates.

    python -m bench.scale rigs      # 20 rigs sampled at 1 Hz: sampler CPU per rig, sample-to-browser delay, DB growth
    python -m bench.scale viewers   # 2 web processes, 16 streaming turns, 100 and 500 open sockets
    python -m bench.scale rate      # 2,000 tokens/s x 1 and x 16 streams through the worker and the web
    python -m bench.scale api       # the same rates read through /v1/chat/completions by an API client
    python -m bench.scale all --smoke   # a tiny run of each (tests/test_bench_scale.py)

Every part starts its own RigDash on free ports (bench.stack: a private Redis, SQLite unless ``--database-url``;
``rigs`` measures the database's growth on PostgreSQL, so give it one) with the synthetic llama-server
(bench.synthetic) as every rig's backend. Figures are against a floor measured in the same run without RigDash:
the synthetic source read straight by the same client (lags and rates), the source's own CPU, a bare read of a
rig's /slots and /metrics. Display lag here is a token's arrival on a websocket client minus its emission by the
source (a direct reader's arrival is later still, so this is the stricter figure). Load averages are recorded,
since this machine's cores are shared. Results go to bench/results/scale-<part>-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import itertools
import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench import procstat, profile, stats
from bench.httpstream import chat_payload, direct_chat
from bench.rigclient import Tab, TurnWatch, run_turn
from bench.stack import BenchStack
from bench.wsproto import WSClient, WSClosed
from rigdash.launcher import PYTHON, ROOT, Stack, free_port

RESULTS_DIR = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Size:
    rig_counts: tuple[int, ...] = (5, 20)
    rig_seconds: float = 40.0
    viewer_sockets: tuple[int, ...] = (100, 500)
    viewer_turns: int = 16
    viewer_rate: int = 100
    viewer_tokens: int = 600
    rate: int = 2000
    rate_streams: tuple[int, ...] = (1, 16)
    rate_tokens: int = 8000


FULL = Size()
SMOKE = Size(rig_counts=(2,), rig_seconds=3.0, viewer_sockets=(12,), viewer_turns=2, viewer_rate=200,
             viewer_tokens=60, rate=500, rate_streams=(2,), rate_tokens=200)  # fmt: skip


def log(message: str) -> None:
    print(message, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- what the clients saw, against what the source emitted ------------------------------------------------


def marker(text: str) -> str:
    return text.rsplit(" ", 1)[-1]


def emissions(port: int) -> dict[str, dict[str, Any]]:
    """The synthetic source's streams on ``port`` since the last call, by the marker that ends their prompt."""
    records = httpx.get(f"http://127.0.0.1:{port}/_synthetic/streams", timeout=30).json()
    out = {}
    for record in records:
        messages = record["request"].get("messages") or [{}]
        out[marker(str(messages[-1].get("content", "")))] = record
    return out


@dataclass
class Seen:
    """Every client's view of every turn, checked against the source: lags in ms, rate ratios, failures."""

    lags_ms: list[float] = field(default_factory=list)
    emitted_s: list[float] = field(default_factory=list)  # each lag's token's emission time (time.time())
    rate_ratios: list[float] = field(default_factory=list)
    clients: int = 0
    complete: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, watch: TurnWatch, record: dict[str, Any] | None, label: str) -> None:
        self.clients += 1
        if record is None:
            self.failures.append(f"{label}: the source has no stream for it ({watch.error})")
            return
        emitted = [t for t, _ in record["events"]]
        texts = "".join(text for _, text in record["events"])
        delivery = watch.delivery()
        if watch.error or not delivery.in_order or delivery.last_seq != len(emitted) or delivery.text != texts:
            self.failures.append(
                f"{label}: error={watch.error} in_order={delivery.in_order} gaps={delivery.gaps} "
                f"dups={delivery.duplicates} seqs={delivery.last_seq}/{len(emitted)} text_ok={delivery.text == texts}"
            )
            return
        self.matched(delivery.arrivals, emitted)

    def matched(self, arrivals: list[float], emitted: list[float]) -> None:
        """A client that got every token, in order: each token's lag, and its rate against the source's."""
        self.complete += 1
        self.lags_ms += [(a - e) * 1000 for a, e in zip(arrivals, emitted, strict=True)]
        self.emitted_s += emitted
        ratio = stats.ratio(stats.decode_rate(arrivals), stats.decode_rate(emitted))
        if ratio is not None:
            self.rate_ratios.append(ratio)

    def summary(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "complete_in_order": self.complete,
            "every_token_in_order": self.clients > 0 and self.complete == self.clients,
            "display_lag_ms": stats.summarize(self.lags_ms, 2),
            "rate_seen_over_source": {
                "min": _r(min(self.rate_ratios, default=None)),
                "median": _r(stats.median(self.rate_ratios)),
            },
            "failures": self.failures[:10],
        }


def lag_by_sample_phase(seen: Seen, sample_ts: Sequence[float], window_s: float = 0.2) -> dict[str, Any]:
    """The tokens' lags split by when the token was emitted: within ``window_s`` after a sample was taken (while
    its frames go out to the dashboards) or at any other time. Where the tail comes from."""
    starts = sorted(set(sample_ts))
    near: list[float] = []
    rest: list[float] = []
    for lag, emitted in zip(seen.lags_ms, seen.emitted_s, strict=True):
        i = bisect.bisect_right(starts, emitted) - 1
        (near if i >= 0 and emitted - starts[i] < window_s else rest).append(lag)
    return {"window_s": window_s, "after_a_sample": stats.summarize(near, 2), "otherwise": stats.summarize(rest, 2)}


async def direct_floor(port: int, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """The same streams read straight from the source by this process's client: the floor of lag and rate."""
    emissions(port)  # forget earlier streams
    t0, cpu0 = time.monotonic(), _own_cpu()
    records = await asyncio.gather(
        *(direct_chat(port, chat_payload(model="synthetic", prompt=p, max_tokens=max_tokens, seed=0), timeout_s=600)
          for p in prompts)
    )  # fmt: skip
    wall, cpu = time.monotonic() - t0, _own_cpu() - cpu0
    sources = emissions(port)
    seen = Seen()
    for prompt, record in zip(prompts, records, strict=True):
        source = sources.get(marker(prompt))
        seen.clients += 1
        emitted = [t for t, _ in source["events"]] if source else []
        if (
            record.error
            or source is None
            or len(record.times) != len(emitted)
            or record.text != "".join(text for _, text in source["events"])
        ):
            seen.failures.append(f"direct {marker(prompt)}: error={record.error} tokens={len(record.times)}")
            continue
        seen.matched(record.times, emitted)
    return {**seen.summary(), "client_cpu_pct_of_a_core": round(100 * cpu / wall, 1), "loadavg": loadavg()}


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


# --- passive sockets: dashboards and the board -------------------------------------------------------------


@dataclass
class Passive:
    path: str
    frames: int = 0
    sample_delays_ms: list[float] = field(default_factory=list)
    sample_bytes: list[int] = field(default_factory=list)  # each sample frame's size (the relay floor's samples)
    sample_ts: list[float] = field(default_factory=list)  # when each sample was taken
    largest_sample: str = ""  # the largest sample frame seen (the relay floor sends it)
    error: str | None = None


async def read_passive(client: WSClient, passive: Passive) -> None:
    try:
        while True:
            arrived, text = await client.recv_text()
            frame = orjson.loads(text)
            passive.frames += 1
            if frame.get("type") == "rig.sample" and frame.get("sample", {}).get("ts"):
                passive.sample_delays_ms.append((arrived - float(frame["sample"]["ts"])) * 1000)
                passive.sample_bytes.append(len(text.encode()))
                passive.sample_ts.append(float(frame["sample"]["ts"]))
                if len(text) > len(passive.largest_sample):
                    passive.largest_sample = text
    except (WSClosed, OSError, asyncio.IncompleteReadError) as exc:
        passive.error = repr(exc)


class Pool:
    """Websocket clients of one process: chat tabs and passive sockets, spread over the web processes."""

    def __init__(self, ports: list[int], cookie: str) -> None:
        self.ports, self.cookie = ports, cookie
        self.passive: list[tuple[WSClient, Passive, asyncio.Task[None]]] = []
        self.tabs: list[Tab] = []
        self.gate = asyncio.Semaphore(16)
        self._next = 0

    def port(self) -> int:
        self._next += 1
        return self.ports[self._next % len(self.ports)]

    async def tab(self, session_id: int) -> Tab:
        async with self.gate:
            tab = await Tab.open(self.port(), session_id, self.cookie)
        self.tabs.append(tab)
        return tab

    async def open_passive(self, path: str) -> Passive:
        async with self.gate:
            client = await WSClient.connect(self.port(), path, cookie=self.cookie, timeout_s=30)
        passive = Passive(path)
        self.passive.append((client, passive, asyncio.create_task(read_passive(client, passive))))
        return passive

    def reset_counts(self) -> None:
        for _, passive, _ in self.passive:
            passive.frames, passive.sample_delays_ms, passive.sample_ts = 0, [], []

    async def close(self) -> None:
        for _, _, task in self.passive:
            task.cancel()
        await asyncio.gather(*(t for _, _, t in self.passive), return_exceptions=True)
        await asyncio.gather(*(c.close() for c, _, _ in self.passive), *(t.close() for t in self.tabs),
                             return_exceptions=True)  # fmt: skip
        self.passive, self.tabs = [], []


def run_waits(stack: BenchStack) -> dict[str, float]:
    """Seconds each RigDash process tree's threads have waited, runnable, for a core (bench/procstat.py): on this
    shared machine, how much of a lag is other programs holding the cores."""
    out: dict[str, float] = {}
    for role, pid in stack.pids.items():
        if role in ("redis", "synthetic"):
            continue
        try:
            pids = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
        except psutil.Error:
            continue
        out[role] = sum(procstat.run_delay_s(p) for p in pids)
    return out


# --- part 3: many rigs ---------------------------------------------------------------------------------------


def _make_rigs(stack: BenchStack, count: int) -> list[int]:
    from inference.models import Rig
    from monitoring.models import RigProfile

    ids = [stack.rig_id("synthetic")]
    for i in range(2, count + 1):
        rig = Rig.objects.create(name=f"bench-synthetic-{i}", kind=Rig.Kind.LLAMACPP, queue=f"rig.bench-synthetic-{i}",
                                 base_url=f"http://127.0.0.1:{stack.ports[f'synthetic{i}']}", slots=16)  # fmt: skip
        ids.append(rig.pk)
    for rig_id in ids:  # a typed geometry and bandwidth: no probe of this host's memory, KV figures in every sample
        RigProfile.objects.update_or_create(
            rig_id=rig_id,
            defaults={"bandwidth_gbs": 4800.0, "bandwidth_source": "setting", "model_layers": 30,
                      "model_kv_heads": 3, "model_head_dim": 64},
        )  # fmt: skip
    return ids


def _sample_rows(rig_ids: Sequence[int], since: float) -> int:
    from datetime import UTC, datetime

    from monitoring.models import RigSample

    return RigSample.objects.filter(
        rig_id__in=rig_ids, resolution_s=1, ts__gte=datetime.fromtimestamp(since, UTC)
    ).count()


def _table_bytes() -> dict[str, Any]:
    """The samples table's size with its indexes and TOAST (PostgreSQL), its rows, and its rows' own sizes."""
    from django.db import connection

    from monitoring.models import RigSample

    table = RigSample._meta.db_table
    rows = RigSample.objects.count()
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT coalesce(sum(length(series) + length(detail) + 40), 0) FROM {table}")  # noqa: S608
            return {"engine": connection.vendor, "rows": rows, "bytes": int(cursor.fetchone()[0]), "index_bytes": 0}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s), pg_indexes_size(%s)", [table, table])
        total, indexes = cursor.fetchone()
    return {"engine": "postgresql", "rows": rows, "bytes": int(total), "index_bytes": int(indexes)}


def _downsampled_row_bytes(rig_ids: Sequence[int]) -> float | None:
    """Fold the run's complete minutes into 60 s samples (as the sampler's maintenance does) and size one."""
    from django.db import connection

    from monitoring import services
    from monitoring.models import RigSample

    services.samples_downsample()
    table = RigSample._meta.db_table
    size = "pg_column_size(t.*)" if connection.vendor == "postgresql" else "length(series) + length(detail) + 40"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT avg({size}) FROM {table} t WHERE resolution_s = 60")  # noqa: S608
        value = cursor.fetchone()[0]
    return float(value) if value is not None else None


async def part_rigs(stack: BenchStack, prepared: dict[str, Any], size: Size) -> dict[str, Any]:
    from django.conf import settings

    from inference.models import Rig

    conf = settings.RIGDASH
    rig_ids = _make_rigs(stack, max(size.rig_counts))
    # The floor: what a bare read of one rig's /slots and /metrics takes from here, no RigDash in between.
    from inference.backends.llamacpp import metrics as llamacpp

    reads = []
    for _ in range(20):
        t = time.perf_counter()
        await llamacpp.collect(f"http://127.0.0.1:{stack.ports['synthetic']}", props_cache={"x": 1})
        reads.append((time.perf_counter() - t) * 1000)
    rounds: list[dict[str, Any]] = []
    for count in size.rig_counts:
        Rig.objects.filter(pk__in=rig_ids[:count]).update(enabled=True)
        Rig.objects.exclude(pk__in=rig_ids[:count]).update(enabled=False)
        pool = Pool([stack.ports[name] for name in stack.web_names()], prepared["cookie"])
        for rig_id in rig_ids[:count]:
            await pool.open_passive(f"/ws/monitoring/rigs/{rig_id}/")
        await pool.open_passive("/ws/monitoring/")
        sampler = Stack()
        proc = sampler.start("sampler", [PYTHON, "manage.py", "rigdash_sampler"], env=stack.env,
                             log_path=stack.log_dir / f"sampler-{count}.log")  # fmt: skip
        stack.pids["sampler"] = proc.pid
        await asyncio.sleep(6 if size is FULL else 3)  # every loop started, the first reads (the models) done
        before = _table_bytes()
        pool.reset_counts()
        cpu0, load0, t0 = stack.cpu(), loadavg(), time.time()
        await asyncio.sleep(size.rig_seconds)
        cpu1, wall = stack.cpu(), time.time() - t0
        after = _table_bytes()
        rows = _sample_rows(rig_ids[:count], t0)
        sampler.stop()
        del stack.pids["sampler"]
        delays = [d for _, p, _ in pool.passive if p.path != "/ws/monitoring/" for d in p.sample_delays_ms]
        overview = [p for _, p, _ in pool.passive if p.path == "/ws/monitoring/"]
        await pool.close()
        used = {name: (cpu1.get(name, 0.0) - cpu0.get(name, 0.0)) / wall for name in cpu1}
        web = sum(used.get(name, 0.0) for name in stack.web_names())
        samples_per_rig_s = rows / wall / count
        raw_row = (after["bytes"] - before["bytes"]) / (after["rows"] - before["rows"]) if after["rows"] > before[
            "rows"] else None  # fmt: skip
        rounds.append({
            "rigs": count,
            "seconds": round(wall, 1),
            "samples_per_rig_per_s": round(samples_per_rig_s, 3),
            "sampler_cpu_pct_of_a_core": round(100 * used.get("sampler", 0.0), 2),
            "sampler_cpu_ms_per_sample": round(1000 * used.get("sampler", 0.0) / (samples_per_rig_s * count), 3)
            if samples_per_rig_s else None,
            "web_cpu_pct_of_a_core": round(100 * web, 2),
            "source_cpu_pct_of_a_core": round(100 * used.get("synthetic", 0.0), 2),
            "sample_to_browser_ms": stats.summarize(delays, 1),
            "overview_frames_per_s": round(sum(p.frames for p in overview) / wall, 2),
            "raw_sample_bytes": round(raw_row) if raw_row else None,
            "table": after,
            "loadavg": [load0, loadavg()],
        })  # fmt: skip
        r, delay = rounds[-1], rounds[-1]["sample_to_browser_ms"]
        log(f"rigs {count}: sampler {r['sampler_cpu_pct_of_a_core']} % of a core, {r['samples_per_rig_per_s']} "
            f"samples/rig/s, sample-to-browser p50 {delay.get('p50')} p95 {delay.get('p95')} ms, "
            f"load {loadavg()}")  # fmt: skip
    slope = None
    if len(rounds) >= 2:
        fit = stats.linear_fit([r["rigs"] for r in rounds], [r["sampler_cpu_pct_of_a_core"] for r in rounds])
        slope = {"pct_of_a_core_per_rig": round(fit[0], 3), "intercept_pct": round(fit[1], 2)} if fit else None
    last = rounds[-1]
    raw_bytes = next((r["raw_sample_bytes"] for r in reversed(rounds) if r["raw_sample_bytes"]), None)
    ds_bytes = _downsampled_row_bytes(rig_ids)
    per_s = 1.0 / conf.sample_interval_s
    growth = None
    if raw_bytes:
        index_share = last["table"]["index_bytes"] / max(1, last["table"]["rows"])
        ds_row = (ds_bytes + index_share) if ds_bytes else None
        raw_day = per_s * 86400 * raw_bytes
        growth = {
            "raw_sample_bytes_with_indexes": raw_bytes,
            "downsampled_sample_bytes_with_indexes": round(ds_row) if ds_row else None,
            "first_day_mb_per_rig": round((raw_day + (1440 * ds_row if ds_row else 0)) / 1e6, 1),
            "after_the_first_day_mb_per_rig_per_day": round(1440 * ds_row / 1e6, 2) if ds_row else None,
            "retention": {"raw_h": conf.sample_raw_retention_h, "downsampled_d": conf.sample_downsampled_retention_d},
            "bound_mb_per_rig": round(
                (
                    conf.sample_raw_retention_h * 3600 * per_s * raw_bytes
                    + conf.sample_downsampled_retention_d * 1440 * (ds_row or 0)
                )
                / 1e6,
                1,
            ),
            "note": "a busy rig at the full pace; an idle rig is sampled every "
            f"{conf.sample_idle_interval_s:g} s, and stores that much less raw",
        }
    return {"floor_backend_read_ms": stats.summarize(reads, 2), "rounds": rounds, "sampler_slope": slope,
            "database_growth": growth}  # fmt: skip


# --- part 4: many viewers, two web processes ------------------------------------------------------------------


async def stream_turns(
    stack: BenchStack, pool: Pool, sessions: list[int], watchers: int, *, rate: int, tokens: int, tag: str
) -> tuple[Seen, float, dict[str, float], dict[str, Any]]:
    """One turn per session, all at once, each sent from one tab and followed by ``watchers`` more (spread over
    the web processes). Returns what every tab saw, the wall time, each process's CPU seconds meanwhile, and the
    frames the tabs got (``frames``: every frame of the turns; ``batches``: the senders' token frames)."""
    senders = [await pool.tab(s) for s in sessions]
    watching = [[await pool.tab(s) for _ in range(watchers)] for s in sessions]
    prompts = [f"[synthetic rate={rate} tokens={tokens} ttft=20] {tag}-{i}" for i in range(len(sessions))]
    emissions(stack.ports["synthetic"])  # forget earlier streams
    # This process is the clock every lag is read by: a full collection of its sockets and of the arrivals it
    # records stopped it for 45-125 ms mid-round. No collection until the round ends (rigdash/gcpolicy.py).
    gc.collect()
    gc.freeze()
    gc.disable()
    cpu0, wait0, steal0, t0 = stack.cpu(), run_waits(stack), procstat.steal_s(), time.monotonic()
    own0, own_wait0, load0 = _own_cpu(), procstat.run_delay_s(os.getpid()), loadavg()
    results = await asyncio.gather(
        *(run_turn(s, w, p, {"max_tokens": tokens}, timeout_s=120 + 3 * tokens / rate)
          for s, w, p in zip(senders, watching, prompts, strict=True))
    )  # fmt: skip
    wall, cpu1, wait1, steal1 = time.monotonic() - t0, stack.cpu(), run_waits(stack), procstat.steal_s()
    sources = emissions(stack.ports["synthetic"])
    seen = Seen()
    counts: dict[str, Any] = {"frames": 0, "batches": 0}
    counts["machine"] = {  # what else held the cores meanwhile
        "loadavg": [load0, loadavg()],
        "waited_for_a_core_ms_per_s": {
            role: round(1000 * (wait1[role] - wait0.get(role, 0.0)) / wall, 1) for role in wait1
        },
        "steal_share": stats.steal_share(steal1 - steal0, wall, os.cpu_count() or 1),
        "client": {  # this process: every socket's reader, whose arrival times the lags are
            "cpu_pct_of_a_core": round(100 * (_own_cpu() - own0) / wall, 1),
            "waited_for_a_core_ms_per_s": round(1000 * (procstat.run_delay_s(os.getpid()) - own_wait0) / wall, 1),
        },
    }
    for prompt, (mine, others) in zip(prompts, results, strict=True):
        counts["batches"] += len(mine.batches)
        for watch in [mine, *others]:
            seen.add(watch, sources.get(marker(prompt)), marker(prompt))
            counts["frames"] += len(watch.batches) + (watch.turn_id is not None) + (watch.end is not None)
    for tab in [*senders, *(t for w in watching for t in w)]:
        await tab.close()
        pool.tabs.remove(tab)
    gc.enable()
    gc.unfreeze()
    return seen, wall, {name: cpu1.get(name, 0.0) - cpu0.get(name, 0.0) for name in cpu1}, counts


def _socket_mix(sockets: int, turns: int) -> tuple[int, int, int]:
    """(watchers per turn, dashboards, board sockets): a third of the sockets are chat tabs (a sender and watchers
    per turn), most of the rest dashboards of the rig and the overview, and one in twenty-five the board."""
    chat = max(turns, sockets // 3)
    watchers = max(0, chat // turns - 1)
    board = max(1, sockets // 25)
    return watchers, max(1, sockets - turns * (watchers + 1) - board), board


async def _open_passive(pool: Pool, dashboards: int, board: int, rig_id: int) -> None:
    for i in range(dashboards):
        await pool.open_passive("/ws/monitoring/" if i % 10 == 9 else f"/ws/monitoring/rigs/{rig_id}/")
    for _ in range(board):
        await pool.open_passive("/ws/board/")
    await asyncio.sleep(1)
    pool.reset_counts()


PADDING_BYTES = 6000  # the relay floor's sample when RigDash sent none in the round


async def relay_floor(
    stack: BenchStack, sockets: int, turns: int, *, rate: int, tokens: int, sample: str
) -> dict[str, Any]:
    """The same round with no RigDash: one minimal relay (bench/relayfloor.py) sends the same frames to the same mix
    of sockets, the turns' tokens at RigDash's flush ceiling and one of RigDash's sample frames from the round (its
    own structure, so the client parses as much) to every passive socket once a second, read by the same client. What
    its lag shows is this machine's, with these sockets."""
    from django.conf import settings

    port = free_port()
    what = f"--sample-bytes={PADDING_BYTES}"  # a round too short for a sample: padding
    if sample:
        sample_file = stack.log_dir / f"relay-sample-{sockets}.json"
        sample_file.write_text(sample)
        what = f"--sample-file={sample_file}"
    command = [PYTHON, "-m", "bench.relayfloor", f"--port={port}", f"--source-port={stack.ports['synthetic']}",
               f"--interval-ms={settings.RIGDASH.flush_interval_ms}", what]  # fmt: skip
    relay = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None
        ready = await asyncio.wait_for(asyncio.to_thread(relay.stdout.readline), 30)
        if ready.strip() != "READY":
            raise RuntimeError(f"the relay floor did not start: {ready!r}")
        watchers, dashboards, board = _socket_mix(sockets, turns)
        pool = Pool([port], "")
        await _open_passive(pool, dashboards, board, 1)
        cpu0 = sum(psutil.Process(relay.pid).cpu_times()[:2])
        seen, wall, _, counts = await stream_turns(stack, pool, list(range(1, turns + 1)), watchers, rate=rate,
                                                   tokens=tokens, tag=f"relay{sockets}")  # fmt: skip
        relay_s = sum(psutil.Process(relay.pid).cpu_times()[:2]) - cpu0
        pool_samples = list(pool.passive)
        await pool.close()
    finally:
        relay.terminate()
        relay.wait(10)
    phases = lag_by_sample_phase(seen, [ts for _, p, _ in pool_samples for ts in p.sample_ts])
    return {"sockets": turns * (watchers + 1) + dashboards + board,
            "sample_bytes": len(sample.encode()) or PADDING_BYTES, **seen.summary(),
            "display_lag_by_sample_phase_ms": phases,
            "relay_cpu_pct_of_a_core": round(100 * relay_s / wall, 1), "client": counts["machine"]["client"],
            "loadavg": counts["machine"]["loadavg"]}  # fmt: skip


async def part_viewers(stack: BenchStack, prepared: dict[str, Any], size: Size) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    get_user_model().objects.filter(username="bench").update(is_staff=True)  # the board is staff-only
    ports = [stack.ports[name] for name in stack.web_names()]
    rig_id = stack.rig_id("synthetic")
    sessions = [stack.new_session("synthetic") for _ in range(size.viewer_turns)]
    tokens, rate = size.viewer_tokens, size.viewer_rate
    floor = await direct_floor(
        stack.ports["synthetic"],
        [f"[synthetic rate={rate} tokens={tokens} ttft=20] floor-{i}" for i in range(size.viewer_turns)],
        tokens,
    )
    log(f"viewers floor (direct): lag p99 {floor['display_lag_ms'].get('p99')} ms")
    rounds: list[dict[str, Any]] = []
    for sockets in size.viewer_sockets:
        watchers, dashboards, board = _socket_mix(sockets, len(sessions))
        pool = Pool(ports, prepared["cookie"])
        await _open_passive(pool, dashboards, board, rig_id)
        seen, wall, cpu, counts = await stream_turns(stack, pool, sessions, watchers, rate=rate, tokens=tokens,
                                             tag=f"viewers{sockets}")  # fmt: skip
        passive_frames = sum(p.frames for _, p, _ in pool.passive)
        delays = [d for _, p, _ in pool.passive for d in p.sample_delays_ms]
        sample_sizes = [n for _, p, _ in pool.passive for n in p.sample_bytes]
        board_frames = sum(p.frames for _, p, _ in pool.passive if p.path == "/ws/board/")
        phases = lag_by_sample_phase(seen, [ts for _, p, _ in pool.passive for ts in p.sample_ts])
        errors = sorted({p.error for _, p, _ in pool.passive if p.error})[:5]
        pool_passive = list(pool.passive)
        await pool.close()
        web_s = sum(cpu.get(name, 0.0) for name in stack.web_names())
        frames = counts["frames"] + passive_frames
        summary = seen.summary()
        rounds.append({
            "sockets": len(sessions) * (watchers + 1) + dashboards + board,
            "chat_tabs": len(sessions) * (watchers + 1), "dashboards": dashboards, "board": board,
            "web_processes": len(ports),
            "seconds": round(wall, 2),
            **summary,
            "frames_delivered": frames,
            "board_frames": board_frames,
            "dashboard_sample_to_browser_ms": stats.summarize(delays, 1),
            "display_lag_by_sample_phase_ms": phases,
            "web_cpu_s": round(web_s, 3),
            "web_cpu_pct_of_a_core": round(100 * web_s / wall, 1),
            "web_cpu_us_per_frame": round(1e6 * web_s / frames, 1) if frames else None,
            "worker_cpu_pct_of_a_core": round(100 * cpu.get("worker", 0.0) / wall, 1),
            **counts["machine"],
            "passive_errors": errors,
        })  # fmt: skip
        r = rounds[-1]
        log(f"viewers {r['sockets']} sockets: in order {r['every_token_in_order']} "
            f"lag p50 {r['display_lag_ms'].get('p50')} p99 {r['display_lag_ms'].get('p99')} ms, "
            f"web {r['web_cpu_pct_of_a_core']} % of a core, {r['web_cpu_us_per_frame']} us/frame, "
            f"load {loadavg()}")  # fmt: skip
        log(
            f"  lag p99 after a sample {phases['after_a_sample'].get('p99')} ms "
            f"({phases['after_a_sample'].get('n')} tokens), otherwise {phases['otherwise'].get('p99')} ms"
        )
        dashboards_seen = (p for _, p, _ in pool_passive if p.path != "/ws/monitoring/")
        largest = max((p.largest_sample for p in dashboards_seen), key=len, default="")
        r["relay_floor"] = await relay_floor(stack, sockets, len(sessions), rate=rate, tokens=tokens, sample=largest)
        r["relay_floor"]["mean_rigdash_sample_bytes"] = (
            round(sum(sample_sizes) / len(sample_sizes)) if sample_sizes else None
        )
        f = r["relay_floor"]
        log(f"  relay floor, {f['sockets']} sockets: in order {f['every_token_in_order']} lag p50 "
            f"{f['display_lag_ms'].get('p50')} p99 {f['display_lag_ms'].get('p99')} ms, relay "
            f"{f['relay_cpu_pct_of_a_core']} % of a core, client {f['client']['cpu_pct_of_a_core']} %")  # fmt: skip
        fp = f["display_lag_by_sample_phase_ms"]
        log(
            f"  relay floor lag p99 after a sample {fp['after_a_sample'].get('p99')} ms, "
            f"otherwise {fp['otherwise'].get('p99')} ms"
        )
    slope = None
    if len(rounds) >= 2:
        fit = stats.linear_fit([r["sockets"] for r in rounds], [r["web_cpu_pct_of_a_core"] for r in rounds])
        slope = (
            {"web_pct_of_a_core_per_100_viewers": round(100 * fit[0], 2), "intercept_pct": round(fit[1], 1)}
            if fit
            else None
        )
    return {"rate": rate, "tokens": tokens, "turns": len(sessions), "floor_direct": floor, "rounds": rounds,
            "web_slope": slope}  # fmt: skip


# --- part 5: GPU-class decode rates ------------------------------------------------------------------------


async def part_rate(stack: BenchStack, prepared: dict[str, Any], size: Size) -> dict[str, Any]:
    ports = [stack.ports[name] for name in stack.web_names()]
    rounds: list[dict[str, Any]] = []
    for streams in size.rate_streams:
        sessions = [stack.new_session("synthetic") for _ in range(streams)]
        floor = await direct_floor(
            stack.ports["synthetic"],
            [
                f"[synthetic rate={size.rate} tokens={size.rate_tokens} ttft=20] rfloor{streams}-{i}"
                for i in range(streams)
            ],
            size.rate_tokens,
        )
        pool = Pool(ports, prepared["cookie"])
        seen, wall, cpu, counts = await stream_turns(stack, pool, sessions, 0, rate=size.rate, tokens=size.rate_tokens,
                                             tag=f"rate{streams}")  # fmt: skip
        await pool.close()
        streaming_s = size.rate_tokens / size.rate
        web_s = sum(cpu.get(name, 0.0) for name in stack.web_names())
        batches = counts["batches"]
        rounds.append({
            "streams": streams, "rate_per_stream": size.rate, "tokens_per_stream": size.rate_tokens,
            "seconds": round(wall, 2),
            **seen.summary(),
            "floor_direct": floor,
            "worker_cpu_pct_of_a_core": round(100 * cpu.get("worker", 0.0) / wall, 1),
            "web_cpu_pct_of_a_core": round(100 * web_s / wall, 1),
            "source_cpu_pct_of_a_core": round(100 * cpu.get("synthetic", 0.0) / wall, 1),
            "worker_cpu_ms_per_stream_second": round(1000 * cpu.get("worker", 0.0) / (streams * streaming_s), 2),
            "web_cpu_ms_per_stream_second": round(1000 * web_s / (streams * streaming_s), 2),
            "token_batches": batches,
            "worker_cpu_us_per_batch": round(1e6 * cpu.get("worker", 0.0) / batches, 1) if batches else None,
            "worker_cpu_us_per_token": round(1e6 * cpu.get("worker", 0.0) / (streams * size.rate_tokens), 2),
            **counts["machine"],
        })  # fmt: skip
        r = rounds[-1]
        log(f"rate {streams} x {size.rate}: in order {r['every_token_in_order']} rate seen/source "
            f"{r['rate_seen_over_source']} lag p99 {r['display_lag_ms'].get('p99')} ms (floor "
            f"{floor['display_lag_ms'].get('p99')}), worker {r['worker_cpu_pct_of_a_core']} % web "
            f"{r['web_cpu_pct_of_a_core']} % of a core, waited for a core (ms/s) {r['waited_for_a_core_ms_per_s']}, "
            f"load {loadavg()}")  # fmt: skip
    return {"rounds": rounds}


# --- part 6: the same rates through the OpenAI-compatible API ----------------------------------------------


async def api_stream(port: int, key: str, prompt: str, tokens: int) -> tuple[list[tuple[float, str]], str]:
    """One ``stream: true`` chat completion through RigDash's /v1/ on its own connection: each content chunk's
    arrival (time.time(), the source's clock) and text, and the error, if any."""
    body = {"model": "synthetic", "messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": tokens, "temperature": 0}  # fmt: skip
    chunks: list[tuple[float, str]] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=httpx.Timeout(600)) as client:
        headers = {"Authorization": f"Bearer {key}"}
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                return chunks, f"{response.status_code}: {(await response.aread())[:200]!r}"
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                text = (choices[0].get("delta") or {}).get("content") or ""
                if text:
                    chunks.append((time.time(), text))
    return chunks, ""


def token_arrivals(chunks: list[tuple[float, str]], tokens: list[str]) -> list[float] | None:
    """Each source token's arrival: the time of the chunk that completed it (RigDash coalesces tokens into batches,
    several to a chunk). None when the text differs from the source's."""
    if "".join(text for _, text in chunks) != "".join(tokens):
        return None
    arrivals, received, i = [], 0, 0
    ends = list(itertools.accumulate(len(token) for token in tokens))
    for arrived, text in chunks:
        received += len(text)
        while i < len(ends) and ends[i] <= received:
            arrivals.append(arrived)
            i += 1
    return arrivals


async def part_api(stack: BenchStack, prepared: dict[str, Any], size: Size) -> dict[str, Any]:
    """The GPU-class rates of part 5 read through ``/v1/chat/completions`` by an API client (each stream on a
    connection of its own): the rate each client sees against the source's, each token's lag, and RigDash's CPU
    (worker and web) per streamed token."""
    from inference.board import apikeys

    key = apikeys.api_key_create(owner=stack._user, name="bench").secret
    port = stack.ports[stack.web_names()[0]]
    rounds: list[dict[str, Any]] = []
    for streams in size.rate_streams:
        prompts = [f"[synthetic rate={size.rate} tokens={size.rate_tokens} ttft=20] api{streams}-{i}"
                   for i in range(streams)]  # fmt: skip
        floor = await direct_floor(stack.ports["synthetic"], [p + "-floor" for p in prompts], size.rate_tokens)
        emissions(stack.ports["synthetic"])
        cpu0, t0 = stack.cpu(), time.monotonic()
        results = await asyncio.gather(*(api_stream(port, key, p, size.rate_tokens) for p in prompts))
        wall, cpu1 = time.monotonic() - t0, stack.cpu()
        sources = emissions(stack.ports["synthetic"])
        seen = Seen()
        for prompt, (chunks, error) in zip(prompts, results, strict=True):
            seen.clients += 1
            source = sources.get(marker(prompt))
            arrivals = None if source is None or error else token_arrivals(chunks, [t for _, t in source["events"]])
            if arrivals is None or source is None:
                seen.failures.append(f"api {marker(prompt)}: error={error} chunks={len(chunks)}")
                continue
            seen.matched(arrivals, [t for t, _ in source["events"]])
        cpu = {name: cpu1.get(name, 0.0) - cpu0.get(name, 0.0) for name in cpu1}
        rigdash_s = cpu.get("worker", 0.0) + sum(cpu.get(name, 0.0) for name in stack.web_names())
        rounds.append({
            "streams": streams, "rate_per_stream": size.rate, "tokens_per_stream": size.rate_tokens,
            "seconds": round(wall, 2), **seen.summary(), "floor_direct": floor,
            "rigdash_cpu_pct_of_a_core": round(100 * rigdash_s / wall, 1),
            "rigdash_cpu_us_per_token": round(1e6 * rigdash_s / (streams * size.rate_tokens), 2),
            "source_cpu_pct_of_a_core": round(100 * cpu.get("synthetic", 0.0) / wall, 1),
        })  # fmt: skip
        r = rounds[-1]
        log(f"api {streams} x {size.rate}: in order {r['every_token_in_order']} rate seen/source "
            f"{r['rate_seen_over_source']} (floor {floor['rate_seen_over_source']}) lag p50/p99 "
            f"{r['display_lag_ms'].get('p50')}/{r['display_lag_ms'].get('p99')} ms (floor "
            f"{floor['display_lag_ms'].get('p50')}/{floor['display_lag_ms'].get('p99')}), RigDash "
            f"{r['rigdash_cpu_us_per_token']} us/token, load {loadavg()}")  # fmt: skip
    return {"rounds": rounds}


# --- running it ----------------------------------------------------------------------------------------------

PARTS = {"rigs": part_rigs, "viewers": part_viewers, "rate": part_rate, "api": part_api}


def stack_for(part: str, size: Size, args: argparse.Namespace, var: Path) -> BenchStack:
    common = {"var_dir": var, "llama": False, "database_url": args.database_url, "redis_url": args.redis_url,
              "flush_ms": args.flush_ms}  # fmt: skip
    if part == "rigs":
        return BenchStack(**common, synthetic_rigs=max(size.rig_counts), synthetic_busy_rate=50.0, sampler=False,
                          worker_concurrency=2)  # fmt: skip
    if part == "viewers":
        return BenchStack(**common, web_processes=2, worker_concurrency=max(16, size.viewer_turns))
    return BenchStack(**common, sampler=False, worker_concurrency=max(16, *size.rate_streams))


async def run_part(part: str, size: Size, args: argparse.Namespace) -> dict[str, Any]:
    var = ROOT / "var" / "bench" / f"scale-{part}-{int(time.time())}"
    stack = stack_for(part, size, args, var)
    log(f"--- {part}: starting a stack in {var}")
    stack.start(log=log)
    try:
        stack.django_setup()
        from django.contrib.auth import get_user_model

        if get_user_model().objects.exists():  # a database given again: its rows would be counted as this run's
            raise SystemExit(f"{args.database_url} already holds users: give the benchmark a fresh database")
        prepared = stack.prepare()
        python_pids = {role: pid for role, pid in stack.pids.items() if role != "redis"}
        profilers = profile.start(python_pids, var / "profile", rate=100) if args.profile else []
        try:
            result = await PARTS[part](stack, prepared, size)
        finally:
            if profilers:
                result_profile = profile.stop(profilers)
        if profilers:
            result["profile"] = result_profile
    finally:
        stack.stop()
    return {"part": part, "cpus": os.cpu_count(), "loadavg_after": loadavg(), **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=[*PARTS, "all"])
    parser.add_argument("--smoke", action="store_true", help="a tiny run of each figure (seconds, not minutes)")
    parser.add_argument("--database-url", help="e.g. postgres://... (rigs: the growth figure needs PostgreSQL)")
    parser.add_argument("--redis-url", help="default: a private redis-server")
    parser.add_argument("--flush-ms", type=int, help="the flush interval's ceiling (RIGDASH_FLUSH_INTERVAL_MS)")
    parser.add_argument("--profile", action="store_true", help="sample RigDash's processes with py-spy (pip install)")
    parser.add_argument("--out", type=Path, help="write the JSON here (default bench/results/scale-<part>-<time>.json)")
    args = parser.parse_args(argv)
    size = SMOKE if args.smoke else FULL
    out = args.out or RESULTS_DIR / f"scale-{args.part}-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.part == "all":  # each part in a process of its own: Django is set up once per process, on its stack
        results = {}
        for part in PARTS:
            part_out = out.with_name(f"{out.stem}-{part}.json")
            command = [PYTHON, "-m", "bench.scale", part, f"--out={part_out}", *(["--smoke"] if args.smoke else []),
                       *(["--profile"] if args.profile else []),
                       *([f"--flush-ms={args.flush_ms}"] if args.flush_ms else [])]  # fmt: skip
            for name in ("database_url", "redis_url"):
                if getattr(args, name):
                    command.append(f"--{name.replace('_', '-')}={getattr(args, name)}")
            if subprocess.run(command, cwd=ROOT, check=False).returncode != 0:
                log(f"the {part} part failed")
                return 1
            results.update(json.loads(part_out.read_text()))
    else:
        results = {args.part: asyncio.run(run_part(args.part, size, args))}
    out.write_text(json.dumps(results, indent=2))
    log(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
