"""Staff forms for alert rules, channels and silences; numbers through RigDash's one parser (rigdash/numbers.py)."""

from __future__ import annotations

from typing import Any

from django import forms

from inference.forms import StrictIntegerField
from inference.models import Rig
from monitoring.alerts.models import AlertChannel, AlertRule
from rigdash import numbers


class StrictFloatField(forms.FloatField):
    """ASCII digits, sign, point and exponent only, finite (``parse_float``), or the field's "invalid" error."""

    def to_python(self, value: Any) -> float | None:  # type: ignore[override]
        if value in self.empty_values:
            return None
        try:
            return numbers.parse_float(value, name=str(self.label or "value"), low=-1e12, high=1e12)
        except numbers.BadNumber:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None


class AlertRuleForm(forms.ModelForm):  # type: ignore[type-arg]
    threshold = StrictFloatField(required=False, help_text=AlertRule._meta.get_field("threshold").help_text)
    for_s = StrictIntegerField(min_value=0, max_value=86_400, initial=60, label="Fires after (s)")
    clear_s = StrictIntegerField(min_value=0, max_value=86_400, initial=60, label="Resolves after clear for (s)")
    window_s = StrictIntegerField(min_value=10, max_value=86_400, initial=300, label="Turn window (s)")

    class Meta:
        model = AlertRule
        fields = ["name", "kind", "rig", "threshold", "for_s", "clear_s", "window_s", "enabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["rig"].queryset = Rig.objects.order_by("name")  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        needs = {"queue_wait_p95", "error_rate", "gpu_temperature", "disk"}
        if data.get("kind") in needs and data.get("threshold") is None:
            self.add_error("threshold", "This kind compares a figure: give a threshold.")
        return data


class AlertChannelForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = AlertChannel
        fields = ["name", "kind", "target", "enabled"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        target = str(data.get("target") or "")
        if data.get("kind") == AlertChannel.Kind.EMAIL:
            for address in (a.strip() for a in target.split(",")):
                if address:
                    forms.EmailField().clean(address)
        elif target and not target.startswith(("http://", "https://")):
            self.add_error("target", "A webhook's target is an http:// or https:// URL.")
        return data


class SilenceForm(forms.Form):
    rule = forms.ModelChoiceField(queryset=AlertRule.objects.all(), required=False, empty_label="every rule")
    rig = forms.ModelChoiceField(queryset=Rig.objects.order_by("name"), required=False, empty_label="every rig")
    minutes = StrictIntegerField(min_value=1, max_value=60 * 24 * 30, initial=60)
    reason = forms.CharField(max_length=200, required=False)
