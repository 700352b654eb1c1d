"""A rig's monitoring profile as staff edit it: the KV cache type, a bandwidth override and the model's KV geometry
(for a rig whose GGUF file RigDash cannot read). Saved and audited here; the sampler re-reads its rigs at once."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db import transaction

from inference import events
from inference.audit import audit_record
from monitoring.decode import KV_CACHE_TYPE_BYTES
from monitoring.models import RigProfile

FIELDS = ("kv_cache_type", "bandwidth_gbs", "model_layers", "model_kv_heads", "model_head_dim")


class RigProfileForm(forms.ModelForm):  # type: ignore[type-arg]
    kv_cache_type = forms.ChoiceField(choices=[(name, name) for name in sorted(KV_CACHE_TYPE_BYTES)])
    bandwidth_gbs = forms.FloatField(
        required=False, min_value=0.1, max_value=100_000, label="Memory bandwidth override (GB/s)"
    )

    class Meta:
        model = RigProfile
        fields = list(FIELDS)


def profile_save(*, actor: Any, form: RigProfileForm) -> RigProfile:
    """Store a validated profile (its bandwidth counts as an admin's setting, or goes back to the probe when
    cleared) and record what changed."""
    before = dict(RigProfile.objects.filter(pk=form.instance.pk).values(*FIELDS)[0])
    profile: RigProfile = form.save(commit=False)
    if profile.bandwidth_gbs is not None and profile.bandwidth_gbs != before["bandwidth_gbs"]:
        profile.bandwidth_source = RigProfile.BandwidthSource.SETTING
    elif profile.bandwidth_gbs is None:
        profile.bandwidth_source = RigProfile.BandwidthSource.NONE
    with transaction.atomic():
        profile.save()
        after = {name: getattr(profile, name) for name in FIELDS}
        changed = {k: v for k, v in after.items() if before.get(k) != v}
        audit_record(actor=actor, action="rig.profile", target=f"rig:{profile.rig.name}", detail=changed)
    transaction.on_commit(events.rigs_changed_sync, robust=True)
    return profile
