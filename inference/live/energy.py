"""Each rig's running energy account in Redis, so that a turn can be told its energy per token.

The sampler adds, at every sample, the joules the rig's GPUs drew since the previous one (their power x the interval)
and the tokens the rig decoded meanwhile (its decode rate x the interval). A turn reads the account when it starts
and when it ends: the joules over the tokens between the two is the energy per decoded token on the rig while the
turn ran (every turn decoding then shares it). Where no GPU reports power, the account holds why instead.
docs/monitoring.md, "Several GPUs, unified memory, energy".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

MAX_INTERVAL_S = 10.0  # a longer gap between samples (the sampler was down) counts nothing: the power then is unknown
KEY_TTL_S = 7 * 86400


def energy_key(rig_id: int) -> str:
    return f"rigdash:rig:{rig_id}:energy"


def energy_add(
    client: redis.Redis, rig_id: int, *, watts: float | None, decode_tps: float, interval_s: float, why: str = ""
) -> None:
    """Add one sample's interval to the rig's account (the sampler's call); ``watts`` None: power not measurable."""
    key = energy_key(rig_id)
    with client.pipeline(transaction=False) as pipe:
        if watts is None:
            pipe.hset(key, "why", why or "no GPU reports its power draw")
        elif 0 < interval_s <= MAX_INTERVAL_S:
            pipe.hincrbyfloat(key, "joules", watts * interval_s)
            pipe.hincrbyfloat(key, "tokens", max(decode_tps, 0.0) * interval_s)
            pipe.hdel(key, "why")
        pipe.expire(key, KEY_TTL_S)
        pipe.execute()


@dataclass(frozen=True)
class EnergyMark:
    joules: float | None
    tokens: float | None
    why: str


async def energy_mark(client: aioredis.Redis, rig_id: int) -> EnergyMark:
    """The rig's account now (the worker's call, at a turn's start and end)."""
    joules, tokens, why = await client.hmget(energy_key(rig_id), ["joules", "tokens", "why"])  # type: ignore[misc]
    text = why.decode() if isinstance(why, bytes) else (why or "")
    return EnergyMark(joules=_float(joules), tokens=_float(tokens), why=text)


def _float(raw: bytes | str | None) -> float | None:
    return float(raw) if raw is not None else None


def turn_energy(start: EnergyMark, end: EnergyMark) -> dict[str, Any]:
    """The stats a turn stores: ``energy_j_per_token``, or ``energy_note`` saying why there is none."""
    if end.why:
        return {"energy_note": f"power not measurable: {end.why}"}
    if None in (start.joules, start.tokens, end.joules, end.tokens):
        return {"energy_note": "power not measured on this rig yet (the sampler has not read its GPUs)"}
    tokens = float(end.tokens or 0) - float(start.tokens or 0)
    joules = float(end.joules or 0) - float(start.joules or 0)
    if tokens < 1:
        return {"energy_note": "the sampler saw no decoding while this turn ran (a reply under a second)"}
    return {"energy_j_per_token": round(joules / tokens, 4), "energy_j": round(joules, 2)}
