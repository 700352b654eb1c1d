"""Run the monitoring sampler (scripts/run starts it beside the web server and the worker)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from django.core.management.base import BaseCommand

from monitoring import sampler


class Command(BaseCommand):
    help = "Sample every enabled rig once a second and stream the samples to dashboards."

    def handle(self, *args: Any, **options: Any) -> None:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(sampler.run())
