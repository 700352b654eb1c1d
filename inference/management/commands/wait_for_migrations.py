"""Wait until the database answers with every migration applied and Redis answers, then run the command given after
``--``. Redis refusing the password (REDIS_PASSWORD), and a TLS certificate of Redis or PostgreSQL that RigDash does
not trust, stop it at once with that reason: waiting would not help.

docker-compose.yml starts the worker, the beat and the sampler through it: they query tables at their first step,
and on a fresh database the one-shot ``migrate`` service may not have created them yet (or a service was started
on its own, ``docker compose up worker``). It replaces itself with the command (no shell, no extra process), so
that command's own SIGTERM handling is what `docker compose stop` reaches.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from rigdash import redischeck


class DatabaseRefused(Exception):
    """TLS to PostgreSQL cannot work as configured (DATABASE_URL's sslmode, sslrootcert): waiting will not help."""


# libpq's words for a TLS setup that no retry mends -> what to change (docs/deploy.md, "TLS to Redis and PostgreSQL")
TLS_REFUSALS = (
    ("certificate verify failed", "sslrootcert must name the CA that signed PostgreSQL's ssl_cert_file"),
    ("does not match host name", "connect by a name its certificate holds (DATABASE_URL's host), or reissue it"),
    ("root certificate file", "sslrootcert must name a readable CA file"),
    ("server does not support SSL", "PostgreSQL has ssl = off: turn it on, or leave sslmode out of DATABASE_URL"),
)


def pending(database: str = "default") -> str:
    """What is missing: '' when the database answers and has every migration applied. ``DatabaseRefused`` when its
    TLS settings cannot work."""
    connection = connections[database]
    try:
        connection.ensure_connection()
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        text = " ".join(str(exc).split())
        for words, advice in TLS_REFUSALS:
            if words in text:
                raise DatabaseRefused(f"PostgreSQL's TLS: {advice} ({text})") from None
        return f"database not ready: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
    finally:
        connection.close()
    return f"{len(plan)} migration(s) not applied" if plan else ""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class Command(BaseCommand):
    help = "Wait until every migration is applied (the migrate service ran), then exec the command after --."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait before failing (0: forever)")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between checks")
        parser.add_argument("--database", default="default")
        parser.add_argument("command", nargs="*", help="the command to exec once migrated (after --)")

    def handle(self, *args: Any, **options: Any) -> None:
        # As a container's PID 1 a signal without a handler is dropped: stop at once on SIGTERM while waiting.
        signal.signal(signal.SIGTERM, _stop)
        self._wait(options["database"], options["timeout"], options["interval"])
        command: list[str] = options["command"]
        if not command:
            return
        program = shutil.which(command[0])
        if program is None:
            raise CommandError(f"{command[0]}: not found on PATH")
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.execv(program, command)  # noqa: S606 - the operator's own command line, as compose spells it

    def _wait(self, database: str, timeout_s: float, interval_s: float) -> None:
        start = time.monotonic()
        said = ""
        while missing := self._database(database) or self._redis():
            waited = time.monotonic() - start
            if timeout_s and waited > timeout_s:
                raise CommandError(f"gave up after {waited:.0f} s: {missing}")
            if missing != said:
                self.stderr.write(f"waiting for migrations (the migrate service): {missing}")
                said = missing
            time.sleep(interval_s)
        self.stdout.write("migrations applied")

    def _database(self, database: str) -> str:
        try:
            return pending(database)
        except DatabaseRefused as exc:
            raise CommandError(str(exc)) from None

    def _redis(self) -> str:
        try:
            return redischeck.check(settings.REDIS_URL)
        except redischeck.RedisRefused as exc:
            raise CommandError(str(exc)) from None
