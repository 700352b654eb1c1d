"""Forms for the admin pages: quotas (validated by the model's limits) and new users."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import Group, User

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
            field = self.fields[name]
            field.widget.attrs.update({"min": 0, "placeholder": "no limit"})
            field.error_messages["invalid"] = "Enter a whole number, or leave it empty for no limit."


class UserCreateForm(forms.Form):
    username = forms.CharField(max_length=150)
    password = forms.CharField(widget=forms.PasswordInput, min_length=1)
    is_staff = forms.BooleanField(required=False, label="Admin")
    groups = forms.ModelMultipleChoiceField(queryset=Group.objects.order_by("name"), required=False)


class UserGroupsForm(forms.Form):
    groups = forms.ModelMultipleChoiceField(queryset=Group.objects.order_by("name"), required=False)
