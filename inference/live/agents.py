"""Rig agents' live state in Redis: each agent's heartbeat and its latest sample, signed with its rig's key.

An agent (``manage.py rigdash_agent``, monitoring/agent.py) runs on a rig's host: it serves the rig's Celery queue and
samples that host. Every tick it stores, under its rig's id, a heartbeat and the sample it took, each signed with
HMAC-SHA256 under the rig's ``agent_key``. The central sampler and the queue read them here: an agent is *up* while
its heartbeat is fresh (``RIGDASH_AGENT_TIMEOUT_S``), and what it sends counts only when its signature matches the
key of the rig it names, so one rig's agent cannot pose as another's. What a host with broker access can do is
documented in docs/monitoring.md ("Rig agents").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from inference.live import state

KEPT_S = 24 * 3600  # a heartbeat outlives any outage it reports ("down since ...")


def beat_key(rig_id: int) -> str:
    return f"rigdash:agent:{rig_id}:beat"


def sample_key(rig_id: int) -> str:
    return f"rigdash:agent:{rig_id}:sample"


def sign(key: str, rig_id: int, body: bytes) -> str:
    """The signature of ``body`` for rig ``rig_id``: the rig id is inside the MAC, so a body signed for one rig does
    not verify for another with the same key."""
    return hmac.new(key.encode(), f"{rig_id}\n".encode() + body, hashlib.sha256).hexdigest()


def verify(key: str, rig_id: int, body: bytes, signature: str) -> bool:
    return bool(key) and hmac.compare_digest(sign(key, rig_id, body), signature)


def envelope(key: str, rig_id: int, payload: dict[str, Any]) -> str:
    """``payload`` as stored: its JSON and the signature of exactly those bytes."""
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    return json.dumps({"body": body, "sig": sign(key, rig_id, body.encode())})


def open_envelope(key: str, rig_id: int, raw: bytes | str | None) -> dict[str, Any] | None:
    """The payload of a stored envelope when its signature is good; None when there is none; ``ValueError`` when it
    is not one or was not signed with this rig's key."""
    if raw is None:
        return None
    try:
        outer = json.loads(raw)
        body, signature = outer["body"], outer["sig"]
        if not (isinstance(body, str) and isinstance(signature, str)):
            raise TypeError
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError("what the agent stored is not a signed envelope") from exc
    if not verify(key, rig_id, body.encode(), signature):
        raise ValueError("the agent's signature does not match this rig's agent key")
    payload = json.loads(body)
    if not isinstance(payload, dict):
        raise ValueError("the agent's payload is not an object")
    return payload


def publish(*, key: str, rig_id: int, beat: dict[str, Any], sample: dict[str, Any] | None) -> None:
    """The agent's side of a tick: its heartbeat, and the sample it took (if any), in one round trip."""
    with state.sync_client().pipeline(transaction=False) as pipe:
        pipe.set(beat_key(rig_id), envelope(key, rig_id, beat), ex=KEPT_S)
        if sample is not None:
            pipe.set(sample_key(rig_id), envelope(key, rig_id, sample), ex=KEPT_S)
        pipe.execute()


@dataclass(frozen=True)
class AgentState:
    """What the central side knows of a rig's agent. ``error``: why what it sent does not count (a wrong key)."""

    expected: bool  # the rig has an agent key: an agent should run beside it
    up: bool
    last_seen: float | None  # the heartbeat's time (epoch seconds)
    host: str = ""
    instance: str = ""
    error: str = ""

    def describe(self) -> str:
        if not self.expected:
            return "no agent"
        if self.error:
            return f"agent rejected: {self.error}"
        if self.up:
            return f"agent up on {self.host}"
        if self.last_seen is None:
            return "agent down: it has never reported"
        return f"agent down since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.last_seen))}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "up": self.up,
            "last_seen": self.last_seen,
            "host": self.host,
            "instance": self.instance,
            "error": self.error,
            "label": self.describe(),
        }


def agent_state(rig_id: int, agent_key: str, *, now: float | None = None) -> AgentState:
    """The rig's agent as its heartbeat tells (one GET)."""
    if not agent_key:
        return AgentState(expected=False, up=False, last_seen=None)
    now = time.time() if now is None else now
    try:
        beat = open_envelope(agent_key, rig_id, state.sync_client().get(beat_key(rig_id)))  # type: ignore[arg-type]
    except ValueError as exc:
        return AgentState(expected=True, up=False, last_seen=None, error=str(exc))
    if beat is None:
        return AgentState(expected=True, up=False, last_seen=None)
    seen = float(beat.get("ts") or 0.0)
    fresh = now - seen <= settings.RIGDASH.agent_timeout_s
    return AgentState(
        expected=True, up=fresh, last_seen=seen, host=str(beat.get("host", "")), instance=str(beat.get("instance", ""))
    )


def latest_sample(rig_id: int, agent_key: str) -> dict[str, Any] | None:
    """The agent's latest sample, verified (``ValueError`` when it does not verify)."""
    return open_envelope(agent_key, rig_id, state.sync_client().get(sample_key(rig_id)))  # type: ignore[arg-type]
