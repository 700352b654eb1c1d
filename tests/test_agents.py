"""Rigs on other hosts: a rig agent beside each backend (monitoring/agent.py), its signed heartbeat and samples
(inference/live/agents.py), and what the central side shows and does with them.

Two llama-servers on this machine stand for two hosts, each with its own agent process and its own context size, so
their figures differ. No GPU here: the agents read no NVML (their GPU source says why), and the GPU bandwidth is
checked against the NVML stand-in built from an H200's real readings (tests/test_nvml.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest
from django.conf import settings

from inference.live import agents
from inference.live import state as live
from inference.models import ChatSession, Rig, Turn
from inference.turns import lifecycle, selectors, submit
from monitoring import gpus, services
from monitoring import sampler as central
from monitoring.collectors import host
from monitoring.models import RigProfile
from rigdash.launcher import ROOT
from tests.conftest import LOG_DIR, wait_until

KEY_A, KEY_B = "key-of-rig-a-" + "a" * 20, "key-of-rig-b-" + "b" * 20

# Signatures (pure) -------------------------------------------------------------------------------------------


def test_a_signed_sample_opens_only_with_its_rigs_key_and_for_its_rig():
    sealed = agents.envelope(KEY_A, 7, {"ts": 1.0, "series": {"x": 1}})
    assert agents.open_envelope(KEY_A, 7, sealed) == {"ts": 1.0, "series": {"x": 1}}
    with pytest.raises(ValueError, match="does not match"):
        agents.open_envelope(KEY_B, 7, sealed)  # another rig's key
    with pytest.raises(ValueError, match="does not match"):
        agents.open_envelope(KEY_A, 8, sealed)  # the right key, posing as another rig
    tampered = json.loads(sealed)
    tampered["body"] = tampered["body"].replace('"x":1', '"x":2')
    with pytest.raises(ValueError, match="does not match"):
        agents.open_envelope(KEY_A, 7, json.dumps(tampered))
    for junk in (b"not json", b"[1, 2]", json.dumps({"body": 1, "sig": "x"}).encode()):
        with pytest.raises(ValueError, match="not a signed envelope"):
            agents.open_envelope(KEY_A, 7, junk)
    assert agents.open_envelope(KEY_A, 7, None) is None


# The heartbeat ----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_agent_is_up_while_its_heartbeat_is_fresh_and_down_since_its_last_one():
    rig = Rig.objects.create(name="hb", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.hb")
    assert agents.agent_state(rig.pk, "").describe() == "no agent"
    assert agents.agent_state(rig.pk, KEY_A).describe() == "agent down: it has never reported"
    now = time.time()
    agents.publish(key=KEY_A, rig_id=rig.pk, beat={"ts": now, "host": "gpu-box", "instance": "i1"}, sample=None)
    up = agents.agent_state(rig.pk, KEY_A, now=now + 1)
    assert (up.up, up.host, up.describe()) == (True, "gpu-box", "agent up on gpu-box")
    down = agents.agent_state(rig.pk, KEY_A, now=now + settings.RIGDASH.agent_timeout_s + 0.5)
    assert not down.up and down.describe().startswith("agent down since ")
    wrong = agents.agent_state(rig.pk, KEY_B, now=now)
    assert not wrong.up and "does not match" in wrong.error


# Two hosts, two agents ----------------------------------------------------------------------------------------


def _listening_pid(url: str) -> int | None:
    return host.find_listening_pid(int(url.rsplit(":", 1)[1]))


def _start_agent(
    service_env: dict[str, str], rig: Rig, key: str, *, extra: tuple[str, ...] = (), worker: bool = False
) -> Any:
    """A rig agent process; ``worker``: it also runs the Celery worker for the rig's queue, as on a rig's host."""
    env = {**os.environ, **service_env, "RIGDASH_AGENT_KEY": key, "RIGDASH_AGENT_TIMEOUT_S": "2"}
    serve = () if worker else ("--no-worker",)
    cmd = [sys.executable, "manage.py", "rigdash_agent", "--rig", rig.name, *serve, "--interval", "1", *extra]
    log = open(LOG_DIR / f"agent-{rig.name}.log", "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def two_rigs(db: Any, llama_url: str, second_llama: tuple[str, int], service_env: dict[str, str]) -> Any:
    url_b, _ = second_llama
    rig_a = Rig.objects.create(
        name="host-a", kind=Rig.Kind.LLAMACPP, base_url=llama_url, queue="rig.host-a", agent_key=KEY_A
    )
    rig_b = Rig.objects.create(
        name="host-b", kind=Rig.Kind.LLAMACPP, base_url=url_b, queue="rig.host-b", agent_key=KEY_B
    )
    for rig in (rig_a, rig_b):  # no probe in the test: a bandwidth set by an admin
        RigProfile.objects.create(rig=rig, bandwidth_gbs=20.0, bandwidth_source=RigProfile.BandwidthSource.SETTING)
    procs = [_start_agent(service_env, rig_a, KEY_A), _start_agent(service_env, rig_b, KEY_B)]
    yield rig_a, rig_b, procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)


def _central_read(rig: Rig) -> Any:
    """What the central sampler makes of the rig this tick: the agent's reading, completed with the queue, the turns
    and the roofline."""
    sampler = services.sampler_for(rig, local_host=False)
    sample = asyncio.run(central.read(sampler))
    sampler.complete(sample)
    return sample


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_each_rig_shows_its_own_agents_figures_and_the_central_side_reads_no_host(two_rigs, monkeypatch):
    rig_a, rig_b, procs = two_rigs
    for rig in (rig_a, rig_b):
        wait_until(lambda r=rig: agents.agent_state(r.pk, r.agent_key).up, timeout_s=60, what=f"{rig.name}'s agent")

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("the central side read a host figure for a rig that has an agent")

    for module, name in ((host, "host_memory"), (host, "find_listening_pid"), (host, "process_memory"), (gpus, "gpus")):
        monkeypatch.setattr(module, name, forbidden)
    samples = {}
    for rig in (rig_a, rig_b):
        sample = wait_until(
            lambda r=rig: (s := _central_read(r)).detail.get("kv", {}).get("arch") and s, timeout_s=30, what="KV"
        )
        samples[rig.name] = sample
        assert sample.detail["agent"]["up"] and sample.detail["provenance"]["host"].startswith("agent on ")
        assert sample.detail["sources"]["host"]["ok"] and sample.series["host_total_bytes"] > 0
        assert sample.detail["provenance"]["kv"] == "the GGUF file's header"
        roofline = sample.detail["roofline"]
        assert roofline["ok"] and roofline["bandwidth_source"] == "set by an admin in the rig's profile", roofline
    monkeypatch.undo()
    # Each rig's process figures are its own llama-server's, and their KV caches differ as their contexts do.
    for rig in (rig_a, rig_b):
        assert samples[rig.name].detail["process"]["pid"] == _listening_pid(rig.base_url)
    assert samples["host-a"].series["kv_allocated_bytes"] == 23_040 * 4096
    assert samples["host-b"].series["kv_allocated_bytes"] == 23_040 * 2048
    assert samples["host-b"].detail["bandwidth"] == {"gbs": 20.0, "source": "set by an admin in the rig's profile"}
    # The agent's own cost at one sample a second.
    agent = psutil.Process(procs[0].pid)
    before, started = agent.cpu_times(), time.monotonic()
    time.sleep(10)
    after = agent.cpu_times()
    share = (after.user + after.system - before.user - before.system) / (time.monotonic() - started)
    print(f"agent CPU at 1 Hz: {share:.2%} of a core")
    assert share < 0.05, share

    # Stop one agent: it shows as down within 10 s; the other rig's stays up.
    procs[1].terminate()
    procs[1].wait(timeout=20)
    stopped = time.monotonic()
    down = wait_until(
        lambda: not (s := _central_read(rig_b)).detail["agent"]["up"] and s, timeout_s=10, what="agent down"
    )
    assert time.monotonic() - stopped < 10
    assert down.detail["agent"]["label"].startswith("agent down since ")
    assert not down.detail["sources"]["host"]["ok"]  # and no figure of this host stands in for the rig's
    assert _central_read(rig_a).detail["agent"]["up"]


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_an_agent_with_a_wrong_key_or_a_second_agent_for_a_rig_is_refused(two_rigs, service_env):
    rig_a, _, _ = two_rigs
    wait_until(lambda: agents.agent_state(rig_a.pk, KEY_A).up, timeout_s=60, what="the agent")
    wrong = _start_agent(service_env, rig_a, KEY_B)
    assert wrong.wait(timeout=60) != 0
    second = _start_agent(service_env, rig_a, KEY_A)
    assert second.wait(timeout=60) != 0
    logged = (LOG_DIR / "agent-host-a.log").read_text()
    assert "is not the agent key of rig 'host-a'" in logged and "another agent" in logged


@pytest.mark.django_db
def test_a_rigs_turns_wait_while_its_agent_is_down_then_fail_with_a_clear_reason(owner, monkeypatch, settings):
    rig = Rig.objects.create(
        name="far", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.far", agent_key=KEY_A
    )
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="m")
    turn = submit.turn_submit(session=session, text="hello")
    turn.refresh_from_db()
    assert turn.dispatched_at is None  # nothing consumes the rig's queue: the turn waits in the fair queue
    snapshot = selectors.turn_snapshot(Turn.objects.select_related("session__rig").get(pk=turn.pk))
    assert snapshot["queue_position"] == 1 and "agent down" in snapshot["waiting_reason"]
    assert lifecycle.turns_fail_where_agent_down() == []  # it has not waited long enough yet
    settings.RIGDASH = dataclasses.replace(settings.RIGDASH, agent_down_fail_s=0.01)
    time.sleep(0.05)
    assert lifecycle.turns_fail_where_agent_down() == [turn.pk]
    turn.refresh_from_db()
    assert (turn.status, turn.finish_reason) == (Turn.Status.FAILED, "agent_down")
    assert "Rig far cannot run this turn" in turn.error and "never reported" in turn.error
    # An agent that is back lets new turns through.
    agents.publish(key=KEY_A, rig_id=rig.pk, beat={"ts": time.time(), "host": "far", "instance": "i"}, sample=None)
    fresh = submit.turn_submit(session=session, text="again")
    fresh.refresh_from_db()
    assert fresh.dispatched_at is not None
    live.sync_client().delete(agents.beat_key(rig.pk))


# A rig with only a URL -----------------------------------------------------------------------------------------


@pytest.mark.llama
@pytest.mark.django_db
def test_a_rig_with_only_a_url_gets_what_http_gives_and_its_profiles_geometry_labelled_so(rig, monkeypatch):
    """The central side on another host than the backend (local_host=False): no host, process or GPU figure of its
    own, the weight size from the backend, the KV geometry from the profile an admin typed."""

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("read this host for a rig on another host")

    monkeypatch.setattr(host, "host_memory", forbidden)
    monkeypatch.setattr(gpus, "gpus", forbidden)
    no_profile = asyncio.run(services.sampler_for(rig, local_host=False).read())
    assert "type the model's geometry in the rig's profile" in no_profile.detail["sources"]["kv"]["error"]
    assert "run an agent beside it" in no_profile.detail["sources"]["host"]["error"]
    assert no_profile.detail["bandwidth"]["gbs"] is None
    profile = services.profile_for(rig)
    profile.model_layers, profile.model_kv_heads, profile.model_head_dim = 30, 3, 64
    profile.bandwidth_gbs, profile.bandwidth_source = 30.0, RigProfile.BandwidthSource.SETTING
    profile.full_clean()
    profile.save()
    sample = asyncio.run(services.sampler_for(rig, local_host=False).read())
    assert sample.series["kv_bytes_per_token"] == 23_040  # SmolLM2-135M at f16, as llama-server logs it
    assert sample.detail["provenance"]["kv"] == "the rig's profile (typed by an admin)"
    assert sample.series["weight_bytes"] > 90_000_000  # from the backend's model list
    assert sample.detail["bandwidth"]["gbs"] == 30.0


@pytest.mark.django_db
def test_a_profile_with_impossible_geometry_is_refused(rig):
    from django.core.exceptions import ValidationError

    profile = services.profile_for(rig)
    profile.model_layers, profile.model_kv_heads, profile.model_head_dim = 0, 3, 64
    with pytest.raises(ValidationError):
        profile.full_clean()
    profile.model_layers, profile.model_head_dim = 30, None
    with pytest.raises(ValidationError, match="together"):
        profile.full_clean()


# Bandwidth per device ----------------------------------------------------------------------------------------


def test_the_roofline_takes_the_gpus_peak_where_the_weights_are_in_its_memory(db):
    from monitoring.sampling import RigSampler

    rig = Rig(pk=1, name="g", kind=Rig.Kind.OLLAMA, base_url="http://127.0.0.1:1", queue="rig.g")
    gpu = {
        "name": "NVIDIA H200",
        "memory_bandwidth_gbs": 4814.3,
        "bandwidth_source": "memory clock x bus width (NVML peak)",
    }
    on_gpu = {"gpus": [gpu], "placement": {"vram_fraction": 1.0}}
    cpu = RigSampler(rig=rig, bandwidth_gbs=25.0, bandwidth_source="probe", local_host=True)
    assert cpu._bandwidth(on_gpu)["gbs"] == 4814.3 and "NVML" in cpu._bandwidth(on_gpu)["source"]
    assert cpu._bandwidth({"gpus": [gpu], "placement": {"vram_fraction": 0.0}})["gbs"] == 25.0  # weights in RAM
    admin = RigSampler(rig=rig, bandwidth_gbs=900.0, bandwidth_source="setting", local_host=False)
    assert admin._bandwidth(on_gpu) == {"gbs": 900.0, "source": "set by an admin in the rig's profile"}
    remote = RigSampler(rig=rig, bandwidth_gbs=25.0, bandwidth_source="probe", local_host=False)
    assert remote._bandwidth({})["gbs"] is None  # the probe measured another host: not the rig's figure


# In the browser ------------------------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_the_overview_shows_both_rigs_and_each_rig_page_fills_from_its_agent(
    two_rigs, web_url, sampler_process, admin_user, tmp_path
):
    """The central sampler process, two agents, Chromium: both rigs on the overview, each dashboard filled from its own
    agent, and each sample's way from the agent's reading to the page (sample-to-browser delay) measured."""
    from playwright.sync_api import sync_playwright

    from tests.test_browser import CHROMIUM, login

    rig_a, rig_b, _ = two_rigs
    for rig in (rig_a, rig_b):
        wait_until(lambda r=rig: agents.agent_state(r.pk, r.agent_key).up, timeout_s=60, what=f"{rig.name}'s agent")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs a loop in this thread
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
        page.set_default_timeout(30_000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        delays: list[float] = []

        def on_socket(ws: Any) -> None:
            def frame(payload: Any) -> None:
                message = json.loads(payload)
                sampled = (message.get("sample") or {}).get("detail", {}).get("agent_sampled_at")
                if message.get("type") == "rig.sample" and sampled:
                    delays.append(time.time() - sampled)

            ws.on("framereceived", frame)

        login(page, web_url, "admin")
        page.goto(f"{web_url}/monitoring/")
        for rig in (rig_a, rig_b):
            page.wait_for_selector(f"text={rig.name}")
        page.on("websocket", on_socket)
        page.goto(f"{web_url}/monitoring/rigs/{rig_b.pk}/")
        page.wait_for_selector("[data-testid=agent-state][data-state=up]")
        page.wait_for_selector("[data-testid=kv-facts]:has-text('geometry from the GGUF')")
        assert "host figures from agent on" in page.get_by_test_id("placement").inner_text()
        assert "set by an admin" in page.get_by_test_id("roofline").inner_text()
        for _ in range(100):  # the sync API hands over frames only while it waits itself
            if len(delays) >= 6:
                break
            page.wait_for_timeout(500)
        page.screenshot(path=str(tmp_path / "agent-rig.png"), full_page=True)
        browser.close()
    assert len(delays) >= 6, delays  # an idle rig is sampled every 5 s
    delays.sort()
    p95 = delays[int(0.95 * (len(delays) - 1))]
    print(f"sample-to-browser delay over {len(delays)} samples: p50 {delays[len(delays) // 2]:.2f} s, p95 {p95:.2f} s")
    assert p95 <= 2.0, delays
    assert errors == []


# Keys from the environment, and from the database (docker-compose.yml's bundled agents) ----------------------------


@pytest.mark.django_db
def test_an_agent_without_a_usable_key_stops_at_once_saying_why(monkeypatch):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    Rig.objects.create(name="keyed", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", agent_key=KEY_A)
    for value in (None, "", "  \n"):  # unset, empty (`RIGDASH_AGENT_KEY=` in .env), only a pasted newline
        if value is None:
            monkeypatch.delenv("RIGDASH_AGENT_KEY", raising=False)
        else:
            monkeypatch.setenv("RIGDASH_AGENT_KEY", value)
        with pytest.raises(CommandError, match="RIGDASH_AGENT_KEY is not set"):
            call_command("rigdash_agent", "--rig", "keyed", "--no-worker")
    monkeypatch.setenv("RIGDASH_AGENT_KEY", KEY_B)
    with pytest.raises(CommandError, match="is not the agent key of rig 'keyed'"):
        call_command("rigdash_agent", "--rig", "keyed", "--no-worker")
    with pytest.raises(CommandError, match="RIGDASH_AGENT_KEY and --key-from-database both given"):
        call_command("rigdash_agent", "--rig", "keyed", "--no-worker", "--key-from-database")
    monkeypatch.delenv("RIGDASH_AGENT_KEY")
    with pytest.raises(CommandError, match=r"no rig named 'nope' \(rigs: keyed\)"):
        call_command("rigdash_agent", "--rig", "nope", "--no-worker", "--key-from-database")


@pytest.mark.django_db
def test_a_bundled_agent_issues_its_rig_s_key_once_and_then_uses_the_current_one():
    from monitoring import agent

    rig = Rig.objects.create(name="bundled", kind=Rig.Kind.LLAMACPP, base_url="http://llamacpp:8080")
    first = agent.key_from_database("bundled")
    rig.refresh_from_db()
    assert len(first) >= 40 and rig.agent_key == first
    assert agent.key_from_database("bundled") == first, "a restart keeps the key"
    Rig.objects.filter(pk=rig.pk).update(agent_key=KEY_B)  # an admin rotated it (board, rigdash_agent_key --new)
    assert agent.key_from_database("bundled") == KEY_B
    assert agent.rig_for_agent("bundled", agent.key_from_database("bundled")).pk == rig.pk
    assert agent.key_from_database("missing") == ""
