"""Set up a database-free rig agent beside RigDash: ``manage.py rigdash_agent_init --rig NAME --dir DIR``.

docker-compose.yml runs it once per bundled agent, after ``migrate``, in a one-shot service that holds the database's
credentials, so that the agent itself holds none: it issues the rig's agent key if the rig has none, makes the
agent's Redis ACL user (limited to the rig's ``rigdash:agent:<id>:*`` keys, its password derived from the key:
inference/live/agents.py ``acl_ensure``), and writes into DIR, a volume only the agent mounts, what the agent reads:

- ``rig_id``: ``rigdash_agent --rig-id-file DIR/rig_id``
- ``key``: the rig's agent key, ``rigdash_agent --key-file DIR/key``
- ``redis_url``: RigDash's Redis URL with the agent's user in place of RigDash's credentials (``REDIS_URL_FILE``)

DIR is made mode 0700 and the files 0400, owned by the user that runs this (compose: the agent's user).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inference import events
from inference.live import agents
from inference.models import Rig
from monitoring import agent


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, mode 0400 from its first byte, replacing what was there in one step."""
    partial = path.with_name(f".{path.name}.new")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    os.replace(partial, path)


class Command(BaseCommand):
    help = "Issue a rig's agent key if it has none, make its agent's Redis user, write the agent's files to DIR."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rig", required=True, help="the rig's name, as in RigDash's rigs")
        parser.add_argument("--dir", required=True, type=Path, help="the folder only the agent mounts")

    def handle(self, *args: Any, **options: Any) -> None:
        name, folder = options["rig"], Path(options["dir"])
        if not Rig.objects.filter(name=name).exists():
            raise CommandError(
                f"no rig {name!r}: rigdash_bootstrap makes the bundled ones from LLAMA_SERVER_URL and "
                "RIGDASH_OLLAMA_URL (is the one this agent is for set in .env?)"
            )
        had_key = Rig.objects.filter(name=name).exclude(agent_key="").exists()
        key = agent.key_from_database(name)
        if not had_key:  # the sampler writes the rig's record, which the agent waits for, at once (not in 30 s)
            events.rigs_changed_sync()
        rig_id = Rig.objects.values_list("pk", flat=True).get(name=name)
        agents.acl_ensure(rig_id, key)  # the central sampler makes it again if Redis forgets it
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        write_private(folder / "rig_id", str(rig_id))
        write_private(folder / "key", key)
        write_private(folder / "redis_url", agents.acl_url(settings.REDIS_URL, rig_id, key))
        self.stdout.write(
            f"rig agent files for rig {name!r} (id {rig_id}) in {folder}; its Redis user {agents.acl_username(rig_id)}"
        )
