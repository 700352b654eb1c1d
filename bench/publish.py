"""What one turn's Celery message costs the web to send: ``apply_async`` with kombu's Redis transport and with
RigDash's (rigdash/broker.py), CPU and wall time per message, best of three rounds, each in its own process.

    .venv/bin/python -m bench.publish [--redis-url redis://127.0.0.1:6379/15] [--n 300]

It writes to a throwaway queue on that Redis (loopback only) and deletes it; nothing else is touched.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlparse

TRANSPORTS = {"kombu": None, "rigdash": "rigdash.broker:Transport"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--n", type=int, default=300, help="messages per round")
    parser.add_argument("--transport", choices=sorted(TRANSPORTS), help="measure one (default: each in turn)")
    args = parser.parse_args(argv)
    if urlparse(args.redis_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the benchmark only talks to this machine's loopback addresses")
    if args.transport is None:
        for name in TRANSPORTS:
            cmd = [sys.executable, "-m", "bench.publish", "--redis-url", args.redis_url, "--n", str(args.n)]
            subprocess.run([*cmd, "--transport", name], check=True, timeout=600)
        return
    measure(args.redis_url, args.n, args.transport)


def measure(redis_url: str, n: int, transport: str) -> None:
    os.environ["REDIS_URL"] = os.environ["CELERY_BROKER_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")
    import django

    django.setup()
    import redis

    from inference.queue.dispatch import task_reprs
    from inference.queue.tickets import StartTicket
    from inference.tasks import turns_run_task
    from rigdash.celery import app

    app.conf.broker_transport = TRANSPORTS[transport]  # before the first connection is made
    queue = f"rigdash.bench.publish.{uuid.uuid4().hex[:8]}"
    conversation = [{"role": "user", "content": "Tell me about lighthouses. " * 20}]
    ticket: dict[str, Any] = {
        "turn_id": 1, "rig_id": 1, "model": "m", "messages": conversation, "params": {}, "max_tokens": 400,
        "context_limit": None,
    }  # fmt: skip
    kwargs = {"tickets": [ticket]}
    reprs = task_reprs([1], [StartTicket(**ticket)])  # as inference.queue.dispatch sends it

    def round_us() -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(n):
            turns_run_task.apply_async(args=[[1]], kwargs=kwargs, queue=queue, exchange="", routing_key=queue, **reprs)
        return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6

    try:
        round_us()  # warm
        cpu, wall = min(round_us() for _ in range(3))
        with app.connection_for_write() as connection:
            used = type(connection.transport).__module__
        print(f"{transport:8s} ({used}): apply_async {cpu:.0f} us CPU, {wall:.0f} us wall per message")
    finally:
        redis.Redis.from_url(redis_url).delete(queue)


if __name__ == "__main__":
    main()
