"""Per-rig monitoring settings and the time series of samples (1 s raw, 60 s downsampled)."""

from __future__ import annotations

from django.db import models

from inference.models import Rig


class RigProfile(models.Model):
    """What RigDash cannot read from the backend: KV cache type and the memory bandwidth."""

    class BandwidthSource(models.TextChoices):
        NONE = "", "unknown"
        PROBE = "probe", "measured by RigDash's probe on this host"
        SETTING = "setting", "set by an admin"

    rig = models.OneToOneField(Rig, on_delete=models.CASCADE, related_name="profile")
    kv_cache_type = models.CharField(max_length=16, default="f16", help_text="llama.cpp -ctk / OLLAMA_KV_CACHE_TYPE")
    bandwidth_gbs = models.FloatField(null=True, blank=True, help_text="memory bandwidth, GB/s")
    bandwidth_source = models.CharField(max_length=16, choices=BandwidthSource.choices, blank=True)

    def __str__(self) -> str:
        return f"profile of {self.rig.name}"


class RigSample(models.Model):
    """One reading of a rig. ``series`` holds flat numbers (downsampled by averaging); ``detail`` holds
    the per-slot, per-turn and per-source state of a raw sample (dropped when downsampled)."""

    RAW_S = 1
    DOWNSAMPLED_S = 60

    rig = models.ForeignKey(Rig, on_delete=models.CASCADE, related_name="samples")
    ts = models.DateTimeField()
    resolution_s = models.PositiveIntegerField(default=RAW_S)
    series = models.JSONField(default=dict)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["rig", "resolution_s", "ts"])]
        ordering = ["ts"]

    def __str__(self) -> str:
        return f"{self.rig_id}@{self.ts.isoformat()} ({self.resolution_s} s)"
