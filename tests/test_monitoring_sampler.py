"""Collectors and the sampler against the real llama-server, the real database and the real channel layer."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference import events
from inference.models import Rig, Turn
from inference.turns import submit
from monitoring import sampler, services
from monitoring.gpus import gpus
from monitoring.models import RigProfile, RigSample
from monitoring.sampling import RigSampler, Sample, is_idle
from tests.conftest import free_port, llama_busy_slots, session_cookie_for, wait_until
from tests.ollama_replay import ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.wsclient import MonitorSocket


def _generate_in_background(llama_url: str, tokens: int = 400) -> threading.Thread:
    def run() -> None:
        body = {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": tokens,
                "temperature": 0.8, "seed": 3, "stream": True}  # fmt: skip
        with httpx.stream("POST", f"{llama_url}/v1/chat/completions", json=body, timeout=60) as response:
            for _ in response.iter_lines():
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _decoded(llama_url: str) -> int:
    slots = httpx.get(f"{llama_url}/slots").json()
    return max(
        ((s.get("next_token") or [{}])[0].get("n_decoded", 0) for s in slots if s.get("is_processing")), default=0
    )


async def _take(rig: Rig, ticks: int = 1, pause_s: float = 0.5) -> list:
    state = RigSampler(rig=rig, bandwidth_gbs=25.0)
    samples = []
    for _ in range(ticks):
        samples.append(await state.take())
        await asyncio.sleep(pause_s)
    return samples


@pytest.mark.llama
@pytest.mark.django_db
def test_sample_of_a_decoding_rig_has_slots_kv_memory_and_roofline(rig, llama_url):
    thread = _generate_in_background(llama_url, tokens=600)
    wait_until(lambda: _decoded(llama_url) >= 3, timeout_s=60, what="llama-server to start decoding")
    samples = asyncio.run(_take(rig, ticks=4, pause_s=0.5))
    thread.join(timeout=60)
    last = samples[-1]
    sources = last.detail["sources"]
    assert sources["backend"]["ok"] and sources["kv"]["ok"] and sources["host"]["ok"], sources
    decoding = [slot for slot in last.detail["slots"] if slot["phase"] == "decoding"]
    assert len(decoding) == 1
    slot = decoding[0]
    assert slot["context_tokens"] > slot["decoded"] > 0
    assert slot["kv_bytes"] == slot["context_tokens"] * 23_040
    assert 0 < slot["fill"] < 1 and slot["n_ctx"] == 2048
    # A rate from /slots between two ticks (0 is possible on a starved machine: some tick must see decoding).
    rates = [sl["decode_tps"] for smp in samples for sl in smp.detail["slots"] if sl["phase"] == "decoding"]
    assert any(rate and rate > 1 for rate in rates), rates
    assert last.series["kv_allocated_bytes"] == 4096 * 23_040
    assert last.series["decode_tps"] == pytest.approx(slot["decode_tps"] or 0, rel=1e-3)
    assert last.series["llamacpp_tokens_predicted_total"] >= 0
    assert last.series["host_total_bytes"] > last.series["host_used_bytes"] > 0
    assert last.series["backend_rss_bytes"] > 50 * 2**20  # the model is mapped into llama-server
    assert last.series["weight_bytes"] > 50e6
    assert last.series["bound_tps"] > 0 and last.series.get("roofline_ratio", 0) < 1.5
    assert last.detail["placement"]["label"].startswith("CPU only") or last.detail["gpus"]


@pytest.mark.django_db
def test_each_tick_reads_the_rigs_active_turns_afresh_in_order(owner, other_user):
    """The query is built once per rig (inference.turns.selectors._active_turns_query); what it finds must not be."""
    from inference.models import ChatSession
    from inference.turns.selectors import rig_active_turns as _active_turns

    box = Rig.objects.create(name="box", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue="q.box")
    elsewhere = Rig.objects.create(name="else", kind="llamacpp", base_url="http://127.0.0.1:1", queue="q.else")
    mine = ChatSession.objects.create(owner=owner, rig=box, model_name="m1")
    theirs = ChatSession.objects.create(owner=other_user, rig=box, model_name="m2")
    first = Turn.objects.create(session=mine, user_text="a", status=Turn.Status.DECODING)
    Turn.objects.create(session=mine, user_text="b", status=Turn.Status.DONE)
    Turn.objects.create(session=ChatSession.objects.create(owner=owner, rig=elsewhere, model_name="m"), user_text="c")
    assert [(t["id"], t["user"], t["model"]) for t in _active_turns(box.pk)] == [(first.pk, owner.username, "m1")]
    second = Turn.objects.create(session=theirs, user_text="d")  # queued
    assert [(t["id"], t["status"]) for t in _active_turns(box.pk)] == [(first.pk, "decoding"), (second.pk, "queued")]
    Turn.objects.filter(pk=first.pk).update(status=Turn.Status.DONE)
    assert [t["id"] for t in _active_turns(box.pk)] == [second.pk]
    assert [t["user"] for t in _active_turns(elsewhere.pk)] == [owner.username]


@pytest.mark.django_db
def test_queue_depth_counts_the_tasks_waiting_in_the_rigs_celery_queue():
    """Tasks sent the way dispatch sends them, to a queue no worker reads: the sampler's one LLEN must see them."""
    import os

    import redis

    from inference.tasks import turns_run_task

    queue = f"q.depth-{os.getpid()}"
    rig = Rig.objects.create(name="deep", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue=queue)
    try:
        for _ in range(2):
            turns_run_task.apply_async(args=[[0]], queue=queue)
        assert asyncio.run(_take(rig))[0].series["queue_depth"] == 2
    finally:
        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)


