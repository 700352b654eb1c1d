"""From raw results to headline figures and the table (pure: dicts in, dicts and rows out).

Two estimates are given for each RigDash-vs-direct figure:
- "paired": RigDash turns against separate direct reads of the same prompt (same seed, temperature 0),
  interleaved A/B; this is performance.md's definition, and it carries the machine's drift between runs.
- "same stream": RigDash's client against the direct reader of the very stream RigDash read (the tap
  between worker and llama-server, or the synthetic source's own emission times); drift cancels out.
"""

from __future__ import annotations

import math
from typing import Any

from bench import analyze, stats


def check_viewers(
    result: dict[str, Any], stored: dict[int, str], session_of: dict[int, int], viewers_of: dict[int, int]
) -> dict[str, Any]:
    """Did every viewer get every turn of its session, whole, once, in order, identical to the stored reply?"""
    expected = sum(viewers_of[session_of[t]] for t in stored)
    seen = turns_ok = 0
    problems = []
    for turn_id, sha in stored.items():
        entry = (result.get("turns") or {}).get(str(turn_id))
        want = viewers_of[session_of[turn_id]]
        if entry is None:
            problems.append(f"turn {turn_id}: no viewer saw it")
            continue
        seen += entry["clients"]
        good = (
            entry["clients"] == want
            and entry["ended"] == want
            and entry["gaps"] == 0
            and entry["duplicates"] == 0
            and entry["text_sha1"] == [sha]
        )
        turns_ok += good
        if not good:
            problems.append(
                f"turn {turn_id}: {entry['clients']}/{want} clients, {entry['ended']} ended, gaps {entry['gaps']}, "
                f"dups {entry['duplicates']}, {len(entry['text_sha1'])} distinct texts"
            )
    rates = [x for e in (result.get("turns") or {}).values() for x in e.get("rates", [])]
    return {
        "expected_deliveries": expected,
        "deliveries": seen,
        "turns_ok": turns_ok,
        "turns": len(stored),
        "problems": problems[:10],
        "viewer_decode_tps": stats.summarize(rates),
    }


def aggregate(results: dict[str, Any]) -> dict[str, Any]:
    """Headline figures per part, from the raw results."""
    idle = results.get("idle")
    agg: dict[str, Any] = {"idle": idle}
    l1 = results.get("level1")
    if l1 and l1["pairs"]:
        pairs = l1["pairs"]
        agg["level1"] = figures(
            [p["rigdash"] for p in pairs], [p["direct"] for p in pairs], [p["cost"] for p in pairs],
            [p["tokens"] for p in pairs], [t for p in pairs for t in p.get("longtasks", [])], idle,
        )  # fmt: skip
        agg["level1"]["long_growth"] = [
            p["rigdash"].get("display_lag_ms_growth") for p in pairs if p["max_tokens"] >= 1000
        ]
    lag = results.get("lag")
    if lag:
        turn = lag["turn"]
        agg["lag"] = {
            "rate": lag["rate"],
            "tokens": turn.get("tokens_delivered"),
            "display_lag_ms": turn.get("display_lag_ms_summary"),
            "growth": turn.get("display_lag_ms_growth"),
            "ws_lag_ms": turn.get("ws_lag_ms_summary"),
            "ws_growth": turn.get("ws_lag_ms_growth"),
            "delivered_ok": bool(turn.get("in_order") and turn.get("delivered_equals_stored")),
            "page_ok": turn.get("page_equals_stored"),
            "longtasks": lag.get("longtasks", []),
            **cost_figures([lag["cost"]], [lag["tokens"]], results.get("idle")),
        }
    for key in ("level2", "level3"):
        part = results.get(key)
        rounds = [r for r in (part or {}).get("rounds", []) if "rigdash" in r and "direct" in r]
        if not rounds:
            continue
        rd = [t for r in rounds for t in r["rigdash"]]
        a = figures(
            rd, [d for r in rounds for d in r["direct"]], [r["cost"] for r in rounds], [r["tokens"] for r in rounds],
            [t for r in rounds for t in r.get("longtasks", [])], idle,
        )  # fmt: skip
        a["independent_pairs"] = len(rounds)  # a round's turns share its moment: one unit for the sign test
        a["ttft_ms"] = stats.summarize([t["ttft_ms"] for t in rd if t.get("ttft_ms") is not None], 2)
        a["idle_with_sockets"] = part.get("idle") if part else None
        a["swarm"] = {
            "ready": (part or {}).get("swarm_ready"),
            "errors": ((part or {}).get("swarm") or {}).get("errors"),
            "frames_by_type": ((part or {}).get("swarm") or {}).get("frames_by_type") or {},
        }
        a["viewer_check"] = (part or {}).get("viewer_check")
        agg[key] = a
    render = results.get("render")
    if render:
        agg["render"] = {"flatness": render["flatness"], "longtasks": render["longtasks"], "chars": render["chars"]}
    return agg


