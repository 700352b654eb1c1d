"""The sampler process: one supervised loop per enabled rig, sampling every RIGDASH_SAMPLE_INTERVAL_S.

An idle rig (``sampling.is_idle``: no busy slot, no turn waiting or running, an empty queue) is sampled every
RIGDASH_SAMPLE_IDLE_INTERVAL_S instead: with nothing moving, its dashboards lose nothing, and the sampler's
reads and the dashboards' frames are most of an idle RigDash's CPU. A worker whose turn gets
its first token says so (``inference.events.rig_decoding``), and the rig is sampled at once and at the full pace
from then on. A turn whose prompt takes longer than the idle interval is seen at the next idle tick.

A tick reads the backend and the host from the event loop, then makes one hop to the database's thread for the
rig's queue and turns, the sample's store and its publication. A rig saved or deleted through the ORM is picked
up at once (``inference.events.rigs_changed_sync``); the list of rigs is also read every RIG_REFRESH_S.

A rig that is down only slows its own loop (each backend read has a sub-second timeout); a loop that
crashes is logged and restarted. Every minute, raw samples are downsampled and old ones pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from redis.exceptions import RedisError

from inference import events
from inference.live import agents
from inference.models import Rig
from monitoring import queues, services
from monitoring.alerts import delivery as alert_delivery
from monitoring.alerts import services as alert_rules
from monitoring.sampling import RigSampler, Sample, is_idle, is_local

log = logging.getLogger(__name__)
RESTART_DELAY_S = 2.0
MAINTENANCE_EVERY_S = 60.0
# How soon a rig changed without a signal (a queryset update, another database client) is noticed. A rig saved or
# deleted through the ORM is noticed at once (inference.events.rigs_changed_sync), so the list is read rarely.
RIG_REFRESH_S = 30.0
GOLDEN = 0.6180339887498949


def phase_s(rig_id: int, interval_s: float) -> float:
    """Where in each interval a rig's ticks fall, spread by its id in golden-ratio steps: many rigs' ticks do not all
    queue for the one database thread at the same moment (which delayed the last rig's sample by every other rig's
    store and publication)."""
    return (rig_id * GOLDEN) % 1.0 * interval_s


def _rig_setup(rig_id: int) -> RigSampler | None:
    rig = Rig.objects.filter(pk=rig_id, enabled=True).first()
    if rig is None:
        return None
    return services.sampler_for(rig, local_host=is_local(rig))


async def read(sampler: RigSampler) -> Sample:
    """This tick's reading of the rig: its agent's latest sample while the agent is up and its signature holds
    (inference/live/agents.py), else what this process can read of the backend over HTTP."""
    rig = sampler.rig
    if not rig.agent_key:
        return await sampler.read()
    agent = await asyncio.to_thread(agents.agent_state, rig.pk, rig.agent_key)
    sample = None
    if agent.up:
        try:
            payload = await asyncio.to_thread(agents.latest_sample, rig.pk, rig.agent_key)
            if payload is not None:
                sample = Sample(ts=time.time(), series=dict(payload["series"]), detail=dict(payload["detail"]))
                sample.detail["agent_sampled_at"] = payload.get("ts")
        except (ValueError, KeyError, TypeError) as exc:
            agent = dataclasses.replace(agent, up=False, error=str(exc))
    if sample is None:
        sample = await sampler.read()
    sample.detail["agent"] = agent.as_dict()
    sample.detail.setdefault("provenance", {})["host"] = (
        f"agent on {agent.host}" if sample.detail.get("agent_sampled_at") else None
    )
    return sample


def _complete_store_publish(sampler: RigSampler, rig_id: int, sample: Sample) -> Sample:
    """The blocking part of a tick, in one hop to the database's thread: the rig's queue and turns, the store,
    then the publication to its dashboards (after the store, so that a dashboard that opens in between finds the
    sample in the database or gets it live)."""
    sampler.complete(sample)
    services.sample_store(rig_id=rig_id, sample=sample)
    services.sample_publish(rig_id=rig_id, sample=sample)
    alert_rules.sample_evaluate(rig=sampler.rig, series=sample.series, detail=sample.detail)  # never raises
    try:
        sampler.energy_account(sample)
    except RedisError as exc:  # the account misses this interval; the sample is stored and shown all the same
        log.warning("rig %s: its energy account was not updated: %r", rig_id, exc)
    return sample


async def rig_loop(
    rig_id: int,
    interval_s: float,
    ticks: int | None = None,
    *,
    idle_interval_s: float | None = None,
    wake: asyncio.Event | None = None,
    phase: float = 0.0,
) -> None:
    """Sample a rig every ``interval_s``, the first after ``phase`` seconds; while it is idle, every
    ``idle_interval_s`` (None: never slower), or at once when ``wake`` is set."""
    sampler = await database_sync_to_async(_rig_setup)(rig_id)
    if sampler is None:
        return
    if phase > 0:
        await asyncio.sleep(phase)
    done = 0
    next_at = time.monotonic()
    config_at: float | None = None
    while ticks is None or done < ticks:
        if sampler.rig.agent_key and (config_at is None or time.monotonic() - config_at >= agents.CONFIG_EVERY_S):
            config_at = time.monotonic()
            try:  # the record its database-free agent builds its sampler from (inference/live/agents.py)
                await database_sync_to_async(services.agent_config_publish)(sampler.rig)
            except RedisError as exc:
                log.warning("rig %s: its agent's record was not written: %r", rig_id, exc)
        if wake is not None:
            wake.clear()  # a wake-up from here on is about this sample or later: it is not lost
        sample = await database_sync_to_async(_complete_store_publish)(sampler, rig_id, await read(sampler))
        await sampler.keep_served_models(sample)
        done += 1
        step = interval_s
        if idle_interval_s is not None and idle_interval_s > interval_s and is_idle(sample):
            step = idle_interval_s
        next_at += step
        delay = max(0.0, next_at - time.monotonic())
        if step == interval_s or wake is None:
            await asyncio.sleep(delay)
            continue
        try:
            await asyncio.wait_for(wake.wait(), timeout=delay)
            next_at = time.monotonic()  # woken: sample now, then at the full pace
        except TimeoutError:
            pass


async def supervise(
    rig_id: int,
    interval_s: float,
    *,
    idle_interval_s: float | None = None,
    wake: asyncio.Event | None = None,
    phase: float = 0.0,
) -> None:
    while True:
        try:
            await rig_loop(rig_id, interval_s, idle_interval_s=idle_interval_s, wake=wake, phase=phase)
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sampler of rig %s crashed; restarting in %.0f s", rig_id, RESTART_DELAY_S)
            await asyncio.sleep(RESTART_DELAY_S)


async def listen(
    wakes: dict[int, asyncio.Event],
    rigs_changed: asyncio.Event | None = None,
    subscribed: asyncio.Event | None = None,
) -> None:
    """Set a rig's wake event whenever a worker says a turn on it is decoding (``inference.events.rig_decoding``),
    and ``rigs_changed`` when a rig was saved or deleted (``inference.events.rigs_changed_sync``). Runs until
    cancelled; a failed read is retried, since the idle ticks and the rig list's refresh find everything meanwhile."""
    layer = get_channel_layer()
    channel = await layer.new_channel("sampler.")
    while True:
        try:
            await layer.group_add(events.RIG_ACTIVITY_GROUP, channel)
            if subscribed is not None:
                subscribed.set()
            while True:
                message = await layer.receive(channel)
                if message.get("type") == "rig.decoding" and isinstance(message.get("rig"), int):
                    wakes.setdefault(message["rig"], asyncio.Event()).set()
                elif message.get("type") == "rigs.changed" and rigs_changed is not None:
                    rigs_changed.set()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(layer.group_discard(events.RIG_ACTIVITY_GROUP, channel))
            raise
        except Exception:
            log.exception("the sampler's wake-ups failed; retrying in %.0f s", RESTART_DELAY_S)
            await asyncio.sleep(RESTART_DELAY_S)