@pytest.mark.django_db
def test_a_down_backend_is_reported_unavailable_with_its_reason():
    rig = Rig.objects.create(name="down", kind="llamacpp", base_url=f"http://127.0.0.1:{free_port()}", queue="q.d")
    sample = asyncio.run(_take(rig))[0]
    backend = sample.detail["sources"]["backend"]
    assert backend["ok"] is False and "unreachable" in backend["error"]
    assert sample.detail["sources"]["host"]["ok"]  # the other sources still report
    assert "decode_tps" not in sample.series


def test_gpus_are_read_where_a_gpu_exists():
    survey = gpus()
    if not survey.readings:
        pytest.skip(f"no GPU on this machine: {survey.why_none}")
    assert all((g.memory_total_bytes or 0) >= (g.memory_used_bytes or 0) > 0 for g in survey.readings)


@pytest.mark.django_db
def test_without_a_gpu_memory_falls_back_to_system_ram(rig):
    if gpus().readings:
        pytest.skip("this machine has a GPU: the fallback is not taken")
    sample = asyncio.run(_take(rig))[0]
    assert sample.detail["sources"]["gpu"]["ok"] is False
    assert "no GPU" in sample.detail["sources"]["gpu"]["error"]
    assert sample.series["host_total_bytes"] > 0
    assert sample.detail["placement"] == {
        "vram_fraction": 0.0, "spill": False, "label": "CPU only: weights and KV cache in system RAM",
    }  # fmt: skip


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
async def test_samples_are_stored_and_pushed_live_through_the_channel_layer(rig, owner):
    await RigProfile.objects.acreate(rig=rig, bandwidth_gbs=20.0, bandwidth_source="setting")
    cookie = await sync_to_async(session_cookie_for)(owner)
    sock = MonitorSocket(f"/ws/monitoring/rigs/{rig.pk}/", cookie)
    overview = MonitorSocket("/ws/monitoring/", cookie)  # every rig's samples
    assert (await sock.connect())[0] and (await overview.connect())[0]
    await sampler.rig_loop(rig.pk, interval_s=0.2, ticks=3)
    frames = [await sock.recv() for _ in range(3)]
    overview_frames = [await overview.recv() for _ in range(3)]
    await sock.close()
    await overview.close()
    assert [f["type"] for f in frames] == ["rig.sample"] * 3
    # The overview gets each sample with only what its rows show (monitoring/consumers.py, overview_frame).
    assert [(f["rig"], f["sample"]["ts"], f["sample"]["series"]) for f in overview_frames] == [
        (f["rig"], f["sample"]["ts"], f["sample"]["series"]) for f in frames
    ]
    assert [f["sample"]["detail"]["sources"] for f in overview_frames] == [
        {"backend": f["sample"]["detail"]["sources"]["backend"]} for f in frames
    ]
    assert "slots" in frames[0]["sample"]["detail"] and "slots" not in overview_frames[0]["sample"]["detail"]
    assert all(f["rig"] == rig.pk and f["sample"]["detail"]["sources"]["backend"]["ok"] for f in frames)
    stored = [s async for s in RigSample.objects.filter(rig=rig).order_by("ts")]
    assert len(stored) == 3
    assert [s.ts.timestamp() for s in stored] == pytest.approx([f["sample"]["ts"] for f in frames])


