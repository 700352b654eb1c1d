from __future__ import annotations

from django.contrib import admin

from monitoring.models import RigProfile


@admin.register(RigProfile)
class RigProfileAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """What RigDash cannot read from a rig: its KV cache type, a bandwidth override, and the model's KV geometry where
    the GGUF file is out of reach (a rig on another host without an agent)."""

    list_display = ("rig", "kv_cache_type", "bandwidth_gbs", "bandwidth_source", "model_layers", "model_kv_heads")
    list_select_related = ("rig",)
