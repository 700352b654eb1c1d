"""docker-compose.yml's bundled agents hold no RigDash secret (issue 56): ``manage.py rigdash_agent_init`` (a
one-shot service with the database) issues the rig's key, makes the agent's Redis ACL user and writes the agent's
files; the central sampler makes that user again when Redis forgot it (a restart without an aclfile). Against the
suite's real Redis; every ACL user made here is deleted."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from inference.live import agents
from inference.live import state as live
from inference.models import Rig
from monitoring import services


@pytest.fixture
def rig() -> Iterator[Rig]:
    rig = Rig.objects.create(name="bundled", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.bundled")
    yield rig
    live.sync_client().execute_command("ACL", "DELUSER", agents.acl_username(rig.pk))
    live.sync_client().delete(agents.config_key(rig.pk), agents.beat_key(rig.pk))


def _user_exists(rig_id: int) -> bool:
    return live.sync_client().acl_getuser(agents.acl_username(rig_id)) is not None


@pytest.mark.django_db
def test_init_issues_the_key_writes_the_agent_s_files_and_makes_a_redis_user_limited_to_its_rig(rig, tmp_path):
    folder = tmp_path / "agent"
    call_command("rigdash_agent_init", rig="bundled", dir=str(folder))
    rig.refresh_from_db()
    assert len(rig.agent_key) >= 32, "issued"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("rig_id", "key", "redis_url"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o400, name
    assert (folder / "rig_id").read_text().strip() == str(rig.pk)
    assert (folder / "key").read_text().strip() == rig.agent_key
    url = (folder / "redis_url").read_text().strip()
    assert agents.acl_username(rig.pk) in url and agents.acl_password(rig.agent_key) in url

    client = redis.Redis.from_url(url)
    try:
        client.set(agents.beat_key(rig.pk), "x", ex=60)  # its own keys
        assert client.get(agents.beat_key(rig.pk)) == b"x"
        for denied in (
            lambda: client.llen("rigdash.default"),  # the Celery queue
            lambda: client.get("rigdash.default"),
            lambda: client.get(agents.beat_key(rig.pk + 1)),  # another rig's
            lambda: client.keys("*"),
            lambda: client.publish("rigdash", "x"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
    finally:
        client.close()

    key = rig.agent_key
    call_command("rigdash_agent_init", rig="bundled", dir=str(folder))  # again (every `up`): same key, files kept
    rig.refresh_from_db()
    assert rig.agent_key == key and (folder / "key").read_text().strip() == key
    with pytest.raises(CommandError, match="no rig 'nope'"):
        call_command("rigdash_agent_init", rig="nope", dir=str(tmp_path / "other"))


@pytest.mark.django_db
def test_the_sampler_makes_the_agent_s_user_again_after_redis_forgot_it(rig, settings):
    rig.agent_key = "agent-key-" + "r" * 30
    rig.save()
    assert agents.acl_ensure(rig.pk, rig.agent_key) is True
    assert agents.acl_ensure(rig.pk, rig.agent_key) is False, "unchanged: not made again every minute"
    live.sync_client().execute_command("ACL", "DELUSER", agents.acl_username(rig.pk))  # a Redis restart

    settings.AGENT_ACL_USERS = False
    services.agent_config_publish(rig)
    assert not _user_exists(rig.pk), "off unless RIGDASH_AGENT_ACL_USERS=1 (a Redis user without ACL rights)"
    settings.AGENT_ACL_USERS = True
    services.agent_config_publish(rig)  # the sampler, every agents.CONFIG_EVERY_S
    assert _user_exists(rig.pk)
    client = redis.Redis.from_url(agents.acl_url(_url(), rig.pk, rig.agent_key))  # the agent's login works again
    try:
        record = agents.open_envelope(rig.agent_key, rig.pk, client.get(agents.config_key(rig.pk)))  # type: ignore[arg-type]
        assert record is not None and record["name"] == "bundled"
    finally:
        client.close()

    rig.agent_key = "agent-key-" + "s" * 30  # an admin issued a new key: the old password no longer logs in
    rig.save()
    services.agent_config_publish(rig)
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(agents.acl_url(_url(), rig.pk, "agent-key-" + "r" * 30)).ping()
    assert redis.Redis.from_url(agents.acl_url(_url(), rig.pk, rig.agent_key)).ping()


def _url() -> str:
    return django_settings.REDIS_URL


def test_the_agent_reads_its_rig_id_and_key_from_files(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("RIGDASH_AGENT_KEY", raising=False)
    (tmp_path / "rig_id").write_text("not-an-id\n")
    (tmp_path / "key").write_text("k" * 40 + "\n")
    with pytest.raises(CommandError, match="not a rig id"):
        call_command("rigdash_agent", rig_id_file=tmp_path / "rig_id", key_file=tmp_path / "key", no_worker=True)
    with pytest.raises(CommandError, match="--rig-id and --rig-id-file both given"):
        call_command("rigdash_agent", rig_id=1, rig_id_file=tmp_path / "rig_id", no_worker=True)
    (tmp_path / "rig_id").write_text("999999991\n")
    with pytest.raises(CommandError, match="no record of rig 999999991"):  # the id and key were read
        call_command("rigdash_agent", rig_id_file=tmp_path / "rig_id", key_file=tmp_path / "key", no_worker=True)
    monkeypatch.setenv("RIGDASH_AGENT_KEY", "x" * 40)
    with pytest.raises(CommandError, match="RIGDASH_AGENT_KEY and --key-file both given"):
        call_command("rigdash_agent", rig_id=1, key_file=tmp_path / "key", no_worker=True)
    with pytest.raises(CommandError, match=r"--key-file .*missing"):
        monkeypatch.delenv("RIGDASH_AGENT_KEY")
        call_command("rigdash_agent", rig_id=1, key_file=tmp_path / "missing", no_worker=True)
