"""Forms for the admin pages: quotas (validated by the model's limits) and new users."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import Group, User
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference.models import Quota


class QuotaForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Quota
        fields = ["user", "group", *Quota.LIMIT_FIELDS]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["user"].queryset = User.objects.order_by("username")  # type: ignore[attr-defined]
        self.fields["user"].help_text = "Leave user and group empty for the default quota (everyone)."
        for name in Quota.LIMIT_FIELDS:
            model_field = _limit_field(name)
            low, high = _bounds(model_field)
            self.fields[name] = forms.IntegerField(
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
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=3650, label="Expires in (days)",
        help_text="Leave empty for a key that does not expire.",
        widget=forms.NumberInput(attrs={"placeholder": "never"}),
    )  # fmt: skip
