from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class InferenceConfig(AppConfig):
    name = "inference"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.models import User
        from django.contrib.auth.signals import user_logged_out

        from inference import tasks  # noqa: F401  the queue and the board send these tasks by name, from any process
        from inference.models import Rig
        from inference.signals import rig_changed, user_saved
        from inference.signals import user_logged_out as logged_out

        post_save.connect(user_saved, sender=User, dispatch_uid="inference.user_saved")
        user_logged_out.connect(logged_out, dispatch_uid="inference.user_logged_out")
        post_save.connect(rig_changed, sender=Rig, dispatch_uid="inference.rig_saved")
        post_delete.connect(rig_changed, sender=Rig, dispatch_uid="inference.rig_deleted")
