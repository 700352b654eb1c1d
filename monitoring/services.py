"""Writes for monitoring: store and publish samples, downsample and prune, measure memory bandwidth."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference.live import agents
from inference.models import Rig
from monitoring import events
from monitoring.models import RigProfile, RigSample
from monitoring.sampling import RigSampler, Sample

log = logging.getLogger(__name__)


def profile_for(rig: Rig) -> RigProfile:
    profile, _ = RigProfile.objects.get_or_create(rig=rig)
    return profile


def sampler_for(rig: Rig, *, local_host: bool) -> RigSampler:
    """A sampler for ``rig`` with its profile's settings; on the rig's host (``local_host``) the host RAM's bandwidth
    is measured once if the profile has none."""
    profile = profile_for(rig)
    if local_host and profile.bandwidth_gbs is None:
        profile = rig_bandwidth_measure(rig=rig)
        log.info("rig %s: measured memory bandwidth %.1f GB/s", rig.name, profile.bandwidth_gbs or 0)
    return RigSampler(
        rig=rig,
        kv_cache_type=profile.kv_cache_type,
        bandwidth_gbs=profile.bandwidth_gbs,
        bandwidth_source=profile.bandwidth_source,
        local_host=local_host,
        profile_arch=profile.geometry(),
    )


def agent_config(rig: Rig) -> dict[str, Any]:
    """What a database-free agent needs of its rig (monitoring/agent.py ``sampler_from_config``): the rig's row and
    its profile's settings, the backend key included (``agents.config_publish`` seals it)."""
    profile = profile_for(rig)
    return {
        "rig": rig.pk, "name": rig.name, "kind": rig.kind, "base_url": rig.base_url, "queue": rig.queue,
        "slots": rig.slots, "api_key": rig.api_key, "kv_cache_type": profile.kv_cache_type,
        "bandwidth_gbs": profile.bandwidth_gbs, "bandwidth_source": profile.bandwidth_source,
        "model_layers": profile.model_layers, "model_kv_heads": profile.model_kv_heads,
        "model_head_dim": profile.model_head_dim,
    }  # fmt: skip


def agent_config_publish(rig: Rig) -> None:
    """Sign the rig's record for its database-free agent again (the sampler, every ``agents.CONFIG_EVERY_S``), and
    with RIGDASH_AGENT_ACL_USERS=1 make its agent's Redis user again if Redis forgot it (a restart)."""
    if rig.agent_key:
        agents.config_publish(key=rig.agent_key, rig_id=rig.pk, config=agent_config(rig))
        if settings.AGENT_ACL_USERS and agents.acl_ensure(rig.pk, rig.agent_key):
            log.info("rig %s: its agent's Redis user %s (re)made", rig.pk, agents.acl_username(rig.pk))


def sample_as_dict(sample: Sample) -> dict[str, Any]:
    return {"ts": sample.ts, "series": sample.series, "detail": sample.detail}


def sample_store(*, rig_id: int, sample: Sample) -> RigSample:
    return RigSample.objects.create(
        rig_id=rig_id,
        ts=datetime.fromtimestamp(sample.ts, tz=UTC),
        resolution_s=RigSample.RAW_S,
        series=sample.series,
        detail=sample.detail,
    )


def sample_publish(*, rig_id: int, sample: Sample) -> None:
    events.rig_sample_sync(rig_id=rig_id, sample=sample_as_dict(sample))


def average_series(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each number over the rows that have it (a source that was down does not count as 0)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for series in rows:
        for name, value in series.items():
            if isinstance(value, int | float):
                sums[name] += value
                counts[name] += 1
    return {name: round(sums[name] / counts[name], 6) for name in sums}


def samples_downsample(*, older_than: datetime | None = None) -> int:
    """Fold complete minutes of raw samples into one 60 s sample each; returns how many were made.

    Raw samples stay until retention removes them, so recent panels keep full resolution."""
    now = timezone.now()
    end = (older_than or now).replace(second=0, microsecond=0)
    made = 0
    for rig_id in Rig.objects.values_list("pk", flat=True):
        last = RigSample.objects.filter(rig_id=rig_id, resolution_s=RigSample.DOWNSAMPLED_S).order_by("-ts").first()
        start = last.ts + timedelta(seconds=RigSample.DOWNSAMPLED_S) if last else None
        raw = RigSample.objects.filter(rig_id=rig_id, resolution_s=RigSample.RAW_S, ts__lt=end)
        if start is not None:
            raw = raw.filter(ts__gte=start)
        buckets: dict[datetime, list[dict[str, float]]] = defaultdict(list)
        for ts, series in raw.values_list("ts", "series").iterator():
            buckets[ts.replace(second=0, microsecond=0)].append(series)
        with transaction.atomic():
            RigSample.objects.bulk_create(
                RigSample(rig_id=rig_id, ts=minute, resolution_s=RigSample.DOWNSAMPLED_S, series=average_series(rows))
                for minute, rows in sorted(buckets.items())
            )
        made += len(buckets)
    return made


def samples_prune(*, raw_retention: timedelta, downsampled_retention: timedelta) -> int:
    now = timezone.now()
    raw, _ = RigSample.objects.filter(resolution_s=RigSample.RAW_S, ts__lt=now - raw_retention).delete()
    old, _ = RigSample.objects.filter(resolution_s=RigSample.DOWNSAMPLED_S, ts__lt=now - downsampled_retention).delete()
    return raw + old


def bandwidth_probe_gbs(*, size_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Single-thread memory read bandwidth of this host, GB/s: memchr over a buffer far larger than the
    caches (the best of a few runs). It measures RigDash's host: valid for a rig on the same machine."""
    buffer = bytearray(size_bytes)
    buffer.find(b"\x01")  # touch the pages first
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.find(b"\x01")
        best = max(best, size_bytes / (time.perf_counter() - start))
    return round(best / 1e9, 2)


def rig_bandwidth_measure(*, rig: Rig) -> RigProfile:
    profile = profile_for(rig)
    profile.bandwidth_gbs = bandwidth_probe_gbs()
    profile.bandwidth_source = RigProfile.BandwidthSource.PROBE
    profile.save(update_fields=["bandwidth_gbs", "bandwidth_source"])
    return profile
