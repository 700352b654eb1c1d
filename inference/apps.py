from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_save


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.models import User

        from inference.signals import user_saved

        post_save.connect(user_saved, sender=User, dispatch_uid="inference.user_saved")
