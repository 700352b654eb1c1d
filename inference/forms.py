"""Forms for the admin pages: rigs, quotas (validated by the model's limits) and new users."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import Group, User
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference.models import ApiKey, Quota, Rig
from inference.validators import validate_backend_key
from rigdash import numbers


class StrictIntegerField(forms.IntegerField):
    """Django's IntegerField reads what ``int()`` reads (``"1_000"``, ``"٣"``): here ASCII digits only, bounded
    (rigdash/numbers.py), or the field's "invalid" error."""

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        try:
            return numbers.parse_int(value, name=str(self.label or "value"))
        except numbers.BadNumber:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None


class RigForm(forms.ModelForm):  # type: ignore[type-arg]
    """A rig as admins edit it: the URL may name any host a container network or LAN resolves
    (inference.validators); the queue is not typed but derived from the name (Rig.queue_for)."""

    # The backend's key is written, never shown: empty keeps the key the rig has, "clear" removes it.
    backend_key = forms.CharField(
        required=False,
        max_length=256,
        strip=True,
        validators=[validate_backend_key],
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password", "size": 40}),
        help_text="The backend's own key (llama-server --api-key, vLLM --api-key), sent as a bearer token. "
        "Leave empty to keep the key the rig has.",
    )
    clear_backend_key = forms.BooleanField(required=False, label="Remove the backend key")

    class Meta:
        model = Rig
        fields = ["name", "kind", "base_url", "slots", "is_default", "enabled"]
        field_classes = {"slots": StrictIntegerField}
        widgets = {"base_url": forms.TextInput(attrs={"placeholder": "http://ollama:11434", "size": 60})}

    def save(self, commit: bool = True) -> Rig:
        rig: Rig = super().save(commit=False)
        rig.queue = Rig.queue_for(rig.name)
        if self.cleaned_data.get("backend_key"):
            rig.api_key = self.cleaned_data["backend_key"]
        elif self.cleaned_data.get("clear_backend_key"):
            rig.api_key = ""
        if commit:
            rig.save()
        return rig

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        queue = Rig.queue_for(name)
        if Rig.objects.filter(queue=queue).exclude(pk=self.instance.pk).exists():
            raise forms.ValidationError(f"Another rig already uses the queue {queue}.")
        return name


class QuotaForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Quota
        fields = ["user", "group", *Quota.LIMIT_FIELDS, *Quota.RATE_FIELDS]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["user"].queryset = User.objects.order_by("username")  # type: ignore[attr-defined]
        self.fields["user"].help_text = "Leave user and group empty for the default quota (everyone)."
        for name in (*Quota.LIMIT_FIELDS, *Quota.RATE_FIELDS):
            model_field = _limit_field(name)
            low, high = _bounds(model_field)
            self.fields[name] = StrictIntegerField(
                required=False,
                min_value=low,
                max_value=high,
                label=str(model_field.verbose_name).capitalize(),
                help_text=model_field.help_text,
                error_messages={"invalid": "Enter a whole number, or leave it empty for no limit."},
                widget=forms.NumberInput(attrs={"placeholder": "no limit"}),
            )


def _limit_field(name: str) -> models.Field[Any, Any]:
    field = Quota._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field


def _bounds(field: models.Field[Any, Any]) -> tuple[int | None, int | None]:
    """The model field's own MinValueValidator / MaxValueValidator limits, so the form says the same."""
    low = high = None
    for validator in field.validators:
        if isinstance(validator, MinValueValidator):
            low = int(validator.limit_value)  # type: ignore[arg-type]
        elif isinstance(validator, MaxValueValidator):
            high = int(validator.limit_value)  # type: ignore[arg-type]
    return low, high


class UserCreateForm(forms.Form):
    username = forms.CharField(max_length=150)
    password = forms.CharField(widget=forms.PasswordInput, min_length=1)
    is_staff = forms.BooleanField(required=False, label="Admin")
    groups = forms.ModelMultipleChoiceField(queryset=Group.objects.order_by("name"), required=False)


class UserGroupsForm(forms.Form):
    groups = forms.ModelMultipleChoiceField(queryset=Group.objects.order_by("name"), required=False)


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What will use it, e.g. “editor on my laptop”.")
    expires_in_days = StrictIntegerField(
        required=False, min_value=1, max_value=3650, label="Expires in (days)",
        help_text="Leave empty for a key that does not expire.",
        widget=forms.NumberInput(attrs={"placeholder": "never"}),
    )  # fmt: skip
    storage = forms.ChoiceField(
        choices=ApiKey.Storage.choices, initial=ApiKey.Storage.CHATS, label="Conversations", required=False,
        help_text="Store nothing: a request's messages and reply are wiped once answered; its counts stay.",
    )  # fmt: skip

    def clean_storage(self) -> str:
        return self.cleaned_data.get("storage") or ApiKey.Storage.CHATS  # left out: as before, kept as chats
