"""The Celery app: Redis broker, settings from Django's CELERY_* names, one queue per rig."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")

app = Celery("rigdash")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
