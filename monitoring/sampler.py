"""The sampler process: one supervised loop per enabled rig, sampling every RIGDASH_SAMPLE_INTERVAL_S.

A rig that is down only slows its own loop (each backend read has a sub-second timeout); a loop that
crashes is logged and restarted. Every minute, raw samples are downsampled and old ones pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timedelta
from urllib.parse import urlparse

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from django.conf import settings

from inference.models import Rig
from monitoring import services
from monitoring.sampling import LOOPBACK, RigSampler

log = logging.getLogger(__name__)
RESTART_DELAY_S = 2.0
MAINTENANCE_EVERY_S = 60.0
RIG_REFRESH_S = 2.0  # how soon a new or disabled rig is noticed


def _rig_setup(rig_id: int) -> RigSampler | None:
    rig = Rig.objects.filter(pk=rig_id, enabled=True).first()
    if rig is None:
        return None
    profile = services.profile_for(rig)
    if profile.bandwidth_gbs is None and urlparse(rig.base_url).hostname in LOOPBACK:
        profile = services.rig_bandwidth_measure(rig=rig)
        log.info("rig %s: measured memory bandwidth %.1f GB/s", rig.name, profile.bandwidth_gbs or 0)
    return RigSampler(rig=rig, kv_cache_type=profile.kv_cache_type, bandwidth_gbs=profile.bandwidth_gbs)


async def rig_loop(rig_id: int, redis_client: aioredis.Redis, interval_s: float, ticks: int | None = None) -> None:
    sampler = await database_sync_to_async(_rig_setup)(rig_id)
    if sampler is None:
        return
    done = 0
    next_at = time.monotonic()
    while ticks is None or done < ticks:
        sample = await sampler.take(redis_client)
        await database_sync_to_async(services.sample_store)(rig_id=rig_id, sample=sample)
        await services.sample_publish(rig_id=rig_id, sample=sample)
        done += 1
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def supervise(rig_id: int, redis_client: aioredis.Redis, interval_s: float) -> None:
    while True:
        try:
            await rig_loop(rig_id, redis_client, interval_s)
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sampler of rig %s crashed; restarting in %.0f s", rig_id, RESTART_DELAY_S)
            await asyncio.sleep(RESTART_DELAY_S)


def _maintenance() -> None:
    conf = settings.RIGDASH
    services.samples_downsample()
    services.samples_prune(
        raw_retention=timedelta(hours=conf.sample_raw_retention_h),
        downsampled_retention=timedelta(days=conf.sample_downsampled_retention_d),
    )


async def run(*, stop: asyncio.Event | None = None) -> None:
    interval_s = settings.RIGDASH.sample_interval_s
    redis_client = aioredis.Redis.from_url(settings.REDIS_URL)
    loops: dict[int, asyncio.Task[None]] = {}
    last_maintenance = 0.0
    stop = stop or asyncio.Event()
    try:
        while not stop.is_set():
            wanted = set(
                await database_sync_to_async(
                    lambda: list(Rig.objects.filter(enabled=True).values_list("pk", flat=True))
                )()
            )
            for rig_id in wanted - loops.keys():
                loops[rig_id] = asyncio.create_task(supervise(rig_id, redis_client, interval_s))
            for rig_id in set(loops) - wanted:
                loops.pop(rig_id).cancel()
            if time.monotonic() - last_maintenance > MAINTENANCE_EVERY_S:
                last_maintenance = time.monotonic()
                try:
                    await database_sync_to_async(_maintenance)()
                except Exception:
                    log.exception("sample downsampling/pruning failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=RIG_REFRESH_S)
    finally:
        for task in loops.values():
            task.cancel()
        await asyncio.gather(*loops.values(), return_exceptions=True)
        await redis_client.aclose()
