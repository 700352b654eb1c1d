"""Run the monitoring sampler (scripts/run starts it beside the web server and the worker).

SIGTERM and SIGINT stop it cleanly. It needs its own handlers: as a container's PID 1 (docker-compose.yml) the
kernel drops a signal that has none, so `docker compose stop` would wait out the grace period and kill it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from django.core.management.base import BaseCommand

from monitoring import sampler
from rigdash import gcpolicy

log = logging.getLogger(__name__)


async def run_until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    gcpolicy.settle("sampler")
    log.info("sampler running (SIGTERM or SIGINT stops it)")
    await sampler.run(stop=stop)


class Command(BaseCommand):
    help = "Sample every enabled rig once a second and stream the samples to dashboards."

    def handle(self, *args: Any, **options: Any) -> None:
        asyncio.run(run_until_signalled())
        self.stdout.write("sampler stopped")