RIGDASH_ROLES = ("web", "worker", "sampler")  # RigDash's own processes; the rest is the benchmark's or the backend's


def cost_figures(costs: list[dict[str, Any]], tokens: list[int], idle: dict[str, Any] | None) -> dict[str, Any]:
    """CPU (web, worker, and the rest) and Redis operations per token over the measured windows."""
    n_tokens = sum(tokens)
    cpu = {role: 0.0 for role in RIGDASH_ROLES}
    other: dict[str, float] = {}
    wall = 0.0
    redis_total: dict[str, int] = {}
    for cost in costs:
        wall += cost["wall_s"]
        for k, v in cost["cpu_s"].items():
            if k in cpu:
                cpu[k] += v
            else:
                other[k] = other.get(k, 0.0) + v
        for cmd, calls in cost["redis"].items():
            redis_total[cmd] = redis_total.get(cmd, 0) + calls
    idle_cpu = sum(v for k, v in ((idle or {}).get("cpu_s_per_s") or {}).items() if k in RIGDASH_ROLES) * wall
    idle_redis = (idle or {}).get("redis_ops_per_s", 0.0) * wall
    redis_ops = sum(redis_total.values())
    return {
        "cpu_us_per_token": None
        if not n_tokens
        else {
            **{role: 1e6 * seconds / n_tokens for role, seconds in cpu.items()},
            "total": 1e6 * sum(cpu.values()) / n_tokens,
            "net_of_idle": 1e6 * (sum(cpu.values()) - idle_cpu) / n_tokens,
        },
        "other_cpu_us_per_token": {k: 1e6 * v / n_tokens for k, v in sorted(other.items())} if n_tokens else {},
        "redis_ops_per_token": None if not n_tokens else redis_ops / n_tokens,
        "redis_ops_per_token_net_of_idle": None if not n_tokens else (redis_ops - idle_redis) / n_tokens,
        "redis_commands": redis_total,
        "window_s": wall,
        "tokens": n_tokens,
    }


