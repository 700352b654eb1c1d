"""Issue (or show) a rig's agent key: ``manage.py rigdash_agent_key --rig NAME [--new]``, for an admin."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference.models import Rig
from monitoring.agent import new_key


class Command(BaseCommand):
    help = "Print a rig's agent key, issuing one when it has none (--new replaces it: the old agent is then refused)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rig", required=True)
        parser.add_argument("--new", action="store_true", help="replace the key")
        parser.add_argument("--remove", action="store_true", help="remove the key: the rig runs without an agent")

    def handle(self, *args: Any, **options: Any) -> None:
        rig = Rig.objects.filter(name=options["rig"]).first()
        if rig is None:
            raise CommandError(f"no rig named {options['rig']!r}")
        if options["remove"]:
            rig.agent_key = ""
            rig.save(update_fields=["agent_key"])
            self.stdout.write(f"rig {rig.name}: agent key removed")
            return
        if options["new"] or not rig.agent_key:
            rig.agent_key = new_key()
            rig.save(update_fields=["agent_key"])
        self.stdout.write(rig.agent_key)
