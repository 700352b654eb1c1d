"""Rig agents' live state in Redis: each agent's heartbeat and its latest sample, signed with its rig's key.

An agent (``manage.py rigdash_agent``, monitoring/agent.py) runs on a rig's host: it serves the rig's Celery queue and
samples that host. Every tick it stores, under its rig's id, a heartbeat and the sample it took, each signed with
HMAC-SHA256 under the rig's ``agent_key``. The central sampler and the queue read them here: an agent is *up* while
its heartbeat is fresh (``RIGDASH_AGENT_TIMEOUT_S``), and what it sends counts only when its signature matches the
key of the rig it names, so one rig's agent cannot pose as another's. What a host with broker access can do is
documented in docs/monitoring.md ("Rig agents").

A database-free agent (``rigdash_agent --rig-id ID``) learns its rig from a record the central sampler keeps here per
rig (``config_publish``): the rig's kind, URL, slots and profile, signed like the samples so that a record written by
anyone without the rig's key is refused, dated so that an old one replayed is refused too, and the backend's own key
in it sealed (AES-256-GCM under a key derived from the rig's key), so that Redis and whoever reads it without the
rig's key never see it. Every key an agent touches is under ``rigdash:agent:<id>:`` (``AGENT_COMMANDS`` are the
commands it sends), so a Redis ACL user can be limited to its own rig's (``acl_setuser``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from redis.exceptions import ResponseError

from inference.live import state

KEPT_S = 24 * 3600  # a heartbeat outlives any outage it reports ("down since ...")
CONFIG_EVERY_S = 60.0  # the central sampler signs each rig's record again this often, and an agent reads it again
CONFIG_MAX_AGE_S = 600.0  # an agent refuses an older record (one replayed from before an admin's change)
CONFIG_SKEW_S = 60.0  # nor one dated further ahead than clocks drift apart
# What a database-free agent sends Redis, for its ACL user (docs/monitoring.md): SELECT on connecting (a database
# other than 0), its health check (PING), the record and the heartbeat's reads (GET), and its writes (SET with EX).
# redis-py also names itself on connecting (CLIENT SETINFO, Redis 7.2 and later): refused, it carries on, and the
# refusal is in ACL LOG; ``acl_setuser(..., setinfo=True)`` allows it there.
AGENT_COMMANDS = ("get", "set", "ping", "select")


def beat_key(rig_id: int) -> str:
    return f"rigdash:agent:{rig_id}:beat"


def sample_key(rig_id: int) -> str:
    return f"rigdash:agent:{rig_id}:sample"


def config_key(rig_id: int) -> str:
    return f"rigdash:agent:{rig_id}:config"


def agent_keys(rig_id: int) -> str:
    """The key pattern of everything one rig's agent reads and writes."""
    return f"rigdash:agent:{rig_id}:*"


def acl_setuser(rig_id: int, username: str, password: str, *, setinfo: bool = False) -> list[str]:
    """The ``ACL SETUSER`` arguments of a Redis user that can do what rig ``rig_id``'s database-free agent does and
    nothing else: its commands, on its own rig's keys, no channel (``setinfo``: Redis 7.2 and later)."""
    commands = (*AGENT_COMMANDS, "client|setinfo") if setinfo else AGENT_COMMANDS
    return [
        username, "reset", "on", f">{password}", f"~{agent_keys(rig_id)}", "resetchannels", "-@all",
        *(f"+{command}" for command in commands),
    ]  # fmt: skip


def acl_username(rig_id: int) -> str:
    """The Redis user of rig ``rig_id``'s database-free agent (``acl_ensure``). Redis's users are the server's, not a
    database's: the name starts with RIGDASH_CHANNEL_PREFIX, so RigDashes sharing a server do not share users."""
    prefix: str = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]  # type: ignore[index]
    return f"{prefix}-agent-{rig_id}"


def acl_password(key: str) -> str:
    """That user's password, derived from the rig's agent key: whoever holds the key (the central sampler, the
    agent's setup) computes it, and it tells nothing of the key."""
    return hmac.new(key.encode(), b"rigdash agent redis password v1", hashlib.sha256).hexdigest()


