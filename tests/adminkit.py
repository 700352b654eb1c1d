"""Helpers for the admin, quota and fairness tests: a board socket, users, sessions and turns."""

from __future__ import annotations

import json
import time
from typing import Any

from channels.testing import WebsocketCommunicator

from rigdash.asgi import application


class BoardSocket:
    """The admin board's websocket (/ws/board/) on the real ASGI app, with a logged-in user's cookie."""

    def __init__(self, cookie: str | None, origin: str = "http://127.0.0.1", path: str = "/ws/board/") -> None:
        headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1")]
        if cookie:
            headers.append((b"cookie", f"sessionid={cookie}".encode()))
        self.comm = WebsocketCommunicator(application, path, headers=headers)
        self.frames: list[dict[str, Any]] = []

    async def connect(self) -> tuple[bool, Any]:
        return await self.comm.connect(timeout=10)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.comm.send_to(text_data=json.dumps(frame))

    async def recv(self, timeout: float = 30) -> dict[str, Any]:
        frame = json.loads(await self.comm.receive_from(timeout=timeout))
        self.frames.append(frame)
        return frame

    async def recv_until(self, predicate: Any, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching frame within {timeout} s; got {self.frames[-5:]}")
            try:
                frame = await self.recv(timeout=remaining)
            except TimeoutError:
                raise AssertionError(f"no matching frame within {timeout} s; got {self.frames[-8:]}") from None
            if predicate(frame):
                return frame

    async def close(self) -> None:
        await self.comm.disconnect()


async def closed_with(comm: WebsocketCommunicator, timeout: float) -> int | None:
    """Wait for the server to close the socket; its close code (frames before it are skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            output = await comm.receive_output(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            return None
        if output["type"] == "websocket.close":
            return int(output.get("code", 1000))
    return None


def make_user(username: str, **extra: Any) -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username=username, password=f"{username}-pw-123", **extra)


def make_session(owner: Any, rig: Any, model_name: str) -> Any:
    from inference.models import ChatSession

    return ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)


def quiet(rig: Any) -> Any:
    """Point the rig at a Celery queue no worker listens to: submitted turns are dispatched but never run."""
    rig.queue = f"rig.nobody-listens.{rig.pk}"
    rig.save(update_fields=["queue"])
    return rig