@pytest.mark.django_db(transaction=True)
def test_a_hung_rig_does_not_block_another_and_a_crash_is_restarted(rig, silent_server, monkeypatch, caplog):
    hung = Rig.objects.create(name="hung", kind="llamacpp", base_url=silent_server, queue="q.h")
    original = RigSampler.read
    crashed = []

    async def read_crashing_once(self):
        if self.rig.pk == rig.pk and not crashed:
            crashed.append(1)
            raise RuntimeError("collector bug")
        return await original(self)

    monkeypatch.setattr(RigSampler, "read", read_crashing_once)
    monkeypatch.setattr(sampler, "RESTART_DELAY_S", 0.1)
    monkeypatch.setattr(
        settings,
        "RIGDASH",
        type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "sample_interval_s": 0.25, "sample_idle_interval_s": 0.25}),
    )  # the healthy rig is idle: at the full pace too

    async def run_for(seconds: float) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.run(stop=stop))
        await asyncio.sleep(seconds)
        stop.set()
        await task

    with caplog.at_level(logging.ERROR, logger="monitoring.sampler"):
        asyncio.run(run_for(3.0))
    assert "crashed; restarting" in caplog.text
    good = RigSample.objects.filter(rig=rig).count()
    assert good >= 5, f"the healthy rig got only {good} samples in 3 s at 4 Hz"
    hung_samples = list(RigSample.objects.filter(rig=hung))
    assert hung_samples and not hung_samples[-1].detail["sources"]["backend"]["ok"]


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_rig_saved_while_the_sampler_runs_is_picked_up_at_once(rig, llama_url, monkeypatch):
    """The sampler reads its list of rigs only every RIG_REFRESH_S (30 s); a rig saved through the ORM reaches it
    through the channel layer (inference.signals, inference.events.rigs_changed_sync), added or disabled."""
    assert sampler.RIG_REFRESH_S >= 30
    monkeypatch.setattr(
        settings,
        "RIGDASH",
        type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "sample_interval_s": 0.25, "sample_idle_interval_s": 0.25}),
    )

    def add_rig() -> Rig:
        with transaction.atomic():  # the announcement goes out once both rows are committed
            late = Rig.objects.create(name="late", kind="llamacpp", base_url=llama_url, queue="q.late")
            RigProfile.objects.create(rig=late, bandwidth_gbs=20.0, bandwidth_source="setting")
        return late

    def disable(late: Rig) -> None:
        late.enabled = False
        late.save()

    async def scenario() -> tuple[float, int]:
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.run(stop=stop))
        try:
            deadline = time.monotonic() + 20
            while not await RigSample.objects.filter(rig=rig).aexists() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the first list is read and the listener subscribed
            added_at = time.monotonic()
            late = await sync_to_async(add_rig)()
            while not await RigSample.objects.filter(rig=late).aexists() and time.monotonic() - added_at < 20:
                await asyncio.sleep(0.05)
            took = time.monotonic() - added_at
            await sync_to_async(disable)(late)
            await asyncio.sleep(0.5)  # the change reaches the sampler, which cancels the rig's loop
            before = await RigSample.objects.filter(rig=late).acount()
            await asyncio.sleep(1.5)  # six ticks at 4 Hz
            after = await RigSample.objects.filter(rig=late).acount()
            return took, after - before
        finally:
            stop.set()
            await task

    took, after_disabled = asyncio.run(scenario())
    assert took < 5, f"the new rig's first sample came {took:.1f} s after it was saved"
    assert after_disabled == 0, f"a disabled rig got {after_disabled} samples"


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_profile_changed_while_the_sampler_runs_restarts_its_rigs_loop(rig, monkeypatch):
    """A rig's profile edited in its page (monitoring/profiles.py) reaches the running sampler at once: the rig's
    loop starts afresh with the new bandwidth, named as an admin's."""
    from monitoring import profiles, services

    monkeypatch.setattr(
        settings,
        "RIGDASH",
        type(settings.RIGDASH)(**{**vars(settings.RIGDASH), "sample_interval_s": 0.25, "sample_idle_interval_s": 0.25}),
    )
    profile = services.profile_for(rig)
    profile.bandwidth_gbs, profile.bandwidth_source = 11.0, "probe"
    profile.save()

    def edit() -> None:
        form = profiles.RigProfileForm(
            {"kv_cache_type": "f16", "bandwidth_gbs": 777}, instance=services.profile_for(rig)
        )
        assert form.is_valid(), form.errors
        profiles.profile_save(actor=None, form=form)

    async def scenario() -> dict[str, Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.run(stop=stop))
        try:
            deadline = time.monotonic() + 20
            while not await RigSample.objects.filter(rig=rig).aexists() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            await sync_to_async(edit)()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                latest = await RigSample.objects.filter(rig=rig).order_by("-ts").afirst()
                if latest is not None and latest.detail.get("bandwidth", {}).get("gbs") == 777:
                    return latest.detail["bandwidth"]
                await asyncio.sleep(0.1)
            return {}
        finally:
            stop.set()
            await task

    assert asyncio.run(scenario()) == {"gbs": 777.0, "source": "set by an admin in the rig's profile"}


