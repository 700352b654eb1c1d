"""Roll up closed UTC days of usage ahead of the first usage page that needs them (inference/turns/usage_rollup.py),
and store what the usage page and the CSV add up over them for everyone's usual ranges (usage_sums.py, usage_csv.py)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from inference.turns import usage_csv, usage_report
from inference.turns.usage import MAX_DAYS
from inference.turns.usage_rollup import CLOSED_AFTER, rollup, today_utc

WARMED_DAYS = (30, MAX_DAYS)  # the page's default range and the longest


class Command(BaseCommand):
    help = "Add up closed days of usage into the daily rollup (once per day; usage pages do it on demand too)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=int, default=MAX_DAYS, help="how far back (default: the longest range)")

    def handle(self, *args: Any, **options: Any) -> None:
        start = time.perf_counter()
        today = today_utc()
        done = rollup(today - timedelta(days=options["days"] - 1), today)
        if done and connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # the planner's row counts, before autovacuum gets to it
                cursor.execute("ANALYZE inference_usageday")
        self.stdout.write(f"rolled up {done} days in {time.perf_counter() - start:.1f} s")
        if usage_csv.in_sql():  # the CSV's closed months, written now rather than by the first download
            start = time.perf_counter()
            months = usage_csv.warm_months(today - timedelta(days=options["days"] - 1), today - CLOSED_AFTER)
            self.stdout.write(f"CSV: {months} closed months ready in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        for days in WARMED_DAYS:  # everyone's page over its usual ranges: its first visit of the day reads them
            usage_report.page_context(days=days, user_id=None, page=1)
        self.stdout.write(f"usage page: the sums of {WARMED_DAYS} days stored in {time.perf_counter() - start:.1f} s")
