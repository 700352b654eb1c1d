"""Server time and queries per request of RigDash's pages at a data size (``rigdash_generate`` fills it).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/rigdash_scale_bench .venv/bin/python -m bench.pages \
        [--repeat 15] [--json out.json] [--only usage]

Each page is requested in this process through Django's test client (the whole middleware stack and template
rendering, no network): once with its queries captured (``CaptureQueriesContext``) and its Python memory peak
traced, then ``--repeat`` times timed (server time: the request until its last byte, streamed or not). It reads
only, but for the generated users' sessions (``force_login``) and the usage page's stored sums, which the "cold"
row deletes before each request (``rigdash_usage_rollup`` stores them again).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

TARGET_P95_MS = 200.0


@dataclass
class PageCost:
    name: str
    url: str
    status: int
    queries: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    cpu_p50_ms: float  # this process's CPU: the server's own work, without the database's or other processes' time
    bytes: int
    peak_kib: float


@dataclass(frozen=True)
class Page:
    name: str
    url: str
    staff: bool
    cold: bool = False  # the usage page's stored sums deleted before each request: the day's first visit, unwarmed


def pages(*, session_id: int, rig_id: int, oldest_chats: str) -> list[Page]:
    return [
        Page("chat list", "/", False),
        Page("chat list, oldest page", f"/?before={oldest_chats}", False),
        Page("chat page (long chat)", f"/sessions/{session_id}/", False),
        Page("chat turns API (long chat)", f"/api/sessions/{session_id}/turns", False),
        Page("board page", "/board/", True),
        Page("board turns API", "/board/api/turns", True),
        Page("usage 30 d (everyone)", "/usage/?days=30", True),
        Page("usage 366 d (everyone)", "/usage/?days=366", True),
        Page("usage 366 d (everyone), cold", "/usage/?days=366", True, cold=True),
        Page("usage CSV 366 d (everyone)", "/usage.csv?days=366", True),
        Page("usage 366 d (heavy user)", "/usage/?days=366", False),
        Page("rig dashboard 1 h", f"/monitoring/rigs/{rig_id}/?range=1h", False),
        Page("rig dashboard 24 h", f"/monitoring/rigs/{rig_id}/?range=24h", False),
        Page("rig dashboard 30 d", f"/monitoring/rigs/{rig_id}/?range=30d", False),
        Page("rig series API 30 d", f"/monitoring/api/rigs/{rig_id}/series?range=30d", False),
        Page("overview", "/monitoring/", False),
        Page("/metrics", "/metrics", True),
        Page("audit log", "/board/audit/", True),
    ]


def _consume(response: Any) -> int:
    if getattr(response, "streaming", False):
        return sum(len(chunk) for chunk in response.streaming_content)
    return len(response.content)


def _timed(get: Callable[[], Any], repeat: int) -> tuple[list[float], list[float]]:
    times, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        _consume(get())
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return times, cpu


def measure(page: Page, get: Callable[[], Any], repeat: int) -> PageCost:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _consume(get())  # warm: templates, caches, the database's buffers
    tracemalloc.start()
    with CaptureQueriesContext(connection) as captured:
        response = get()
        size = _consume(response)
    queries = len(captured)  # read now: the next request's start empties the connection's log
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    times, cpu = _timed(get, repeat)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return PageCost(
        name=page.name,
        url=page.url,
        status=response.status_code,
        queries=queries,
        p50_ms=round(statistics.median(times), 1),
        p95_ms=round(p95, 1),
        max_ms=round(times[-1], 1),
        cpu_p50_ms=round(statistics.median(cpu), 1),
        bytes=size,
        peak_kib=round(peak / 1024, 1),
    )


def _subjects() -> tuple[Any, Any, int, int, str]:
    from django.contrib.auth.models import User
    from django.db.models import Count

    from inference.models import ChatSession, Rig

    heavy = User.objects.get(username="gen-user-000")
    admin = User.objects.get(username="gen-user-001")
    session = ChatSession.objects.filter(owner=heavy).annotate(n=Count("turns")).order_by("-n", "-updated_at").first()
    rig = Rig.objects.filter(name__startswith="gen-rig-", enabled=True).order_by("pk").first()
    if session is None or rig is None:
        raise SystemExit("no generated data here: run manage.py rigdash_generate first")
    return heavy, admin, session.pk, rig.pk, _oldest_page_cursor(heavy)


def _oldest_page_cursor(user: Any) -> str:
    """The cursor of the user's last page of chats (the keyset's deepest page)."""
    from inference.turns.selectors import CHAT_PAGE, chat_cursor, session_list_for

    chats = session_list_for(user).order_by("-updated_at", "-pk")
    count = chats.count()
    return chat_cursor(chats[max(0, count - CHAT_PAGE - 1)]) if count > CHAT_PAGE else ""


def run(repeat: int, only: str) -> list[PageCost]:
    from django.test import Client

    from inference.models import UsageRangeSums
    from rigdash.gcpolicy import settle

    heavy, admin, session_id, rig_id, oldest_chats = _subjects()
    clients = {False: Client(HTTP_HOST="localhost"), True: Client(HTTP_HOST="localhost")}
    clients[False].force_login(heavy)
    clients[True].force_login(admin)
    settle("bench.pages")  # as a web process does once it has started (rigdash/gcpolicy.py)
    results = []
    for page in pages(session_id=session_id, rig_id=rig_id, oldest_chats=oldest_chats):
        if only and only not in page.name:
            continue
        client = clients[page.staff]

        def get(client: Client = client, page: Page = page) -> Any:
            if page.cold:
                UsageRangeSums.objects.all().delete()
            return client.get(page.url)

        cost = measure(page, get, repeat)
        results.append(cost)
        flag = "" if cost.p95_ms <= TARGET_P95_MS and cost.status == 200 else "  <-- over"
        print(
            f"{cost.name:30} {cost.status} q={cost.queries:3d} p50={cost.p50_ms:8.1f} p95={cost.p95_ms:8.1f} "
            f"cpu={cost.cpu_p50_ms:7.1f} ms {cost.bytes / 1024:9.1f} KiB peak={cost.peak_kib:9.1f} KiB{flag}",
            flush=True,
        )
    return results


def yardstick_ms() -> float:
    """This machine's speed now: the best of three runs of a fixed pure-Python loop (10,000,000 additions), in ms.
    A 2-core VM's speed moves by 2x within an hour here; a table states it beside its figures, and runs compare
    only where their yardsticks do."""
    best = math.inf
    for _ in range(3):
        start, total = time.perf_counter(), 0
        for n in range(10_000_000):
            total += n
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 1)


def data_size() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        sizes = {}
        for table in ("inference_turn", "inference_chatsession", "monitoring_rigsample", "inference_auditlog"):
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = %s", [table])
            sizes[table] = int(cursor.fetchone()[0])
        cursor.execute("SELECT pg_database_size(current_database())")
        sizes["database_bytes"] = int(cursor.fetchone()[0])
    return sizes


def slope_table(paths: list[str]) -> str:
    """A Markdown table of runs at growing data sizes (JSON from --json, smallest first): p50/p95 and queries at each
    size, and the slope: how many times p95 grows per 10x turns (the geometric mean over the steps)."""
    runs = [json.load(open(path)) for path in paths]  # noqa: SIM115
    sizes = [run["data"]["inference_turn"] for run in runs]
    speed = [run.get("machine", {}).get("yardstick_ms") for run in runs]
    head = " | ".join(
        f"{size:,} turns p50 / p95 ms (queries){f'; yardstick {min(ms)}-{max(ms)} ms' if ms else ''}"
        for size, ms in zip(sizes, speed, strict=True)
    )
    lines = [f"| page | {head} | p95 x per 10x turns |", "|---" * (len(runs) + 2) + "|"]
    for i, page in enumerate(runs[0]["pages"]):
        cells = [run["pages"][i] for run in runs]
        tens = math.log10(sizes[-1] / sizes[0])
        slope = (cells[-1]["p95_ms"] / cells[0]["p95_ms"]) ** (1 / tens) if tens > 0 and cells[0]["p95_ms"] else 0.0
        figures = " | ".join(f"{c['p50_ms']:.0f} / {c['p95_ms']:.0f} ({c['queries']})" for c in cells)
        lines.append(f"| {page['name']} | {figures} | {slope:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print the slope table of these runs and stop")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--only", default="", help="pages whose name contains this")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.table:
        print(slope_table(args.table))
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")
    os.environ.setdefault("RIGDASH_DB_CONN_MAX_AGE", "600")
    import django

    django.setup()
    size = data_size()
    before = yardstick_ms()
    print(f"data: {size}; yardstick {before} ms", flush=True)
    results = run(args.repeat, args.only)
    after = yardstick_ms()
    print(f"yardstick after: {after} ms", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            machine = {"yardstick_ms": [before, after]}
            json.dump({"data": size, "machine": machine, "pages": [asdict(r) for r in results]}, out, indent=1)


if __name__ == "__main__":
    main()
