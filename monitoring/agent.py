"""The rig agent: runs on a rig's host, samples that host and its backend, and publishes through Redis.

``manage.py rigdash_agent --rig NAME`` (RIGDASH_AGENT_KEY in its environment) starts it beside a backend; it also
starts a Celery worker for the rig's queue, so the turns and model pulls of that rig run on its host. Every tick
it takes a sample as the central sampler would on the rig's own host (psutil, NVML per GPU and per backend process,
the backend's process found by its port, the GGUF header at the path the backend reports) and stores it with a
heartbeat, signed with the rig's key (inference/live/agents.py). The central sampler adds RigDash's queue and turns,
stores and publishes it (monitoring/sampler.py); it reads no host figure itself for a rig with an agent.

``rigdash_agent --rig-id ID --no-worker`` with RIGDASH_AGENT_ONLY=1 is the database-free agent: it holds its rig's id,
its rig's key and a Redis URL (whose user may be limited to its rig's keys), and builds its sampler from the record
the central sampler keeps for its rig in Redis (``agents.config_read``: signed, dated, the backend key sealed), read
again every ``agents.CONFIG_EVERY_S``. A worker runs turns, which need the database: a host that runs them holds
RigDash's database credentials and secret key (a worker host), with or without an agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from inference.live import agents
from inference.models import Rig
from monitoring.models import RigProfile
from monitoring.sampling import RigSampler
from monitoring.services import bandwidth_probe_gbs

log = logging.getLogger(__name__)


class AgentRefused(Exception):
    """The agent cannot start: the message says why and what to do."""


@dataclass(frozen=True)
class AgentIdentity:
    rig_id: int
    key: str
    host: str
    instance: str

    def beat(self) -> dict[str, Any]:
        return {"ts": time.time(), "rig": self.rig_id, "host": self.host, "instance": self.instance}


def rig_for_agent(name: str, key: str) -> Rig:
    """The rig this agent serves, once its key is the rig's and no other agent reports for it (AgentRefused)."""
    rig = Rig.objects.filter(name=name).first()
    if rig is None:
        known = ", ".join(Rig.objects.values_list("name", flat=True)) or "none"
        raise AgentRefused(f"no rig named {name!r} (rigs: {known})")
    if not rig.agent_key:
        raise AgentRefused(
            f"rig {name!r} has no agent key: an admin issues one with `manage.py rigdash_agent_key --rig {name}`"
        )
    if not key:
        raise AgentRefused("RIGDASH_AGENT_KEY is not set: give the agent its rig's key in its environment")
    if not hmac.compare_digest(key.encode(), rig.agent_key.encode()):
        raise AgentRefused(f"RIGDASH_AGENT_KEY is not the agent key of rig {name!r}")
    if not rig.enabled:
        raise AgentRefused(f"rig {name!r} is disabled")
    return rig


def new_key() -> str:
    return secrets.token_urlsafe(32)


def key_from_database(name: str) -> str:
    """The rig's agent key as RigDash keeps it, issued now when the rig has none: for an agent that runs beside
    RigDash and holds its database's credentials anyway (docker-compose.yml's bundled agents, ``--key-from-database``),
    so nobody copies a key. Two agents starting at once issue one key: the first write wins."""
    rig = Rig.objects.filter(name=name).first()
    if rig is None:
        return ""  # rig_for_agent names the rigs there are
    if not rig.agent_key:
        Rig.objects.filter(pk=rig.pk, agent_key="").update(agent_key=new_key())
        rig.refresh_from_db(fields=["agent_key"])
    return rig.agent_key


def identity_for(rig: Rig, key: str) -> AgentIdentity:
    """This agent's identity; refused while another agent's heartbeat for the rig is fresh (two agents, one rig)."""
    other = agents.agent_state(rig.pk, rig.agent_key)
    if other.up:
        raise AgentRefused(
            f"another agent ({other.instance}) reports for rig {rig.name!r}; stop it first, or wait "
            f"{settings.RIGDASH.agent_timeout_s:g} s after it stopped"
        )
    host = socket.gethostname()
    return AgentIdentity(rig_id=rig.pk, key=key, host=host, instance=f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}")


def rig_from_config(config: dict[str, Any], key: str) -> Rig:
    """The rig as its record describes it: an unsaved row, never read from nor written to a database."""
    return Rig(
        pk=int(config["rig"]), name=str(config["name"]), kind=str(config["kind"]), base_url=str(config["base_url"]),
        queue=str(config.get("queue") or ""), slots=int(config.get("slots") or 1), api_key=str(config["api_key"]),
        agent_key=key,
    )  # fmt: skip