def figures(
    rd: list[dict[str, Any]], direct: list[dict[str, Any]], costs: list[dict[str, Any]], tokens: list[int],
    longtasks: list[dict[str, Any]], idle: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """Figures for a set of RigDash turns and their paired direct reads (same order)."""
    pairs = [(r, d) for r, d in zip(rd, direct, strict=True) if r.get("ttft_ms") is not None and not d.get("error")]
    paired = analyze.pair_ratios([r for r, _ in pairs], [d for _, d in pairs])
    parts = [r["ttft_parts_ms"] for r in rd if r.get("ttft_parts_ms")]
    delivered = sum(r.get("tokens_delivered", 0) for r in rd)
    backend = sum(r.get("tokens_backend", 0) for r in rd)
    return {
        "pairs": len(pairs),
        "turns": len(rd),
        "decode_ratio_paired": stats.summarize(paired["decode"], 4),
        "decode_ratio_same_stream": stats.summarize(
            [r["decode_ratio_vs_ref"] for r in rd if r.get("decode_ratio_vs_ref") is not None], 4
        ),
        "backend_ratio_paired": stats.summarize(paired["backend"], 4),
        "backend_ratios_paired": [round(x, 4) for x in paired["backend"]],  # each pair's, for the sign test
        "added_ttft_ms_paired": stats.summarize(paired["added_ttft_ms"], 2),
        "added_ttft_ms_same_stream": stats.summarize([p["to_backend"] + p["to_client"] for p in parts], 2),
        "ttft_parts_ms_p50": {
            k: stats.median(p.get(k) for p in parts)
            for k in ("to_backend", "backend", "to_client", "submit", "stored_to_request", "claim_from_request")
        }
        if parts
        else None,
        "display_lag_ms": stats.summarize([x for r in rd for x in r.get("display_lag_ms", [])], 2),
        "ws_lag_ms": stats.summarize([x for r in rd for x in r.get("ws_lag_ms", [])], 2),
        "delivered": {
            "tokens_backend": backend,
            "tokens_delivered": delivered,
            "pct": 100 * delivered / backend if backend else None,
            "in_order": all(r.get("in_order") for r in rd),
            "identical_to_stored": all(r.get("delivered_equals_stored") and r.get("stored_equals_backend") for r in rd),
            "page_identical": [r["page_equals_stored"] for r in rd if r.get("page_equals_stored") is not None],
            "watchers_identical": all(r.get("watchers_identical_in_order", True) for r in rd),
            "direct_text_identical": [
                d["text_equals_stored"] for d in direct if d.get("text_equals_stored") is not None
            ],
            "direct_errors": [d["error"] for d in direct if d.get("error")],
            "errors": [r["error"] for r in rd if r.get("error")],
        },
        **cost_figures(costs, tokens, idle),
        "steal_pct": steal_figures(costs, direct),
        "llama_wait_ms_per_s": both_sides(costs, direct, "llama_wait_ms_per_s", digits=1),
        "longtasks": {"count": len(longtasks), "max_ms": max((t["duration"] for t in longtasks), default=0.0)},
    }


def steal_figures(costs: list[dict[str, Any]], direct: list[dict[str, Any]]) -> dict[str, Any]:
    """The share of the machine's CPU the hypervisor took (steal, %), in RigDash's windows and in the direct reads.

    A VM whose host is busy elsewhere loses CPU time it never sees as its own; when that share differs between
    the two sides of a pair, the paired ratios measure the host, not RigDash. (Results from before 2026-12-03
    have no steal figures.)"""
    return both_sides(costs, direct, "steal_share", scale=100, digits=3)


def both_sides(
    costs: list[dict[str, Any]], direct: list[dict[str, Any]], key: str, *, scale: float = 1.0, digits: int
) -> dict[str, Any]:
    """``key`` summarized over RigDash's windows (``costs``) and over the paired direct reads, each value times
    ``scale``; windows without it (results from before the figure existed) are left out."""

    def summary(items: list[dict[str, Any]]) -> dict[str, Any]:
        return stats.summarize([scale * x[key] for x in items if x.get(key) is not None], digits)

    return {"rigdash": summary(costs), "direct": summary(direct)}


SIGN_PAIRS = 6  # the fewest pairs that can give a scattered set a verdict: all six on one side, 1 chance in 64
SIGN_P = 0.5**SIGN_PAIRS  # the sign test's level: that chance, for any number of pairs


def sign_test_p(k: int, n: int) -> float:
    """The chance that k or more of n pairs fall on one side of the target if RigDash's cost were the target's
    (each pair then as likely above as below): the one-sided binomial tail."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / (1 << n)


def paired_verdict(
    backend: dict[str, Any], target: float, independent: int | None = None, ratios: list[float] | None = None
) -> tuple[bool, str]:
    """Whether the paired rows get no verdict (the machine drifted), and the tag that says why.

    Paired runs mean something when the backend's speed ratio held steady from pair to pair: a steady ratio below 1
    is RigDash's own cost, a scattered one (max over 1.25 x min) may be the machine drifting between runs. A scatter
    still gives a verdict when a sign test says the pairs fall on one side of the target more often than drift
    would put them there (at most SIGN_P, the chance of six pairs of six): the pairs alternate which side runs
    first, so drift alone would put them on both sides as often. ``independent``: how many of the pairs are
    independent of one another (levels 2 and 3 run a round's turns at once: a round counts once; then only all
    pairs on one side count, one unit a round); default, all. ``ratios``: each pair's ratio (older results have
    only the summary, and then only all pairs on one side count)."""
    n = backend["n"] or 0
    if n >= 2 and backend["max"] <= 1.25 * backend["min"]:
        return False, ""
    units = n if independent is None else min(n, independent)
    if n and (backend["max"] < target or backend["min"] >= target):
        side = "below" if backend["max"] < target else "at or above"
        if units >= SIGN_PAIRS:
            return False, f" [scattered, but all {n} pairs {side} {target}]"
    elif ratios and len(ratios) == n and units == n:
        below = sum(r < target for r in ratios)
        k, side = max((below, "below"), (n - below, "at or above"))
        if (p := sign_test_p(k, n)) <= SIGN_P:
            return False, f" [scattered, but {k} of {n} pairs {side} {target}: sign test p = {p:.3f}]"
    return True, " [machine drift: no verdict]"


def _ge(x: float | None, limit: float) -> bool | None:
    return None if x is None else x >= limit


def _le(x: float | None, limit: float) -> bool | None:
    return None if x is None else x <= limit


def _pp(s: dict[str, Any], digits: int = 1) -> str:
    return f"{stats.fmt(s['p50'], digits)} / {stats.fmt(s['p99'], digits)} (n={s['n']})"


def _lag_ok(s: dict[str, Any]) -> bool | None:
    return None if not s["n"] else s["p50"] <= 20 and s["p99"] <= 50


def grows(g: dict[str, Any] | None, *, tolerance_ms: float = 5.0) -> bool | None:
    """True when the last tenth of a reply's lags sits more than ``tolerance_ms`` above the first tenth."""
    if not g or g.get("first_tenth_p50") is None:
        return None
    return bool(g["last_tenth_p50"] - g["first_tenth_p50"] > tolerance_ms)


