"""Which models each rig serves, kept in Redis for a short while, so that a page listing the rigs and their models
(the chat list) does not ask every backend on every view.

The sampler stores each rig's list every ``REFRESH_S`` while it samples the rig (monitoring/sampler.py); a read of
the backend through ``inference.turns.sessions`` stores what it got too. A list lives ``TTL_S``: when no sampler
runs, or a rig was just added, the first page asks the backend and the next ones within ``TTL_S`` do not. A failed
read is not kept. Redis being down only means the backend is asked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from redis.exceptions import RedisError

from inference.backends.base import ModelInfo
from inference.live.state import sync_client

log = logging.getLogger(__name__)

T = TypeVar("T")
REFRESH_S = 20.0
TTL_S = 60


def served_key(rig_id: int) -> str:
    return f"rigdash:rig:{rig_id}:models"


def served_store(rig_id: int, models: Sequence[ModelInfo]) -> None:
    try:
        sync_client().set(served_key(rig_id), json.dumps([asdict(m) for m in models]), ex=TTL_S)
    except RedisError as exc:
        log.warning("rig %s: could not keep its model list: %s", rig_id, exc)


def served_get_many(rig_ids: Sequence[int]) -> dict[int, list[ModelInfo] | None]:
    """Each rig's kept list (one round trip), or None where there is none."""
    return _read_many(rig_ids, served_key, "model lists", lambda kept: [ModelInfo(**entry) for entry in kept])


def served_get(rig_id: int) -> list[ModelInfo] | None:
    return served_get_many([rig_id])[rig_id]


def served_forget(rig_id: int) -> None:
    """Drop the rig's kept list (a model was pulled or deleted): the next page asks the backend."""
    try:
        sync_client().delete(served_key(rig_id))
    except RedisError as exc:
        log.warning("rig %s: could not drop its kept model list: %s", rig_id, exc)


def loaded_key(rig_id: int) -> str:
    return f"rigdash:rig:{rig_id}:loaded"


def loaded_store(rig_id: int, names: Sequence[str] | None) -> None:
    """The models the rig's server holds in memory now (the sampler's, every sample); None: it cannot say."""
    try:
        if names is None:
            sync_client().delete(loaded_key(rig_id))
        else:
            sync_client().set(loaded_key(rig_id), json.dumps(sorted(names)), ex=TTL_S)
    except RedisError as exc:
        log.warning("rig %s: could not keep its loaded models: %s", rig_id, exc)


def loaded_get_many(rig_ids: Sequence[int]) -> dict[int, set[str] | None]:
    """Each rig's loaded models (one round trip), or None where unknown (no sampler, a server that cannot say)."""
    return _read_many(rig_ids, loaded_key, "loaded models", lambda kept: {str(name) for name in kept})


def _read_many(
    rig_ids: Sequence[int], key: Callable[[int], str], what: str, parse: Callable[[list[Any]], T]
) -> dict[int, T | None]:
    """Each rig's kept JSON list under ``key`` (one MGET), read by ``parse``; None where there is none, where it is
    not a list ``parse`` can read, or for every rig while Redis is away (the caller then does without)."""
    if not rig_ids:
        return {}
    try:
        raws = sync_client().mget([key(rig_id) for rig_id in rig_ids])
    except RedisError as exc:
        log.warning("could not read the rigs' %s: %s", what, exc)
        return dict.fromkeys(rig_ids)
    out: dict[int, T | None] = {}
    for rig_id, raw in zip(rig_ids, raws, strict=True):  # type: ignore[arg-type]
        try:
            kept = json.loads(raw) if raw else None
            out[rig_id] = parse(kept) if isinstance(kept, list) else None
        except (ValueError, TypeError):
            out[rig_id] = None
    return out