def sampler_from_config(config: dict[str, Any], key: str, *, measured_gbs: float | None = None) -> RigSampler:
    """A sampler on the rig's host built from its record: the profile's settings, and where the profile has no
    bandwidth, this host's RAM's as measured here (``measured_gbs``; probed when None) and kept nowhere."""
    profile = RigProfile(
        kv_cache_type=str(config.get("kv_cache_type") or "f16"), bandwidth_gbs=config.get("bandwidth_gbs"),
        bandwidth_source=str(config.get("bandwidth_source") or ""), model_layers=config.get("model_layers"),
        model_kv_heads=config.get("model_kv_heads"), model_head_dim=config.get("model_head_dim"),
    )  # fmt: skip
    if profile.bandwidth_gbs is None:
        profile.bandwidth_gbs = measured_gbs if measured_gbs is not None else bandwidth_probe_gbs()
        profile.bandwidth_source = RigProfile.BandwidthSource.PROBE
    return RigSampler(
        rig=rig_from_config(config, key),
        kv_cache_type=profile.kv_cache_type,
        bandwidth_gbs=profile.bandwidth_gbs,
        bandwidth_source=profile.bandwidth_source,
        local_host=True,
        profile_arch=profile.geometry(),
    )


def config_for_agent(rig_id: int, key: str, *, name: str = "") -> dict[str, Any]:
    """The rig's record from Redis, verified (AgentRefused saying why not)."""
    if not key:
        raise AgentRefused("RIGDASH_AGENT_KEY is not set: give the agent its rig's key in its environment")
    try:
        config = agents.config_read(key, rig_id)
    except ValueError as exc:
        raise AgentRefused(f"rig {rig_id}: {exc}") from None
    if name and config.get("name") != name:
        raise AgentRefused(f"rig {rig_id} is named {config.get('name')!r}, not {name!r}")
    return config


class ConfigFollower:
    """Reads the rig's record again every ``agents.CONFIG_EVERY_S`` and makes a new sampler when an admin changed
    the rig (its URL, backend key, profile). A record that does not verify, or none, keeps the sampler as it is."""

    def __init__(self, rig_id: int, key: str, config: dict[str, Any], sampler: RigSampler) -> None:
        self.rig_id, self.key, self.sampler = rig_id, key, sampler
        self.config = {k: v for k, v in config.items() if k != "ts"}
        self.read_at = time.monotonic()

    def __call__(self) -> RigSampler:
        if time.monotonic() - self.read_at < agents.CONFIG_EVERY_S:
            return self.sampler
        self.read_at = time.monotonic()
        try:
            fresh = {k: v for k, v in agents.config_read(self.key, self.rig_id).items() if k != "ts"}
        except (ValueError, OSError, RedisError) as exc:
            log.warning("rig agent: the rig's record was not taken (%s); sampling as before", exc)
            return self.sampler
        if fresh != self.config:
            log.info("rig agent: the rig's record changed; sampling with the new one")
            self.config = fresh
            probed = self.sampler.bandwidth_source == RigProfile.BandwidthSource.PROBE
            measured = self.sampler.bandwidth_gbs if probed else None
            self.sampler = sampler_from_config(fresh, self.key, measured_gbs=measured)
        return self.sampler


async def run(
    sampler: RigSampler,
    me: AgentIdentity,
    *,
    interval_s: float,
    stop: asyncio.Event,
    follow: Callable[[], RigSampler] | None = None,
) -> int:
    """Sample and publish every ``interval_s`` until ``stop``; returns the ticks done. A tick whose publication
    fails (Redis away) is dropped: the heartbeat's age then tells the central side. ``follow``: the sampler to use
    this tick (a database-free agent's ``ConfigFollower``)."""
    ticks = 0
    next_at = time.monotonic()
    while not stop.is_set():
        if follow is not None:
            sampler = await asyncio.to_thread(follow)
        sample = await sampler.read()
        sample.detail.setdefault("provenance", {})["host"] = f"agent on {me.host}"
        payload = {"ts": sample.ts, "series": sample.series, "detail": sample.detail}
        try:
            await asyncio.to_thread(agents.publish, key=me.key, rig_id=me.rig_id, beat=me.beat(), sample=payload)
        except (OSError, RedisError) as exc:
            log.warning("rig agent: publishing failed (%r); trying again next tick", exc)
        ticks += 1
        next_at += interval_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_at - time.monotonic()))
    return ticks