def _cost_rows(add: Any, label: str, a: dict[str, Any]) -> None:
    cpu = a["cpu_us_per_token"] or {}
    add(label, "server CPU per token, web + worker + sampler (us; net of idle)",
        f"{stats.fmt(cpu.get('total'), 0)} (web {stats.fmt(cpu.get('web'), 0)}, worker "
        f"{stats.fmt(cpu.get('worker'), 0)}, sampler {stats.fmt(cpu.get('sampler'), 0)}; "
        f"net {stats.fmt(cpu.get('net_of_idle'), 0)})",
        "report; aim <= 100", _le(cpu.get("total"), 100))  # fmt: skip
    other = a.get("other_cpu_us_per_token") or {}
    if other:
        add(label, "  CPU per token elsewhere (us): " + ", ".join(other),
            ", ".join(stats.fmt(v, 0) for v in other.values()), "", None)  # fmt: skip
    add(label, "Redis operations per token (net of idle)",
        f"{stats.fmt(a['redis_ops_per_token'], 2)} ({stats.fmt(a['redis_ops_per_token_net_of_idle'], 2)})",
        "report; aim <= 0.3", _le(a["redis_ops_per_token"], 0.3))  # fmt: skip


def _both_sides_row(add: Any, label: str, figure: str, sides: dict[str, Any] | None, digits: int) -> None:
    """A reported row of ``both_sides``' two summaries, "p50; max / p50; max"; none for results without them."""
    r, d = (sides or {}).get("rigdash") or {}, (sides or {}).get("direct") or {}
    if not (r.get("n") or d.get("n")):
        return
    add(label, f"{figure}: RigDash / direct (p50; max)",
        f"{stats.fmt(r.get('p50'), digits)}; {stats.fmt(r.get('max'), digits)} / "
        f"{stats.fmt(d.get('p50'), digits)}; {stats.fmt(d.get('max'), digits)}", "(reported)", None)  # fmt: skip


