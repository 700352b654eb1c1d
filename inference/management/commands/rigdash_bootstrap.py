"""Create the default rig and a first admin account; print the admin's password once if it was generated."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from inference.turns.sessions import rig_ensure_default


class Command(BaseCommand):
    help = "Ensure the embedded default rig and a first admin account exist."

    def handle(self, *args: Any, **options: Any) -> None:
        slots = int(os.environ.get("LLAMA_SLOTS", "4"))  # the embedded llama-server's -np (rigdash/launcher.py)
        rig = rig_ensure_default(base_url=settings.RIGDASH.default_rig_url, slots=slots)
        self.stdout.write(f"default rig: {rig.name} -> {rig.base_url} (queue {rig.queue}, {rig.slots} slots)")
        username = os.environ.get("RIGDASH_ADMIN_USER", "admin")
        user_model = get_user_model()
        if user_model.objects.filter(username=username).exists():
            self.stdout.write(f"admin account: {username} (exists)")
            return
        password = os.environ.get("RIGDASH_ADMIN_PASSWORD", "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        user_model.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(self.style.WARNING(f"admin account: {username} / password: {password}  (shown once)"))
        else:
            self.stdout.write(f"admin account: {username} (password from RIGDASH_ADMIN_PASSWORD)")
