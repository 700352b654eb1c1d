"""Audit rows of admin actions across the year, in the proportions admins act (cancels most)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from monitoring.datagen.timeline import Timeline

AUDIT_COLUMNS = ("actor_id", "actor_name", "action", "target", "detail", "created_at")
ACTIONS = (
    ("turn.cancel", 50), ("model.pull", 10), ("model.unload", 7), ("model.delete", 3), ("user.create", 5),
    ("user.deactivate", 3), ("user.groups", 5), ("user.promote", 3), ("quota.update", 10), ("quota.create", 4),
)  # fmt: skip


def audit_rows(
    rng: random.Random, timeline: Timeline, *, count: int, admins: list[tuple[int, str]], users: list[str]
) -> Iterator[tuple[Any, ...]]:
    names = [name for name, _ in ACTIONS]
    weights = [weight for _, weight in ACTIONS]
    for _ in range(count):
        action = rng.choices(names, weights=weights)[0]
        actor_id, actor_name = rng.choice(admins)
        detail: dict[str, Any]
        if action == "turn.cancel":
            target, detail = f"turn:{rng.randint(1, 10**6)}", {"status": "decoding"}
        elif action.startswith("model."):
            target, detail = f"rig:{rng.randint(1, 20)}", {"model": "qwen2.5-7b-instruct-q4_k_m"}
        elif action.startswith("quota."):
            target = f"quota for user {rng.choice(users)}"
            detail = {"before": {"max_output_tokens_per_day": 100000}, "after": {"max_output_tokens_per_day": 200000}}
        else:
            target, detail = f"user:{rng.choice(users)}", {}
        yield actor_id, actor_name, action, target, json.dumps(detail), timeline.draw(rng)
