"""Per-rig monitoring settings and the time series of samples (1 s raw, 60 s downsampled)."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference.backends.base import ModelArchitecture
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
    # The model's KV geometry, for a rig whose GGUF file RigDash cannot read (no agent on its host): all three or none.
    model_layers = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1024)], help_text="block_count"
    )
    model_kv_heads = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1024)], help_text="head_count_kv"
    )
    model_head_dim = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(4096)], help_text="key_length"
    )

    def __str__(self) -> str:
        return f"profile of {self.rig.name}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        given = [self.model_layers, self.model_kv_heads, self.model_head_dim]
        if any(v is not None for v in given) and not all(v is not None for v in given):
            raise ValidationError("Give the model's layers, KV heads and head dimension together, or none of them.")

    def geometry(self) -> ModelArchitecture | None:
        """The typed geometry as the KV arithmetic takes it (monitoring/decode.py), or None."""
        if self.model_layers is None or self.model_kv_heads is None or self.model_head_dim is None:
            return None
        return ModelArchitecture(
            arch="profile",
            block_count=self.model_layers,
            head_count=self.model_kv_heads,
            head_count_kv=self.model_kv_heads,
            embedding_length=self.model_kv_heads * self.model_head_dim,
            key_length=self.model_head_dim,
        )


class RigSample(models.Model):
    """One reading of a rig. ``series`` holds flat numbers (downsampled by averaging); ``detail`` holds
    the per-slot, per-turn and per-source state of a raw sample (dropped when downsampled)."""

    RAW_S = 1
    DOWNSAMPLED_S = 60

    # No index of its own: the (rig, resolution_s, ts) index below leads with it, and a second one on rig alone drew
    # the planner to read a rig's every sample for a day's range (docs/benchmarks.md, "Cost as the data grows").
    rig = models.ForeignKey(Rig, on_delete=models.CASCADE, related_name="samples", db_index=False)
    ts = models.DateTimeField()
    resolution_s = models.PositiveIntegerField(default=RAW_S)
    series = models.JSONField(default=dict)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["rig", "resolution_s", "ts"])]
        ordering = ["ts"]

    def __str__(self) -> str:
        return f"{self.rig_id}@{self.ts.isoformat()} ({self.resolution_s} s)"
