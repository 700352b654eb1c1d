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
from collections.abc import Sequence
from dataclasses import asdict

from redis.exceptions import RedisError

from inference.backends.base import ModelInfo
from inference.live.state import sync_client

log = logging.getLogger(__name__)

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
    if not rig_ids:
        return {}
    try:
        raws = sync_client().mget([served_key(rig_id) for rig_id in rig_ids])
    except RedisError as exc:
        log.warning("could not read the rigs' model lists: %s", exc)
        return dict.fromkeys(rig_ids)
    out: dict[int, list[ModelInfo] | None] = {}
    for rig_id, raw in zip(rig_ids, raws, strict=True):  # type: ignore[arg-type]
        try:
            out[rig_id] = [ModelInfo(**entry) for entry in json.loads(raw)] if raw else None
        except (ValueError, TypeError):
            out[rig_id] = None
    return out


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
    if not rig_ids:
        return {}
    try:
        raws = sync_client().mget([loaded_key(rig_id) for rig_id in rig_ids])
    except RedisError as exc:
        log.warning("could not read the rigs' loaded models: %s", exc)
        return dict.fromkeys(rig_ids)
    out: dict[int, set[str] | None] = {}
    for rig_id, raw in zip(rig_ids, raws, strict=True):  # type: ignore[arg-type]
        try:
            names = json.loads(raw) if raw else None
            out[rig_id] = {str(name) for name in names} if isinstance(names, list) else None
        except ValueError:
            out[rig_id] = None
    return out
