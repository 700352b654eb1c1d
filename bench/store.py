"""What the web's store of a burst of submits costs: ``turn_submit_many`` (inference/turns/submit.py) for
bursts of 1, 4 and 16 sessions' submits (one at a time, level 2's four, level 3's sixteen), wall time and SQL
statements per burst, median of the rounds, the first two left out (warm-up). It includes what runs at the commit:
the pages' turn.queued, the Celery message (to a throwaway queue) and the board.

    .venv/bin/python -m bench.store [--database-url postgres://postgres@127.0.0.1:5432/rigdash_bench] [--rounds 20]

Without --database-url it uses a new SQLite file in a temporary folder. A PostgreSQL database named here is
migrated and then filled with this run's users, rigs and turns: give it a throwaway one. Only loopback addresses.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from typing import Any
from urllib.parse import urlparse

BURSTS = (1, 4, 16)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="a throwaway database (default: a new SQLite file)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--rounds", type=int, default=20, help="bursts of each size (the first two are warm-up)")
    args = parser.parse_args(argv)
    for url in filter(None, (args.database_url, args.redis_url)):
        if urlparse(url).hostname not in ("127.0.0.1", "localhost", "::1"):
            parser.error("the benchmark only talks to this machine's loopback addresses")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    with tempfile.TemporaryDirectory(prefix="rigdash-bench-store-") as tmp:
        database_url = args.database_url or f"sqlite:///{tmp}/store.sqlite3"
        for burst, (ms, statements) in measure(database_url, args.redis_url, args.rounds).items():
            print(f"{burst:2d} submits: {ms:6.1f} ms per burst ({ms / burst:5.2f} per turn), {statements} statements")


def measure(database_url: str, redis_url: str, rounds: int) -> dict[int, tuple[float, int]]:
    """Per burst size: the median wall time of a burst in ms, and the statements of its last round."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = os.environ["CELERY_BROKER_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")
    import django

    django.setup()
    import redis
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from inference.models import ChatSession, Rig, Turn
    from inference.turns import submit

    call_command("migrate", verbosity=0)
    run = uuid.uuid4().hex[:8]
    queue = f"rigdash.bench.store.{run}"
    owner = get_user_model().objects.create_user(username=f"bench-store-{run}")
    rig = Rig.objects.create(name=f"bench-store-{run}", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9",
                             queue=queue, slots=max(BURSTS))  # fmt: skip
    results: dict[int, tuple[float, int]] = {}
    try:
        for burst in BURSTS:
            sessions = [ChatSession.objects.create(owner=owner, rig=rig, model_name="m") for _ in range(burst)]
            times: list[float] = []
            statements = 0
            for i in range(rounds):
                requests: list[Any] = [
                    submit.SubmitRequest(user=owner, session_id=s.pk, text=f"round {i}") for s in sessions
                ]
                with CaptureQueriesContext(connection) as queries:
                    start = time.perf_counter()
                    stored = submit.turn_submit_many(requests)
                    times.append((time.perf_counter() - start) * 1000)
                if not all(isinstance(turn, Turn) for turn in stored):
                    raise SystemExit(f"a submit was refused: {stored}")
                statements = len(queries.captured_queries)
                Turn.objects.filter(session__rig=rig).update(status=Turn.Status.DONE)  # each session is free again
            results[burst] = (statistics.median(times[2:]), statements)
    finally:
        redis.Redis.from_url(redis_url).delete(queue)
    return results


if __name__ == "__main__":
    main()
