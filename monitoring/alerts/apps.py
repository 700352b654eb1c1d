from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "monitoring.alerts"
    label = "alerts"  # the app's tables and migrations keep their name
    default_auto_field = "django.db.models.BigAutoField"
