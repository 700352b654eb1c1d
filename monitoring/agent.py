"""The rig agent: runs on a rig's host, samples that host and its backend, and publishes through Redis.

``manage.py rigdash_agent --rig NAME`` (RIGDASH_AGENT_KEY in its environment) starts it beside a backend; it also
starts a Celery worker for the rig's queue, so the turns and model pulls of that rig run on its host. Every tick
it takes a sample as the central sampler would on the rig's own host (psutil, NVML per GPU and per backend process,
the backend's process found by its port, the GGUF header at the path the backend reports) and stores it with a
heartbeat, signed with the rig's key (inference/live/agents.py). The central sampler adds RigDash's queue and turns,
stores and publishes it (monitoring/sampler.py); it reads no host figure itself for a rig with an agent.
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
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from inference.live import agents
from inference.models import Rig
from monitoring.sampling import RigSampler

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


async def run(sampler: RigSampler, me: AgentIdentity, *, interval_s: float, stop: asyncio.Event) -> int:
    """Sample and publish every ``interval_s`` until ``stop``; returns the ticks done. A tick whose publication
    fails (Redis away) is dropped: the heartbeat's age then tells the central side."""
    ticks = 0
    next_at = time.monotonic()
    while not stop.is_set():
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
