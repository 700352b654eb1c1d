"""Create the rigs the environment names and a first admin account; print the admin's password once if generated."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from inference.bootstrap import rig_from_env
from inference.models import Rig
from rigdash import redischeck
from rigdash.env import env_int, env_str


class Command(BaseCommand):
    help = "Ensure the rigs of LLAMA_SERVER_URL and RIGDASH_OLLAMA_URL and a first admin account exist."

    def handle(self, *args: Any, **options: Any) -> None:
        # The migrate service runs first: a wrong REDIS_PASSWORD stops it here, before every service waits on Redis.
        try:
            problem = redischeck.check(settings.REDIS_URL)
        except redischeck.RedisRefused as exc:
            problem = str(exc)
        if problem:
            raise CommandError(problem)
        default_url = settings.RIGDASH.default_rig_url
        ollama_url = env_str("RIGDASH_OLLAMA_URL", "")
        if default_url:
            # the embedded llama-server's -np (rigdash/launcher.py, docker-compose.yml)
            self._rig("embedded", Rig.Kind.LLAMACPP, default_url, env_int("LLAMA_SLOTS", 4, minimum=1), True)
        else:
            self.stdout.write("default rig: none (LLAMA_SERVER_URL is empty)")
        if ollama_url:
            slots = env_int("RIGDASH_OLLAMA_SLOTS", 4, minimum=1)
            self._rig("ollama", Rig.Kind.OLLAMA, ollama_url, slots, not default_url)
        self._admin()

    def _rig(self, name: str, kind: str, url: str, slots: int, is_default: bool) -> None:
        rig, kept = rig_from_env(name=name, kind=kind, base_url=url, slots=slots, is_default=is_default)
        self.stdout.write(f"rig: {rig.name} -> {rig.base_url} (queue {rig.queue}, {rig.slots} slots)")
        if kept:
            fields = ", ".join(kept)
            self.stdout.write(f"rig {rig.name}: kept {fields} as an admin set it (the environment says otherwise)")

    def _admin(self) -> None:
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