def _maintenance() -> None:
    conf = settings.RIGDASH
    services.samples_downsample()
    services.samples_prune(
        raw_retention=timedelta(hours=conf.sample_raw_retention_h),
        downsampled_retention=timedelta(days=conf.sample_downsampled_retention_d),
    )


def _rig_configurations() -> dict[int, tuple[Any, ...]]:
    """Each enabled rig's id and what its sampler and its agent's record are made from (the rig and its profile):
    a change starts its loop afresh, which signs the record again at once."""
    rows = Rig.objects.filter(enabled=True).values_list(
        "pk", "kind", "base_url", "agent_key", "api_key", "name", "slots", "profile__kv_cache_type",
        "profile__bandwidth_gbs", "profile__bandwidth_source", "profile__model_layers", "profile__model_kv_heads",
        "profile__model_head_dim",
    )  # fmt: skip
    return {row[0]: tuple(row[1:]) for row in rows}


async def run(*, stop: asyncio.Event | None = None) -> None:
    conf = settings.RIGDASH
    loops: dict[int, asyncio.Task[None]] = {}
    started_with: dict[int, tuple[Any, ...]] = {}
    wakes: dict[int, asyncio.Event] = {}
    rigs_changed = asyncio.Event()
    listener = asyncio.create_task(listen(wakes, rigs_changed))
    prober = asyncio.create_task(probe_queues())
    last_maintenance = 0.0
    stop = stop or asyncio.Event()
    try:  # alert deliveries a stopped sampler left pending are sent again
        await database_sync_to_async(alert_delivery.deliveries_resume)()
    except Exception:
        log.exception("resuming pending alert deliveries failed")
    try:
        while not stop.is_set():
            rigs_changed.clear()  # a change from here on brings another refresh
            wanted = await database_sync_to_async(_rig_configurations)()
            for rig_id, config in wanted.items():  # a rig whose configuration changed starts afresh
                if rig_id in loops and started_with.get(rig_id) != config:
                    loops.pop(rig_id).cancel()
            for rig_id in wanted.keys() - loops.keys():
                started_with[rig_id] = wanted[rig_id]
                loops[rig_id] = asyncio.create_task(
                    supervise(
                        rig_id,
                        conf.sample_interval_s,
                        idle_interval_s=conf.sample_idle_interval_s,
                        wake=wakes.setdefault(rig_id, asyncio.Event()),
                        phase=phase_s(rig_id, conf.sample_interval_s),
                    )
                )
            for rig_id in set(loops) - wanted.keys():
                loops.pop(rig_id).cancel()
            if time.monotonic() - last_maintenance > MAINTENANCE_EVERY_S:
                last_maintenance = time.monotonic()
                try:
                    await database_sync_to_async(_maintenance)()
                except Exception:
                    log.exception("sample downsampling/pruning failed")
            await _first_of(stop, rigs_changed, timeout_s=RIG_REFRESH_S)
    finally:
        tasks = [*loops.values(), listener, prober]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def probe_queues(every_s: float = queues.CACHE_S) -> None:
    """Ask the workers which queues they consume every few seconds: each answer is recorded for the waiting turns'
    reasons (a chat page learns live that no worker serves its rig; inference/live/consumers.py)."""
    while True:
        try:
            await asyncio.to_thread(queues.consumers, max_age_s=0)
        except Exception:
            log.exception("asking the workers for their queues failed")
        await asyncio.sleep(every_s)


async def _first_of(*flags: asyncio.Event, timeout_s: float) -> None:
    """Return when any of ``flags`` is set, or after ``timeout_s``."""
    waiters = [asyncio.create_task(flag.wait()) for flag in flags]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