def acl_ensure(rig_id: int, key: str, client: Any = None) -> bool:
    """Make rig ``rig_id``'s agent user in Redis (``acl_setuser``), unless it is there already with this key's
    password; True when it was (re)made. Redis forgets its ACL users when it restarts without an aclfile: the
    central sampler calls this every ``CONFIG_EVERY_S``, so an agent logs in again within a minute."""
    client = client or state.sync_client()
    username, password = acl_username(rig_id), acl_password(key)
    user = client.acl_getuser(username)
    if user and user.get("enabled") and hashlib.sha256(password.encode()).hexdigest() in user.get("passwords", []):
        return False
    try:
        client.execute_command("ACL", "SETUSER", *acl_setuser(rig_id, username, password, setinfo=True))
    except ResponseError as exc:  # before Redis 7.2 there is no CLIENT SETINFO
        if "setinfo" not in str(exc).lower():
            raise
        client.execute_command("ACL", "SETUSER", *acl_setuser(rig_id, username, password))
    return True


def acl_url(redis_url: str, rig_id: int, key: str) -> str:
    """``redis_url`` (the central side's) with the agent's user and password in place of its credentials."""
    parts = urlsplit(redis_url)
    host = parts.netloc.rpartition("@")[2]
    credentials = f"{quote(acl_username(rig_id), safe='')}:{quote(acl_password(key), safe='')}"
    return urlunsplit(parts._replace(netloc=f"{credentials}@{host}"))


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


def _seal_key(key: str) -> bytes:
    """The AES-256 key that seals a rig's secrets in its record, derived from the rig's key (never the key itself,
    which also signs)."""
    return hmac.new(key.encode(), b"rigdash agent config seal v1", hashlib.sha256).digest()


def seal(key: str, rig_id: int, secret: str) -> str:
    """``secret`` readable only with the rig's key, and only as rig ``rig_id``'s (the rig id is authenticated data)."""
    nonce = os.urandom(12)
    sealed = AESGCM(_seal_key(key)).encrypt(nonce, secret.encode(), f"rig {rig_id}".encode())
    return base64.urlsafe_b64encode(nonce + sealed).decode()


def unseal(key: str, rig_id: int, sealed: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(sealed.encode())
        return AESGCM(_seal_key(key)).decrypt(raw[:12], raw[12:], f"rig {rig_id}".encode()).decode()
    except (ValueError, InvalidTag) as exc:
        raise ValueError("the record's sealed backend key does not open with this rig's agent key") from exc


def config_publish(*, key: str, rig_id: int, config: dict[str, Any], now: float | None = None) -> None:
    """The central side's record of rig ``rig_id`` for its database-free agent: ``config`` (the backend key under
    ``api_key``, sealed here), dated and signed with the rig's key."""
    payload = {k: v for k, v in config.items() if k != "api_key"}
    secret = str(config.get("api_key") or "")
    payload["api_key_sealed"] = seal(key, rig_id, secret) if secret else ""
    payload["ts"] = time.time() if now is None else now
    state.sync_client().set(config_key(rig_id), envelope(key, rig_id, payload), ex=KEPT_S)


def config_read(key: str, rig_id: int, *, now: float | None = None) -> dict[str, Any]:
    """The rig's record as its agent takes it, the backend key unsealed under ``api_key``; ``ValueError`` saying why
    when there is none, it is not signed with this rig's key, or it is stale."""
    raw = state.sync_client().get(config_key(rig_id))
    payload = open_envelope(key, rig_id, raw)  # type: ignore[arg-type]
    if payload is None:
        raise ValueError(
            f"no record of rig {rig_id} in Redis: RigDash's sampler writes it for every enabled rig with an agent key "
            "(is the sampler running, the rig enabled, and this the rig's id?)"
        )
    now = time.time() if now is None else now
    ts = payload.get("ts")
    if not isinstance(ts, int | float) or now - ts > CONFIG_MAX_AGE_S or ts - now > CONFIG_SKEW_S:
        raise ValueError(
            f"the record of rig {rig_id} is stale (signed at {ts!r}, more than {CONFIG_MAX_AGE_S:g} s ago or in the "
            "future): is RigDash's sampler running?"
        )
    if payload.get("rig") != rig_id:
        raise ValueError(f"the record names rig {payload.get('rig')!r}, not {rig_id}")
    sealed = payload.pop("api_key_sealed", "")
    payload["api_key"] = unseal(key, rig_id, sealed) if sealed else ""
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
