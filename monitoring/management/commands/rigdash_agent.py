"""Run a rig agent beside its backend: ``manage.py rigdash_agent --rig NAME`` with RIGDASH_AGENT_KEY set.

Database-free (``--rig-id ID --no-worker``, RIGDASH_AGENT_ONLY=1): only the rig's id, its key and a Redis URL; the
rig's settings come from the record RigDash's sampler keeps in Redis (monitoring/agent.py).

It serves the rig's Celery queue (a worker it starts, unless --no-worker) and samples this host for the rig
(monitoring/agent.py). SIGTERM or Ctrl-C stops both; the worker also ends when the agent is killed outright
(SIGKILL, the OOM killer: rigdash/parentwatch.py), so no orphan keeps serving the rig's queue.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from monitoring import agent, services
from rigdash import parentwatch
from rigdash.launcher import ROOT, worker_command


class Command(BaseCommand):
    help = "Run the agent of one rig on the rig's host: serve its queue, sample its host, publish through Redis."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rig", default="", help="the rig's name, as in RigDash's rigs")
        parser.add_argument(
            "--rig-id",
            type=int,
            default=None,
            help="the rig's id: the agent runs without RigDash's database, from the record RigDash's sampler keeps "
            "in Redis (with RIGDASH_AGENT_ONLY=1 it needs no DATABASE_URL and no RIGDASH_SECRET_KEY); sampling only",
        )
        parser.add_argument(
            "--rig-id-file", type=Path, default=None, help="a file holding the rig's id, instead of --rig-id"
        )
        parser.add_argument(
            "--key-file",
            type=Path,
            default=None,
            help="a file holding the rig's agent key, instead of RIGDASH_AGENT_KEY (rigdash_agent_init writes one)",
        )
        parser.add_argument(
            "--wait-for-record",
            type=float,
            default=0.0,
            help="without the database: wait up to this many seconds for the rig's record in Redis (RigDash's sampler "
            "writes it at its start) before giving up",
        )
        parser.add_argument("--interval", type=float, default=None, help="seconds between samples (default 1)")
        parser.add_argument("--no-worker", action="store_true", help="sample only; a worker serves the queue already")
        parser.add_argument("--concurrency", type=int, default=8, help="the worker's threads (turns at once)")
        parser.add_argument(
            "--key-from-database",
            action="store_true",
            help="take the rig's agent key from RigDash's database (issued if it has none) instead of "
            "RIGDASH_AGENT_KEY: for an agent beside RigDash that holds the database's credentials (docker-compose.yml)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"] or settings.RIGDASH.sample_interval_s
        if not 0.2 <= interval <= 60:
            raise CommandError("--interval must be between 0.2 and 60 seconds")
        key = os.environ.get("RIGDASH_AGENT_KEY", "").strip()  # a pasted key often brings a newline
        if options["key_file"] is not None:
            if key:
                raise CommandError("RIGDASH_AGENT_KEY and --key-file both given: use one")
            key = _read(Path(options["key_file"]), "--key-file")
        if options["rig_id_file"] is not None:
            if options["rig_id"] is not None:
                raise CommandError("--rig-id and --rig-id-file both given: use one")
            text = _read(Path(options["rig_id_file"]), "--rig-id-file")
            if not text.isdigit():
                raise CommandError(f"--rig-id-file {options['rig_id_file']}: not a rig id: {text[:20]!r}")
            options["rig_id"] = int(text)
        if options["rig_id"] is not None or settings.AGENT_ONLY:
            self._without_database(options, key, interval)
            return
        if not options["rig"]:
            raise CommandError("give the rig: --rig NAME, or --rig-id ID for an agent without the database")
        if options["key_from_database"]:
            if key:
                raise CommandError("RIGDASH_AGENT_KEY and --key-from-database both given: use one")
            key = agent.key_from_database(options["rig"])
        try:
            rig = agent.rig_for_agent(options["rig"], key)
            me = agent.identity_for(rig, key)
        except agent.AgentRefused as exc:
            raise CommandError(str(exc)) from None
        sampler = services.sampler_for(rig, local_host=True)
        worker = None
        if not options["no_worker"]:
            command = worker_command(
                queues=[rig.queue], concurrency=options["concurrency"], name=f"agent-{rig.name}@%h", beat_schedule=None
            )
            me_pid = os.getpid()
            worker = subprocess.Popen(
                command,
                cwd=ROOT,
                env=parentwatch.child_env(me_pid),  # the worker's own watchdog (rigdash/celery.py)
                preexec_fn=parentwatch.die_with_parent(me_pid),  # before any thread starts: fork-safe
            )
        self.stdout.write(f"rig agent {me.instance}: rig {rig.name!r}, queue {rig.queue!r}, every {interval:g} s")
        try:
            asyncio.run(self._run(sampler, me, interval))
        finally:
            if worker is not None:
                worker.terminate()
                try:
                    worker.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    worker.kill()

    def _without_database(self, options: dict[str, Any], key: str, interval: float) -> None:
        if options["rig_id"] is None:
            raise CommandError("RIGDASH_AGENT_ONLY=1: give the rig's id (--rig-id ID, on the rig's admin page)")
        if not options["no_worker"]:
            raise CommandError(
                "an agent without the database samples only (--no-worker): a worker runs turns, which need RigDash's "
                'database, so a host that runs them is a worker host (docs/deploy.md, "A second rig host")'
            )
        if options["key_from_database"]:
            raise CommandError("--key-from-database needs the database: give RIGDASH_AGENT_KEY")
        deadline = time.monotonic() + max(0.0, options["wait_for_record"])
        while True:
            try:
                config = agent.config_for_agent(options["rig_id"], key, name=options["rig"])
                break
            except agent.AgentRefused as exc:
                if not key or time.monotonic() >= deadline:
                    raise CommandError(str(exc)) from None
                self.stderr.write(f"rig agent: waiting for the rig's record ({exc})")
                time.sleep(5)
        try:
            sampler = agent.sampler_from_config(config, key)
            me = agent.identity_for(sampler.rig, key)
        except agent.AgentRefused as exc:
            raise CommandError(str(exc)) from None
        follow = agent.ConfigFollower(options["rig_id"], key, config, sampler)
        self.stdout.write(
            f"rig agent {me.instance}: rig {sampler.rig.name!r} (id {sampler.rig.pk}), without the database, "
            f"every {interval:g} s"
        )
        asyncio.run(self._run(sampler, me, interval, follow=follow))

    async def _run(
        self, sampler: Any, me: agent.AgentIdentity, interval: float, *, follow: agent.ConfigFollower | None = None
    ) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await sync_to_async(lambda: None)()  # the ORM's thread is made before the first tick
        await agent.run(sampler, me, interval_s=interval, stop=stop, follow=follow)


def _read(path: Path, option: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CommandError(f"{option} {path}: {exc}") from None