@pytest.mark.django_db
def test_downsampling_averages_minutes_and_retention_prunes(rig):
    base = (timezone.now() - timedelta(days=3)).replace(second=0, microsecond=0)
    for minute in range(3):
        for second in range(0, 60, 10):
            series = {"decode_tps": float(minute * 10 + second / 10), "busy_slots": 1.0}
            RigSample.objects.create(rig=rig, ts=base + timedelta(minutes=minute, seconds=second), series=series)
    RigSample.objects.create(rig=rig, ts=base + timedelta(minutes=1, seconds=5), series={"busy_slots": 3.0})
    assert services.samples_downsample() == 3
    assert services.samples_downsample() == 0  # a second run makes nothing twice
    minutes = list(RigSample.objects.filter(rig=rig, resolution_s=60).order_by("ts"))
    assert [m.ts for m in minutes] == [base + timedelta(minutes=i) for i in range(3)]
    assert minutes[1].series["decode_tps"] == pytest.approx(12.5)  # mean of 10..15, the gap row not counted
    assert minutes[1].series["busy_slots"] == pytest.approx((6 * 1 + 3) / 7)
    removed = services.samples_prune(raw_retention=timedelta(days=1), downsampled_retention=timedelta(days=30))
    assert removed == 19
    assert RigSample.objects.filter(rig=rig, resolution_s=1).count() == 0
    assert RigSample.objects.filter(rig=rig, resolution_s=60).count() == 3
    services.samples_prune(raw_retention=timedelta(days=1), downsampled_retention=timedelta(days=2))
    assert RigSample.objects.filter(rig=rig).count() == 0


def test_bandwidth_probe_measures_something_plausible():
    gbs = services.bandwidth_probe_gbs(size_bytes=64 * 2**20, repeats=2)
    assert 0.5 < gbs < 2000