def table_rows(agg: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []

    def add(part: str, figure: str, value: str, target: str, ok: bool | None) -> None:
        rows.append([part, figure, value, target, stats.verdict(ok)])

    parts = (("level1", "1 session"), ("level2", "2: 4 slots, 258 sockets"), ("level3", "3: 16x100 tok/s, 200 viewers"))
    for key, label in parts:
        a = agg.get(key)
        if not a:
            continue
        rmin, bmin = (0.97, 0.97) if key == "level3" else (0.99, 0.98)
        d, s, b = a["decode_ratio_paired"], a["decode_ratio_same_stream"], a["backend_ratio_paired"]
        drift, tag = paired_verdict(b, bmin, a.get("independent_pairs"), a.get("backend_ratios_paired"))
        add(label, "decode tok/s, RigDash client / direct: paired runs (median; min)",
            f"{stats.fmt(d['p50'], 3)} ({stats.fmt(d['min'], 3)}; n={d['n']}){tag}", f">= {rmin}",
            None if drift else _ge(d["p50"], rmin))  # fmt: skip
        add(
            label,
            "decode tok/s, RigDash client / direct: same stream (median; min)",
            f"{stats.fmt(s['p50'], 4)} ({stats.fmt(s['min'], 4)})",
            f">= {rmin}",
            _ge(s["p50"], rmin),
        )
        add(label, "backend's own tok/s with RigDash / without: paired (median; min..max)",
            f"{stats.fmt(b['p50'], 3)} ({stats.fmt(b['min'], 3)}..{stats.fmt(b['max'], 3)}){tag}", f">= {bmin}",
            None if drift else _ge(b["p50"], bmin))  # fmt: skip
        _both_sides_row(add, label, "  CPU the hypervisor took (steal, % of the machine)", a.get("steal_pct"), 2)
        if key != "level3":  # level 3 reads the synthetic source, not llama-server
            _both_sides_row(
                add, label, "  llama-server's threads waiting for a core (ms/s)", a.get("llama_wait_ms_per_s"), 1
            )
        tp, ts = a["added_ttft_ms_paired"], a["added_ttft_ms_same_stream"]
        if key == "level3":
            t = a["ttft_ms"]
            add(label, "TTFT through RigDash p50 / p99 (ms)", _pp(t), "p99 <= 150", _le(t["p99"], 150))
            add(label, "TTFT added: same stream p50 / p99 (ms)", _pp(ts), "(reported)", None)
        else:
            for name, t in (("paired", tp), ("same stream", ts)):
                ok = None if not t["n"] or (drift and name == "paired") else t["p50"] <= 15 and t["p99"] <= 50
                text = _pp(t) + (tag if name == "paired" and drift else "")
                add(label, f"TTFT added by RigDash: {name} p50 / p99 (ms)", text, "p50 <= 15, p99 <= 50", ok)
        if a.get("ttft_parts_ms_p50"):
            p = a["ttft_parts_ms_p50"]
            add(label, "  RigDash TTFT = send->backend request + backend + first token->client (p50 ms)",
                f"{stats.fmt(p['to_backend'], 1)} + {stats.fmt(p['backend'], 1)} + {stats.fmt(p['to_client'], 1)}",
                "", None)  # fmt: skip
            claim = "-" if p["claim_from_request"] is None else f"{p['claim_from_request']:+.1f}"
            add(label, "  send->backend request = web stores turn + stored->request (p50 ms); claim, from request",
                f"{stats.fmt(p['submit'], 1)} + {stats.fmt(p['stored_to_request'], 1)}; {claim}", "", None)  # fmt: skip
        if a["display_lag_ms"]["n"]:
            growth = [g for g in a.get("long_growth") or [] if g]
            ok = _lag_ok(a["display_lag_ms"])
            extra = ""
            if growth:
                extra = "; 2,000-token: " + ", ".join(f"{g['first_tenth_p50']}->{g['last_tenth_p50']}" for g in growth)
                ok = ok and not any(grows(g) for g in growth)
            add(label, "display lag, painted in Chromium - direct reader (p50 / p99 ms)",
                _pp(a["display_lag_ms"]) + extra, "p50 <= 20, p99 <= 50", ok)  # fmt: skip
        add(label, "websocket tab lag behind direct reader (p50 / p99 ms)", _pp(a["ws_lag_ms"]), "(reported)", None)
        dv = a["delivered"]
        ok = bool(
            dv["pct"] == 100 and dv["in_order"] and dv["identical_to_stored"] and all(dv["page_identical"])
            and dv["watchers_identical"] and not dv["errors"]
        )  # fmt: skip
        extra = ""
        vc = a.get("viewer_check")
        if vc:
            ok = ok and vc["turns_ok"] == vc["turns"] and vc["deliveries"] == vc["expected_deliveries"]
            extra += f"; viewers got {vc['deliveries']}/{vc['expected_deliveries']} (turn, viewer) replies whole"
        if dv["direct_text_identical"]:
            extra += f"; direct text = stored {sum(dv['direct_text_identical'])}/{len(dv['direct_text_identical'])}"
        if dv["direct_errors"]:
            extra += f"; {len(dv['direct_errors'])} direct read(s) failed: {dv['direct_errors'][0]}"
        add(label, "tokens delivered, in order, identical to the stored reply",
            f"{stats.fmt(dv['pct'], 1)} % of {dv['tokens_backend']}, in order {dv['in_order']}, "
            f"identical {dv['identical_to_stored']}{extra}", "100 %, in order, identical", ok)  # fmt: skip
        _cost_rows(add, label, a)
        if key != "level3":
            lt = a["longtasks"]
            add(label, "browser long tasks while streaming (count; longest ms)",
                f"{lt['count']}; {stats.fmt(lt['max_ms'], 0)}", "none over 50 ms", lt["count"] == 0)  # fmt: skip
        samples = (a.get("swarm") or {}).get("frames_by_type", {}).get("rig.sample")
        if key == "level2" and samples is not None:
            add(label, "dashboard viewers: rig.sample frames received (monitoring socket, from the sampler)",
                f"{samples}; errors {a['swarm'].get('errors') or 'none'}", "(reported)", None)  # fmt: skip
        idle = a.get("idle_with_sockets")
        if idle:
            add(label, f"idle RigDash CPU with {a['swarm']['ready']} sockets open",
                f"{idle['cpu_pct_of_core']:.2f} % of a core", "<= 2 %", idle["cpu_pct_of_core"] <= 2)  # fmt: skip
        if key == "level1" and agg.get("idle"):
            idle = agg["idle"]
            add(label, "idle RigDash CPU, one tab open", f"{idle['cpu_pct_of_core']:.2f} % of a core; "
                f"{idle['redis_ops_per_s']:.1f} Redis ops/s", "<= 2 %", idle["cpu_pct_of_core"] <= 2)  # fmt: skip
    lag = agg.get("lag")
    if lag and lag.get("display_lag_ms"):
        g = lag["growth"] or {}
        label = f"2,000-token reply, {lag['rate']} tok/s"
        ok = _lag_ok(lag["display_lag_ms"])
        add(label, "display lag, painted in Chromium - source (p50 / p99 ms)", _pp(lag["display_lag_ms"]),
            "p50 <= 20, p99 <= 50", ok)  # fmt: skip
        add(label, "display lag growth: first tenth -> last tenth p50 (ms); slope per 1,000 tokens",
            f"{g.get('first_tenth_p50')} -> {g.get('last_tenth_p50')}; {g.get('slope_per_1000')}",
            "no growth (<= +5 ms)", None if grows(g) is None else not grows(g))  # fmt: skip
        add(label, "tokens delivered whole and in order; page text = stored",
            f"{lag['tokens']} tokens, {lag['delivered_ok']}, {lag['page_ok']}", "100 %", bool(lag["delivered_ok"]
            and lag["page_ok"]))  # fmt: skip
        if lag.get("cpu_us_per_token"):  # one long reply: the cost per token with per-turn costs spread thin
            _cost_rows(add, label, lag)
    render = agg.get("render")
    if render:
        f = render["flatness"]
        p50s = [b["p50_ms"] for b in f["bins"]]
        flat = None
        if p50s and None not in p50s:
            flat = max(p50s) <= max(2 * p50s[0], p50s[0] + 2)
        add("render to 30,000 chars", "JS render ms per flush, p50 by fifth of the reply",
            " / ".join(stats.fmt(x, 2) for x in p50s) + f" ({f['flushes']} flushes)", "flat", flat)  # fmt: skip
        frames = [b.get("frame_p50_ms") for b in f["bins"]]
        frame_flat = None
        if frames and None not in frames:
            frame_flat = max(frames) <= max(2 * frames[0], frames[0] + 4)
        add("render to 30,000 chars", "flush -> painted (layout, paint) ms, p50 by fifth of the reply",
            " / ".join(stats.fmt(x, 1) for x in frames), "flat", frame_flat)  # fmt: skip
        lt = render["longtasks"]
        add("render to 30,000 chars", "browser long tasks (count; longest ms)",
            f"{len(lt)}; {stats.fmt(max((t['duration'] for t in lt), default=0.0), 0)}", "none over 50 ms",
            not lt)  # fmt: skip
    return rows


def _flush(meta: dict[str, Any]) -> str:
    """The flush interval: alone -> ceiling (results before 2026-11-30 02:30 UTC had one fixed interval)."""
    low, high = meta.get("flush_min_interval_ms", meta["flush_interval_ms"]), meta["flush_interval_ms"]
    return str(high) if low == high else f"{low}-{high}"


def _split_holds(meta: dict[str, Any]) -> str:
    """Under the split, whether it held whatever streamed, or lifted while several replies did (and how often)."""
    holds = meta.get("cpu_split_holds")
    if not meta.get("cpu_split") or holds is None:
        return ""  # no split, or JSON from before 2026-12-03 21:30 (the split always held then)
    if holds == "always":
        return "; the split holds whatever streams (RIGDASH_DECODE_CPUS_HOLD=always)"
    return (
        "; RigDash's processes on every CPU while several replies stream"
        f" ({meta.get('cpu_share_moves', 0)} moves, one way or the other)"
    )


def _sampling(meta: dict[str, Any]) -> str:
    """The sampler's pace (results before 2026-11-30 06:00 UTC sampled every second, idle or not)."""
    if "sample_idle_interval_s" not in meta:
        return ""
    return f", sampling {meta['sample_interval_s']:g} s (idle {meta['sample_idle_interval_s']:g} s)"


def header(meta: dict[str, Any]) -> str:
    return (
        f"RigDash streaming benchmark ({meta['mode']}), {meta['started']}, {meta['nproc']} x {meta['cpu_model']}, "
        f"model {meta['model']}, flush {_flush(meta)} ms{_sampling(meta)}, git {meta['git']}\n"
        f"machine busy {meta['machine_busy_cores']} cores on average, of which this benchmark (RigDash, llama-server,"
        f" Chromium, clients) {meta['benchmark_busy_cores']} and other processes {meta['other_busy_cores']}; "
        f"load average {meta['loadavg_before'][0]:.2f} -> {meta['loadavg_after'][0]:.2f}"
        + (
            f"; the hypervisor took {meta['steal_pct_of_machine']} % of the machine's CPU (steal)"
            if meta.get("steal_pct_of_machine") is not None
            else ""
        )
        + (f"\nCPUs (RIGDASH_DECODE_CPUS): {meta['cpu_split']}" if meta.get("cpu_split") else "")
        + (f"; Chromium on CPU {meta['chromium_cpus']}" if meta.get("cpu_split") and meta.get("chromium_cpus") else "")
        + _split_holds(meta)
        + (f"\nskipped (time budget): {'; '.join(meta['skipped'])}" if meta.get("skipped") else "")
    )
