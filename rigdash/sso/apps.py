from __future__ import annotations

from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "rigdash.sso"
    label = "sso"
    verbose_name = "Single sign-on"
    default_auto_field = "django.db.models.BigAutoField"