@pytest.mark.django_db
def test_an_ollama_rig_is_sampled_from_ps_and_show(ollama):
    """Ollama cannot run here: the protocol replay of its API (tests/ollama_replay.py) stands in."""
    import asyncio as aio

    from inference.backends.ollama import OllamaBackend

    rig = Rig.objects.create(name="oll", kind="ollama", base_url=ollama.url, queue="rig.oll")
    empty = aio.run(_take(rig))[0]
    assert empty.detail["sources"]["backend"]["ok"] and empty.series["loaded_models"] == 0
    assert empty.detail["sources"]["kv"]["ok"] is False

    async def load() -> None:  # a short chat loads the model, as Ollama does
        from inference.backends.base import ChatRequest

        request = ChatRequest(model="smollm2:135m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        async for _ in OllamaBackend(ollama.url).stream_chat(request):
            pass

    aio.run(load())
    sample = aio.run(_take(rig))[0]
    (model,) = sample.detail["loaded_models"]
    assert model["name"] == "smollm2:135m" and model["size_vram_bytes"] == 0 and model["cpu_fraction"] == 1
    assert sample.series["kv_bytes_per_token"] == 23_040  # from /api/show's llama.* keys
    assert model["arch"]["block_count"] == 30 and model["arch"]["head_count_kv"] == 3  # kept for the calculator
    # One sequence (OLLAMA_NUM_PARALLEL's default; the rig's slots are RigDash's, not Ollama's), and the weights are
    # the model's file, not /api/ps size (weights + KV + compute buffers): tests/test_ollama_rules.py.
    assert model["parallel"] == 1 and sample.series["kv_allocated_bytes"] == 23_040 * model["context_length"]
    assert sample.series["weight_bytes"] == model["weight_bytes"] == 105_000_000 < model["size_bytes"]
    assert sample.detail["placement"]["vram_fraction"] == 0.0
    assert "0% of the loaded models in VRAM" in sample.detail["placement"]["label"]


def _sample(**series: float) -> Sample:
    return Sample(ts=0.0, series=series, detail={})


def test_a_rig_is_idle_only_when_nothing_on_it_moves():
    assert is_idle(_sample(active_turns=0, queue_depth=0, busy_slots=0, deferred_requests=0))
    assert is_idle(_sample(active_turns=0, queue_depth=0))  # an Ollama rig, or a backend that is down
    for busy in ("active_turns", "queue_depth", "busy_slots", "deferred_requests"):
        series = {"active_turns": 0.0, "queue_depth": 0.0, "busy_slots": 0.0, "deferred_requests": 0.0, busy: 1.0}
        assert not is_idle(_sample(**series)), busy
    assert not is_idle(_sample(busy_slots=0))  # the queue and turns could not be read: keep the full pace


async def _idle_llama(llama_url: str) -> None:
    """Another test's background generation may still hold a slot: this test needs the rig idle."""
    await sync_to_async(wait_until)(lambda: llama_busy_slots(llama_url) == 0, timeout_s=60, what="llama-server idle")


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
async def test_an_idle_rig_is_sampled_less_often_until_a_worker_says_a_turn_is_decoding(rig, llama_url):
    """Real llama-server, database and channel layer: the wake-up goes through inference.events as a worker's does."""
    await _idle_llama(llama_url)
    wakes: dict[int, asyncio.Event] = {}
    subscribed = asyncio.Event()
    listener = asyncio.create_task(sampler.listen(wakes, subscribed=subscribed))
    await asyncio.wait_for(subscribed.wait(), timeout=10)
    wake = wakes.setdefault(rig.pk, asyncio.Event())
    loop = asyncio.create_task(sampler.rig_loop(rig.pk, interval_s=0.2, idle_interval_s=30.0, wake=wake))
    try:

        async def stored() -> int:
            return await RigSample.objects.filter(rig=rig).acount()

        deadline = time.monotonic() + 20
        while await stored() < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await stored() == 1
        await asyncio.sleep(1.0)  # five ticks at the full pace
        assert await stored() == 1, "an idle rig was sampled at the full pace"

        woken_at = time.monotonic()
        await events.rig_decoding(rig_id=rig.pk)
        while await stored() < 2 and time.monotonic() - woken_at < 10:
            await asyncio.sleep(0.02)
        assert await stored() == 2, "the wake-up did not bring a sample"
        assert time.monotonic() - woken_at < 5  # not the idle interval's 30 s
    finally:
        for task in (loop, listener):
            task.cancel()
        await asyncio.gather(loop, listener, return_exceptions=True)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
async def test_a_busy_rig_keeps_the_full_pace(rig, llama_url):
    await _idle_llama(llama_url)
    generation = _generate_in_background(llama_url, tokens=400)
    await sync_to_async(wait_until)(lambda: llama_busy_slots(llama_url) > 0, timeout_s=30, what="a busy slot")
    started = time.monotonic()
    await sampler.rig_loop(rig.pk, interval_s=0.2, ticks=4, idle_interval_s=30.0, wake=asyncio.Event())
    assert time.monotonic() - started < 10
    stored = [s async for s in RigSample.objects.filter(rig=rig).order_by("ts")]
    assert len(stored) == 4 and stored[0].series["busy_slots"] >= 1
    await sync_to_async(generation.join)(60)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
async def test_the_worker_wakes_the_sampler_once_its_turn_has_a_first_token(celery_worker, chat_session):

    wakes: dict[int, asyncio.Event] = {}
    subscribed = asyncio.Event()
    listener = asyncio.create_task(sampler.listen(wakes, subscribed=subscribed))
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=10)
        wake = wakes.setdefault(chat_session.rig_id, asyncio.Event())
        turn = await sync_to_async(submit.turn_submit)(
            session=chat_session, text="Say hi.", params={"max_tokens": 8, "temperature": 0}
        )
        await asyncio.wait_for(wake.wait(), timeout=30)
        woken = await Turn.objects.aget(pk=turn.pk)
        # Not while llama-server reads the prompt: the turn was marked decoding before the wake-up went out.
        assert woken.status in (Turn.Status.DECODING, Turn.Status.DONE), woken.status
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    await sync_to_async(wait_until)(
        lambda: Turn.objects.get(pk=turn.pk).status not in Turn.ACTIVE, timeout_s=60, what="the turn's end"
    )


@pytest.mark.llama
@pytest.mark.django_db
def test_a_sample_keeps_the_models_the_server_holds_for_placement(rig, model_name):
    """The real llama-server holds its one model: the sampler keeps that name where placement reads it."""
    from inference.live import served

    served.loaded_store(rig.pk, None)
    asyncio.run(_take(rig, ticks=1, pause_s=0))
    loaded = served.loaded_get_many([rig.pk])[rig.pk]
    assert loaded is not None and model_name in loaded
