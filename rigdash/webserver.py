"""RigDash's web server: uvicorn serving ``rigdash.asgi:application``, with a main loop that wakes once a second.

``python -m rigdash.webserver --host 127.0.0.1 --port 8000`` is what scripts/run, the benchmark, the tests,
docker-compose.yml and the Dockerfile run (``rigdash.launcher.web_command``); every other setting is here.

Why uvicorn and not Daphne: a token batch's websocket frame costs Daphne about twice the CPU (Twisted queues each
write for a later turn of the loop, autobahn formats log arguments it never logs). The settings keep
what Daphne did: no access log, no trust of its own in X-Forwarded-* headers (a client could claim any address:
rigdash/proxies.py believes them from RIGDASH_TRUSTED_PROXIES only), and no lifespan protocol (Channels' router
has none). Unlike Daphne, a websocket message is bounded (WS_MAX_BYTES).

Why not uvicorn's own command: its server wakes every 0.1 s to refresh the Date header and to look for a request
to stop: idle, those ten wake-ups a second are most of the web process's CPU. ``QuietServer`` does the same work
once a second, and wakes at once on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
import warnings
from types import FrameType

import uvicorn

from rigdash import gcpolicy
from rigdash.env import WS_MAX_BYTES

TICK_S = 1.0  # the Date header's resolution is a second anyway
STARTUP_FAILURE = 3  # uvicorn's exit code when it could not start (a port in use)
# What uvicorn and websockets log at INFO for every websocket that opens and closes. Daphne logged none of it; here a
# wave of 250 reconnecting pages wrote 750 lines, each with the client's address. A refused socket (its status,
# 403 for a foreign Origin) and every warning and error are still logged.
PER_CONNECTION = frozenset({'%s - "WebSocket %s" [accepted]', "connection open", "connection closed"})


class PerConnectionFilter(logging.Filter):
    """Drops the per-connection INFO lines (PER_CONNECTION) from uvicorn's ``uvicorn.error`` logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or record.msg not in PER_CONNECTION


class QuietServer(uvicorn.Server):
    """uvicorn's Server with a main loop that ticks every TICK_S instead of every 0.1 s."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # on_tick refreshes the Date header when counter % 10 == 0: at every one of these ticks.
            counter = (counter + 10) % 864_000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            should_exit = await self.on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        gcpolicy.settle("web")  # the application is loaded: what it built is kept out of full collections

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)  # sets should_exit (a second SIGINT forces the exit)
        if self._loop is not None and self._wake is not None:  # the signal arrives between bytecodes: hand it over
            self._loop.call_soon_threadsafe(self._wake.set)


def config(host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        "rigdash.asgi:application",
        host=host,
        port=port,
        http="httptools",
        ws="websockets-sansio",
        ws_max_size=WS_MAX_BYTES,
        loop="asyncio",
        lifespan="off",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rigdash.webserver", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    # WhiteNoise (6.12) answers a static file with a synchronous file iterator, which Django's ASGI handler reads
    # in a thread and warns about once per process. The files are a few KB; Daphne's Twisted logging hid it.
    warnings.filterwarnings("ignore", "StreamingHttpResponse must consume synchronous iterators", Warning)
    server = QuietServer(config(args.host, args.port))  # Config sets up uvicorn's logging: filter after it
    logging.getLogger("uvicorn.error").addFilter(PerConnectionFilter())
    server.run()
    return 0 if server.started else STARTUP_FAILURE


if __name__ == "__main__":
    sys.exit(main())
