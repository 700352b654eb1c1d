"""Energy per decoded token: the rig's energy account in Redis (inference/live/energy.py), written by the sampler
from its GPUs' power and decode rate, and each turn's share read by the real worker at its start and end.

No GPU runs here: the sampler's GPU readings are mocked (a GpuReading with a power figure, as NVML or amdsmi give
it); Redis, the worker, llama-server and the sampler are real."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inference.live import energy
from inference.live import state as live
from inference.models import Turn
from inference.turns import submit
from monitoring import gpus, sampler
from monitoring.gpus import GpuReading, GpuSurvey
from tests.conftest import wait_until

GIB = 1024**3


def _mark(joules: float | None, tokens: float | None, why: str = "") -> energy.EnergyMark:
    return energy.EnergyMark(joules=joules, tokens=tokens, why=why)


def test_a_turns_energy_is_the_joules_over_the_tokens_between_its_marks():
    assert energy.turn_energy(_mark(100.0, 50.0), _mark(400.0, 250.0)) == {"energy_j_per_token": 1.5, "energy_j": 300.0}
    assert "not measurable: no GPU" in energy.turn_energy(_mark(None, None), _mark(None, None, "no GPU"))["energy_note"]
    assert "no decoding" in energy.turn_energy(_mark(1.0, 1.0), _mark(2.0, 1.5))["energy_note"]
    assert "not measured on this rig yet" in energy.turn_energy(_mark(None, None), _mark(5.0, 5.0))["energy_note"]


def test_the_account_adds_power_times_interval_and_skips_a_gap_the_sampler_was_away(settings):
    client = live.sync_client()
    rig_id = 987_654
    client.delete(energy.energy_key(rig_id))
    energy.energy_add(client, rig_id, watts=200.0, decode_tps=50.0, interval_s=2.0)
    energy.energy_add(client, rig_id, watts=200.0, decode_tps=50.0, interval_s=energy.MAX_INTERVAL_S + 1)
    mark = asyncio.run(_read(rig_id))
    assert (mark.joules, mark.tokens, mark.why) == (400.0, 100.0, "")
    energy.energy_add(client, rig_id, watts=None, decode_tps=0.0, interval_s=1.0, why="no GPU reports its power draw")
    assert asyncio.run(_read(rig_id)).why == "no GPU reports its power draw"
    client.delete(energy.energy_key(rig_id))


async def _read(rig_id: int) -> energy.EnergyMark:
    from inference.worker import loop

    return await energy.energy_mark(loop.redis_for_loop(), rig_id)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_turn_through_the_real_worker_stores_its_energy_per_token(celery_worker, chat_session, monkeypatch):
    """The sampler runs beside the turn with a 150 W GPU (mocked) holding the backend: the turn's stats get
    energy_j_per_token = the joules the account gained over the tokens the rig decoded meanwhile."""
    reading = GpuReading(vendor="nvidia", index=0, name="H100 (mocked)", memory_total_bytes=80 * GIB,
                         memory_used_bytes=1 * GIB, power_w=150.0, memory_bandwidth_gbs=3350.0,
                         process_memory_bytes=1 * GIB)  # fmt: skip
    monkeypatch.setattr(gpus, "gpus", lambda pid=None: GpuSurvey(readings=[reading]))
    live.sync_client().delete(energy.energy_key(chat_session.rig_id))
    stop = threading.Event()

    def sample_until_stopped() -> None:
        async def run() -> None:
            task = asyncio.create_task(sampler.rig_loop(chat_session.rig_id, interval_s=0.2))
            await asyncio.to_thread(stop.wait)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        asyncio.run(run())

    thread = threading.Thread(target=sample_until_stopped, daemon=True)
    thread.start()
    try:
        wait_until(lambda: live.sync_client().hget(energy.energy_key(chat_session.rig_id), "joules"), timeout_s=30,
                   what="the sampler's first energy interval")  # fmt: skip
        turn = submit.turn_submit(
            session=chat_session, text="Count from one to forty in words.", params={"max_tokens": 120, "temperature": 0}
        )
        wait_until(lambda: Turn.objects.get(pk=turn.pk).status not in Turn.ACTIVE, timeout_s=90, what="the turn's end")
    finally:
        stop.set()
        thread.join(30)
    stats = Turn.objects.get(pk=turn.pk).stats
    assert stats.get("energy_j_per_token"), stats.get("energy_note")
    # 150 W over the rig's rate: SmolLM2 decodes tens to ~150 tokens/s here, so 1-15 J per token.
    assert 0.5 < stats["energy_j_per_token"] < 20, stats
