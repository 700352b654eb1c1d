"""Chat sessions and their turns, shaped like the runner's: reply and stats as ``StreamMeter.final_stats``
(inference/worker/pace.py) writes them, with llama.cpp's timings; tokens for usage and quotas; times for the board
and usage."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from monitoring.datagen.pools import Pools
from monitoring.datagen.timeline import Timeline

TURN_COLUMNS = (
    "id", "session_id", "user_text", "params", "reply_text", "status", "finish_reason", "error", "cancel_requested",
    "stats", "worker", "dispatched_at", "token_cap", "prompt_tokens", "output_tokens", "created_at", "started_at",
    "heartbeat_at", "finished_at", "rig_id",
)  # fmt: skip
SESSION_COLUMNS = ("id", "owner_id", "rig_id", "model_name", "title", "created_at", "updated_at", "context_messages")
TOKEN_CAP = 1024
CONTEXT_LIMIT = 8192
CHARS_PER_TOKEN = 4
OUTCOMES = (("done", 0.94), ("cancelled", 0.97), ("failed", 0.99), ("interrupted", 1.0))


@dataclass(frozen=True)
class RigShape:
    id: int
    name: str
    model: str
    tps: float  # decode tokens/s of one stream
    pool: int  # index into Pools.gaps


@dataclass
class TurnPlan:
    """Inputs of the generation; ``sessions`` collects the session rows as turns are made."""

    rng: random.Random
    pools: Pools
    timeline: Timeline
    users: list[int]
    user_weights: list[float]  # cumulative
    rigs: list[RigShape]
    next_turn_id: int
    next_session_id: int
    sessions: list[tuple[Any, ...]] = field(default_factory=list)
    long_chat: tuple[int, int] | None = None  # (session id, turns) of the chat the benchmark reads


def _outcome(rng: random.Random) -> str:
    draw = rng.random()
    return next(name for name, edge in OUTCOMES if draw < edge)


def _stats(plan: TurnPlan, rig: RigShape, *, prompt: int, cached: int, out: int, tps: float) -> dict[str, Any]:
    prompt_n = max(1, prompt - cached)
    prompt_ms = round(prompt_n / (tps * 25) * 1000, 2)
    ttft = round(prompt_ms + plan.rng.uniform(3, 12), 2)
    decode_ms = round((out - 1) * 1000 / tps, 2) if out > 1 else 0.0
    return {
        "ttft_ms": ttft,
        "decode_tps": round(tps * plan.rng.uniform(0.97, 1.0), 2),
        "output_events": out,
        "output_tokens": out,
        "inter_token_gaps_ms": None,  # spliced in from the pool (see _stats_json)
        "e2e_ms": round(ttft + decode_ms, 2),
        "prompt_tokens": prompt,
        "prompt_ms": prompt_ms,
        "cached_tokens": cached,
        "backend_decode_tps": round(tps, 2),
        "backend_timings": {
            "cache_n": cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3),
            "prompt_per_second": round(tps * 25, 2),
            "predicted_n": out,
            "predicted_ms": decode_ms,
            "predicted_per_token_ms": round(1000 / tps, 3),
            "predicted_per_second": round(tps, 2),
        },
        "context_tokens": prompt + out,
        "context_limit": CONTEXT_LIMIT,
    }


def _stats_json(plan: TurnPlan, rig: RigShape, stats: dict[str, Any]) -> str:
    gaps = plan.rng.choice(plan.pools.gaps[rig.pool]).first(stats["output_tokens"] - 1)
    return json.dumps(stats).replace('"inter_token_gaps_ms": null', f'"inter_token_gaps_ms": {gaps}', 1)


def _turn(plan: TurnPlan, session_id: int, rig: RigShape, t: datetime, context: int) -> tuple[tuple[Any, ...], int]:
    """One finished turn submitted at ``t`` after ``context`` tokens of history: its row and its tokens."""
    rng = plan.rng
    question = rng.choice(plan.pools.questions)
    prompt = min(CONTEXT_LIMIT - TOKEN_CAP, context + len(question) // CHARS_PER_TOKEN + 24)
    status = _outcome(rng)
    out = min(TOKEN_CAP, max(2, int(rng.lognormvariate(5.4, 0.8))))
    finish = "length" if out == TOKEN_CAP else "stop"
    error = ""
    if status == "cancelled":
        out, finish = max(2, int(out * rng.random())), "cancelled"
    elif status == "interrupted":
        out, finish, error = (
            max(2, int(out * rng.random())),
            "interrupted",
            "The worker stopped; what was written is kept.",
        )
    elif status == "failed":
        out, finish, error = 0, "", "The backend sent nothing for 30 s while waiting for the next token."
    tps = rig.tps * rng.lognormvariate(0.0, 0.1)
    stats = _stats(plan, rig, prompt=prompt, cached=min(context, prompt - 1), out=max(out, 1), tps=tps)
    wait = rng.expovariate(1 / 20) if rng.random() < 0.1 else rng.uniform(0.005, 0.05)
    dispatched = t + timedelta(seconds=wait)
    started = dispatched + timedelta(milliseconds=rng.uniform(2, 15))
    finished = started + timedelta(milliseconds=stats["e2e_ms"])
    row = (
        plan.next_turn_id, session_id, question, "{}" if rng.random() < 0.8 else '{"temperature": 0.7}',
        rng.choice(plan.pools.replies)[: out * CHARS_PER_TOKEN], status, finish, error, status == "cancelled",
        "{}" if status == "failed" else _stats_json(plan, rig, stats), f"celery@{rig.name}",
        dispatched, TOKEN_CAP, prompt if out else None, out if out else None, t, started, finished, finished, rig.id,
    )  # fmt: skip
    plan.next_turn_id += 1
    return row, prompt + out


def session_turns(
    plan: TurnPlan, *, owner: int, rig: RigShape, start: datetime, count: int
) -> Iterator[tuple[Any, ...]]:
    """The turns of one session, one after another with a person's pauses between them; the session's row is
    added to ``plan.sessions`` once its last turn is made."""
    session_id = plan.next_session_id
    plan.next_session_id += 1
    t, context, last, made = start, 0, start, 0
    limit = plan.timeline.now - timedelta(minutes=2)
    title = ""
    for _ in range(count):
        if t >= limit:
            break
        row, context = _turn(plan, session_id, rig, t, context)
        title = title or row[2][:80]
        made += 1
        last = row[-2]  # finished_at
        yield row
        t = last + timedelta(seconds=plan.rng.expovariate(1 / 90))
    if made:
        plan.sessions.append((session_id, owner, rig.id, rig.model, title, start, last, "[]"))


def all_turns(plan: TurnPlan, *, total: int, long_chat: int) -> Iterator[tuple[Any, ...]]:
    """``total`` turns: the benchmark's long chat (the heaviest user's, ending a day ago), then sessions drawn
    across the year (people by a Zipf weight, mostly on their usual rig, 1-150 turns each)."""
    rng = plan.rng
    made = 0
    if long_chat:
        start = plan.timeline.now - timedelta(days=1, hours=long_chat * 0.03)
        plan.long_chat = (plan.next_session_id, long_chat)
        for row in session_turns(plan, owner=plan.users[0], rig=plan.rigs[0], start=start, count=long_chat):
            made += 1
            yield row
    while made < total:
        user_index = rng.choices(range(len(plan.users)), cum_weights=plan.user_weights)[0]
        rig = plan.rigs[user_index % len(plan.rigs)] if rng.random() < 0.7 else rng.choice(plan.rigs)
        count = min(150, total - made, 1 + int(rng.lognormvariate(0.9, 1.0)))
        start = plan.timeline.draw(rng)
        for row in session_turns(plan, owner=plan.users[user_index], rig=rig, start=start, count=count):
            made += 1
            yield row


def active_turns(plan: TurnPlan, *, count: int) -> Iterator[tuple[Any, ...]]:
    """Turns running or waiting now, each in a session of its own: what the board shows at the top."""
    rng = plan.rng
    now = plan.timeline.now
    for i in range(count):
        rig = plan.rigs[i % len(plan.rigs)]
        owner = plan.users[(i * 7) % len(plan.users)]
        session_id = plan.next_session_id
        plan.next_session_id += 1
        status = ("decoding", "prompt", "queued")[i % 3]
        created = now - timedelta(seconds=rng.uniform(1, 40))
        started = created + timedelta(seconds=0.05) if status != "queued" else None
        question = rng.choice(plan.pools.questions)
        yield (
            plan.next_turn_id, session_id, question, "{}", "", status, "", "", False, "{}",
            f"celery@{rig.name}" if started else "", started, TOKEN_CAP, None, None, created, started, started, None,
            rig.id,
        )  # fmt: skip
        plan.next_turn_id += 1
        plan.sessions.append((session_id, owner, rig.id, rig.model, question[:80], created, created, "[]"))
