"""Fill PostgreSQL with a synthetic year of a team's work, for page-cost benchmarks (bench/pages.py).

Refuses a database that has users it did not make, unless --force: it is for a database of its own
(``DATABASE_URL=postgres://.../rigdash_scale_bench``), never for one people use."""

from __future__ import annotations

import heapq
import itertools
import random
import time
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from django.utils import timezone

from inference.models import Rig, UsageDay, UsageRolledDay
from monitoring.datagen import audit, samples, turns
from monitoring.datagen.copy import analyze, copy_rows, reserve_ids
from monitoring.datagen.pools import Pools
from monitoring.datagen.timeline import Timeline
from monitoring.models import RigProfile

PREFIX = "gen-"
MODELS = ("qwen2.5-7b-instruct-q4_k_m", "llama-3.1-8b-instruct-q4_k_m", "smollm2-135m-instruct-q4_1")
ACTIVE_TURNS = 16
UNUSABLE = "!"  # a password hash no password matches: the benchmark logs in with force_login
STAFF = 4
TABLES = ("auth_user", "inference_rig", "inference_chatsession", "inference_turn", "inference_auditlog",
          "monitoring_rigsample")  # fmt: skip


class Command(BaseCommand):
    help = "Generate users, chats, turns with stats, rig samples and audit rows (synthetic, for benchmarks)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--users", type=int, default=200)
        parser.add_argument("--turns", type=int, default=1_000_000, help="turns of history, the long chat's among them")
        parser.add_argument("--rigs", type=int, default=20)
        parser.add_argument("--days", type=int, default=365, help="how far back the turns go")
        parser.add_argument("--sample-days", type=int, default=int(settings.RIGDASH.sample_downsampled_retention_d))
        parser.add_argument("--raw-hours", type=float, default=settings.RIGDASH.sample_raw_retention_h)
        parser.add_argument("--long-chat", type=int, default=240, help="turns of the heaviest user's newest chat")
        parser.add_argument("--audit", type=int, default=None, help="audit rows (default: turns / 200)")
        parser.add_argument("--seed", type=int, default=43)
        parser.add_argument("--force", action="store_true", help="write even where other users exist")

    def handle(self, *args: Any, **options: Any) -> None:
        self._check(options)
        rng = random.Random(options["seed"])
        timeline = Timeline(timezone.now(), options["days"])
        started = time.perf_counter()
        rigs = self._rigs(rng, options["rigs"])
        users = self._users(options["users"])
        self._turns(rng, timeline, rigs, users, options)
        self._step("turns and sessions", started)
        mark = time.perf_counter()
        # The sampler writes every rig each tick: rows interleave by time, as a real table's do.
        for source in (
            (samples.downsampled(rng, rig, timeline, options["sample_days"]) for rig in rigs),
            (samples.raw(rng, rig, timeline, options["raw_hours"]) for rig in rigs),
        ):
            copy_rows("monitoring_rigsample", samples.SAMPLE_COLUMNS, heapq.merge(*source, key=lambda row: row[1]))
        self._step("samples", mark)
        admins = list(User.objects.filter(username__startswith=PREFIX, is_staff=True).values_list("pk", "username"))
        names = [f"{PREFIX}user-{i:03d}" for i in range(options["users"])]
        count = options["audit"] if options["audit"] is not None else max(50, options["turns"] // 200)
        copy_rows("inference_auditlog", audit.AUDIT_COLUMNS,
                  audit.audit_rows(rng, timeline, count=count, admins=admins, users=names))  # fmt: skip
        mark = time.perf_counter()
        analyze(TABLES)
        self._step("analyze", mark)
        self._step("all", started)
        self._sizes()

    def _check(self, options: dict[str, Any]) -> None:
        if connection.vendor != "postgresql":
            raise CommandError(
                "rigdash_generate writes with PostgreSQL's COPY: set DATABASE_URL to a PostgreSQL database."
            )
        others = User.objects.exclude(username__startswith=PREFIX).count()
        if others and not options["force"]:
            raise CommandError(
                f"This database has {others} users this command did not make: it is for a database of its own "
                f"(e.g. rigdash_scale_bench). Use --force to write here anyway."
            )
        if options["users"] < STAFF + 1 or options["rigs"] < 1 or options["turns"] < 0:
            raise CommandError(f"Need at least {STAFF + 1} users, 1 rig and 0 turns.")
        if User.objects.filter(username__startswith=PREFIX).exists() and not options["force"]:
            raise CommandError("Generated data is already here; use --force to add another batch.")

    def _rigs(self, rng: random.Random, count: int) -> list[turns.RigShape]:
        base = Rig.objects.count()
        shapes = []
        for i in range(count):
            name = f"{PREFIX}rig-{base + i:02d}"
            # Closed port: the chat list's model lookups fail at once, as with a rig that is down.
            rig = Rig.objects.create(
                name=name, kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue=f"rig.{name}"
            )
            RigProfile.objects.create(
                rig=rig, bandwidth_gbs=4800.0, bandwidth_source=RigProfile.BandwidthSource.SETTING
            )
            tps = rng.choice((35.0, 60.0, 110.0, 180.0))
            shapes.append(turns.RigShape(id=rig.pk, name=name, model=MODELS[i % len(MODELS)], tps=tps, pool=i))
        return shapes

    def _users(self, count: int) -> list[int]:
        base = User.objects.filter(username__startswith=PREFIX).count()
        made = User.objects.bulk_create(
            User(
                username=f"{PREFIX}user-{base + i:03d}",
                password=UNUSABLE,
                is_staff=1 <= i <= STAFF,
                is_superuser=i == 1,
            )
            for i in range(count)
        )
        return [user.pk for user in made]

    def _turns(self, rng: random.Random, timeline: Timeline, rigs: list[turns.RigShape], users: list[int],
               options: dict[str, Any]) -> None:  # fmt: skip
        total = options["turns"]
        plan = turns.TurnPlan(
            rng=rng,
            pools=Pools.build(rng, rig_rates=[rig.tps for rig in rigs], max_tokens=turns.TOKEN_CAP),
            timeline=timeline,
            users=users,
            user_weights=list(itertools.accumulate(1 / (rank + 1) ** 0.8 for rank in range(len(users)))),
            rigs=rigs,
            next_turn_id=reserve_ids("inference_turn", total + options["long_chat"] + ACTIVE_TURNS),
            next_session_id=reserve_ids("inference_chatsession", total + options["long_chat"] + ACTIVE_TURNS),
        )
        rows = itertools.chain(
            turns.all_turns(plan, total=total, long_chat=options["long_chat"]),
            turns.active_turns(plan, count=ACTIVE_TURNS),
        )
        with transaction.atomic():  # the turns' session foreign key is checked at commit (deferred)
            made = copy_rows("inference_turn", turns.TURN_COLUMNS, rows)
            copy_rows("inference_chatsession", turns.SESSION_COLUMNS, plan.sessions)
        # Days rolled up before these turns were written are out of date: usage rolls them up again when read.
        UsageDay.objects.all().delete()
        UsageRolledDay.objects.all().delete()
        self.stdout.write(f"turns: {made}, sessions: {len(plan.sessions)}, long chat: session {plan.long_chat}")

    def _step(self, what: str, since: float) -> None:
        self.stdout.write(f"{what}: {time.perf_counter() - since:.1f} s")

    def _sizes(self) -> None:
        with connection.cursor() as cursor:
            for table in TABLES:
                count_sql = f"SELECT COUNT(*) FROM {table}"  # noqa: S608 (TABLES above)
                cursor.execute(f"SELECT pg_size_pretty(pg_total_relation_size(%s)), ({count_sql})", [table])
                size, rows = cursor.fetchone()
                self.stdout.write(f"{table}: {rows} rows, {size}")
            cursor.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
            self.stdout.write(f"database: {cursor.fetchone()[0]}")
