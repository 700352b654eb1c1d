"""The database-free rig agent (issue 56 item 2): it holds its rig's id, its rig's key and a Redis URL whose user a
Redis ACL limits to its rig's keys, and nothing else of RigDash's (no DATABASE_URL, no RIGDASH_SECRET_KEY, no VAR_DIR).
Its rig's settings come from the record the central sampler keeps in Redis (inference/live/agents.py), signed,
dated and with the backend key sealed.

Real processes: the agent is ``manage.py rigdash_agent --rig-id`` started with an environment that has only those,
against a real llama-server started with --api-key (so a sample that reads it proves the agent unsealed the backend
key), and the central sampler's own loop writes the record and reads the agent's samples."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings

from inference.live import agents
from inference.live import state as live
from inference.models import Rig
from monitoring import sampler as central
from monitoring import services
from monitoring.collectors import host
from monitoring.models import RigProfile
from rigdash.launcher import ROOT, Stack, free_port, llama_server_command, wait_http
from tests.conftest import LOG_DIR, wait_until

KEY = "agent-key-" + "z" * 30
OTHER_KEY = "agent-key-" + "y" * 30
BACKEND_KEY = "sk-backend-" + "q" * 24
CONFIG = {
    "rig": 0, "name": "dbfree", "kind": "llamacpp", "base_url": "http://127.0.0.1:9", "queue": "rig.dbfree",
    "slots": 2, "api_key": BACKEND_KEY, "kv_cache_type": "f16", "bandwidth_gbs": 20.0, "bandwidth_source": "setting",
    "model_layers": None, "model_kv_heads": None, "model_head_dim": None,
}  # fmt: skip


def _config(rig_id: int) -> dict[str, Any]:
    return {**CONFIG, "rig": rig_id}


# The record (Redis only) -----------------------------------------------------------------------------------------


def test_the_record_opens_with_the_rigs_key_and_hides_the_backend_key_from_redis():
    rig_id = 900_001
    agents.config_publish(key=KEY, rig_id=rig_id, config=_config(rig_id))
    try:
        raw = live.sync_client().get(agents.config_key(rig_id))
        assert BACKEND_KEY.encode() not in raw and b"sk-backend" not in raw  # sealed, not merely encoded
        stored = json.loads(json.loads(raw)["body"])
        assert "api_key" not in stored and stored["api_key_sealed"]
        with pytest.raises(ValueError, match="does not open"):
            agents.unseal(OTHER_KEY, rig_id, stored["api_key_sealed"])  # another rig's key
        with pytest.raises(ValueError, match="does not open"):
            agents.unseal(KEY, rig_id + 1, stored["api_key_sealed"])  # the right key, another rig's record
        opened = agents.config_read(KEY, rig_id)
        assert opened["api_key"] == BACKEND_KEY and opened["base_url"] == CONFIG["base_url"]
        with pytest.raises(ValueError, match="does not match"):
            agents.config_read(OTHER_KEY, rig_id)
        live.sync_client().set(agents.config_key(rig_id + 1), raw)  # a record copied to another rig's key
        with pytest.raises(ValueError, match="does not match"):
            agents.config_read(KEY, rig_id + 1)
        # Stale (a replay from before a change) and dated ahead are refused.
        with pytest.raises(ValueError, match="stale"):
            agents.config_read(KEY, rig_id, now=time.time() + agents.CONFIG_MAX_AGE_S + 5)
        with pytest.raises(ValueError, match="stale"):
            agents.config_read(KEY, rig_id, now=time.time() - agents.CONFIG_SKEW_S - 5)
        # Tampered: another URL under the old signature.
        outer = json.loads(raw)
        outer["body"] = outer["body"].replace("127.0.0.1:9", "evil.example:80")
        live.sync_client().set(agents.config_key(rig_id), json.dumps(outer))
        with pytest.raises(ValueError, match="does not match"):
            agents.config_read(KEY, rig_id)
    finally:
        live.sync_client().delete(agents.config_key(rig_id), agents.config_key(rig_id + 1))
    with pytest.raises(ValueError, match="no record of rig"):
        agents.config_read(KEY, rig_id)


# Real processes --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    port = free_port()
    stack = Stack()
    proc = stack.start(
        "llama-dbfree", llama_server_command(port=port, slots=2, ctx=2048, extra=("--api-key", BACKEND_KEY)),
        log_path=LOG_DIR / "llama-dbfree.log",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
    yield f"http://127.0.0.1:{port}"
    stack.stop()


def _acl_user(rig_id: int) -> tuple[str, str]:
    """A Redis user limited as docs/monitoring.md says (``agents.acl_setuser``); deleted by the caller."""
    username, password = f"wt-agent-test-{rig_id}-{secrets.token_hex(4)}", secrets.token_urlsafe(24)
    live.sync_client().execute_command("ACL", "SETUSER", *agents.acl_setuser(rig_id, username, password))
    return username, password


def _url_as(username: str, password: str) -> str:
    parts = urlsplit(settings.REDIS_URL)
    return urlunsplit(parts._replace(netloc=f"{username}:{password}@{parts.hostname}:{parts.port or 6379}"))


def _agent_env(redis_url: str, key: str) -> dict[str, str]:
    """All an agent host holds: no DATABASE_URL, no RIGDASH_SECRET_KEY, no writable VAR_DIR."""
    env = {
        "PATH": os.environ["PATH"], "HOME": "/nonexistent", "RIGDASH_AGENT_ONLY": "1", "REDIS_URL": redis_url,
        "RIGDASH_AGENT_KEY": key, "RIGDASH_VAR_DIR": "/nonexistent/rigdash-var", "RIGDASH_AGENT_TIMEOUT_S": "2",
        "RIGDASH_CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
    }  # fmt: skip
    assert not {"DATABASE_URL", "RIGDASH_SECRET_KEY", "POSTGRES_HOST", "POSTGRES_PASSWORD"} & env.keys()
    return env


def _start(env: dict[str, str], rig_id: int, name: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "manage.py", "rigdash_agent", "--rig-id", str(rig_id), "--no-worker", "--interval", "1"]
    log = open(LOG_DIR / f"agent-dbfree-{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _acl_denials(username: str) -> list[dict[str, Any]]:
    entries = live.sync_client().execute_command("ACL", "LOG", "128")
    found = []
    for entry in entries:
        row = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        row = {(k.decode() if isinstance(k, bytes) else k): v for k, v in row.items()}
        user = row.get("username")
        if (user.decode() if isinstance(user, bytes) else user) == username:
            found.append(row)
    return found


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_an_agent_with_no_database_and_no_secret_samples_its_rig_through_an_acl_limited_user(keyed_url):
    rig = Rig.objects.create(
        name="dbfree", kind=Rig.Kind.LLAMACPP, base_url=keyed_url, queue="rig.dbfree", agent_key=KEY,
        api_key=BACKEND_KEY,
    )  # fmt: skip
    other = Rig.objects.create(
        name="dbfree-other", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.dbfree-other",
        agent_key=OTHER_KEY, api_key="sk-other-" + "o" * 20,
    )  # fmt: skip
    for each in (rig, other):
        RigProfile.objects.create(rig=each, bandwidth_gbs=20.0, bandwidth_source=RigProfile.BandwidthSource.SETTING)
    # The central sampler's loop signs each rig's record (one tick each; the agent is not up yet).
    for each in (rig, other):
        asyncio.run(central.rig_loop(each.pk, 1.0, ticks=1))
    live.sync_client().rpush(rig.queue, "a-message")  # a Celery queue the agent must not read
    username, password = _acl_user(rig.pk)
    proc = None
    try:
        proc = _start(_agent_env(_url_as(username, password), KEY), rig.pk, "up")
        wait_until(lambda: agents.agent_state(rig.pk, KEY).up, timeout_s=60, what="the database-free agent")

        def central_read() -> Any:
            sampler = services.sampler_for(rig, local_host=False)
            sample = asyncio.run(central.read(sampler))
            sampler.complete(sample)
            return sample

        sample = wait_until(
            lambda: (s := central_read()).detail.get("agent_sampled_at") and s.detail["sources"]["backend"]["ok"] and s,
            timeout_s=30,
            what="the agent's sample of the keyed llama-server",
        )
        assert sample.detail["agent"]["up"] and sample.detail["provenance"]["host"].startswith("agent on ")
        # Its host figures are the keyed llama-server's process, read on "its host".
        assert sample.detail["process"]["pid"] == host.find_listening_pid(int(keyed_url.rsplit(":", 1)[1]))
        assert sample.detail["sources"]["host"]["ok"] and sample.series["host_total_bytes"] > 0
        assert sample.series["queue_depth"] == 1.0  # the central side completes it with the queue
        assert sample.detail["bandwidth"]["gbs"] == 20.0  # the profile's, from the record
        # The ACL user: the agent needed nothing it refuses, and can reach nothing but its rig's keys.
        assert _acl_denials(username) == []
        as_agent = redis.Redis.from_url(_url_as(username, password))
        assert as_agent.get(agents.config_key(rig.pk))
        for denied in (
            lambda: as_agent.get(agents.config_key(other.pk)),  # another rig's record
            lambda: as_agent.get(agents.beat_key(other.pk)),
            lambda: as_agent.set(agents.sample_key(other.pk), "x"),  # posing as another rig's agent
            lambda: as_agent.llen(rig.queue),  # its own rig's Celery queue
            lambda: as_agent.lrange("rigdash.default", 0, -1),  # the default queue
            lambda: as_agent.lpush(rig.queue, "x"),
            lambda: as_agent.keys("*"),
            lambda: as_agent.publish("rigdash.any", "x"),
            lambda: as_agent.execute_command("CONFIG", "GET", "*"),
            lambda: as_agent.flushdb(),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
        as_agent.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        live.sync_client().execute_command("ACL", "DELUSER", username)
        live.sync_client().delete(
            rig.queue, *(key for each in (rig, other) for key in (agents.config_key(each.pk), agents.beat_key(each.pk)))
        )
    assert proc.returncode == 0  # SIGTERM: a clean stop


@pytest.mark.llama
def test_a_forged_stale_or_missing_record_stops_the_agent_saying_why():
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    rig_id = 900_101
    env = _agent_env(settings.REDIS_URL, KEY)
    cases = {
        "forged": lambda: agents.config_publish(key=OTHER_KEY, rig_id=rig_id, config=_config(rig_id)),
        "stale": lambda: agents.config_publish(
            key=KEY, rig_id=rig_id, config=_config(rig_id), now=time.time() - agents.CONFIG_MAX_AGE_S - 30
        ),
        "missing": lambda: live.sync_client().delete(agents.config_key(rig_id)),
    }
    expected = {"forged": "does not match", "stale": "is stale", "missing": "no record of rig"}
    try:
        for case, write in cases.items():
            write()
            proc = _start(env, rig_id, case)
            assert proc.wait(timeout=60) != 0, case
            logged = (LOG_DIR / f"agent-dbfree-{case}.log").read_text()
            assert expected[case] in logged, logged[-2000:]
            assert agents.agent_state(rig_id, KEY).last_seen is None  # it published nothing
    finally:
        live.sync_client().delete(agents.config_key(rig_id), agents.beat_key(rig_id))


def test_an_agent_without_the_database_samples_only():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="a host that runs them is a worker host"):
        call_command("rigdash_agent", "--rig-id", "5")
    with pytest.raises(CommandError, match="--key-from-database needs the database"):
        call_command("rigdash_agent", "--rig-id", "5", "--no-worker", "--key-from-database")
