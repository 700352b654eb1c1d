"""A websocket client for tests: the real ASGI app in-process, with a logged-in user's session cookie."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from channels.testing import WebsocketCommunicator

from rigdash.asgi import application


class Socket:
    """Any RigDash websocket, opened with a session cookie and an Origin header."""

    def __init__(self, path: str, cookie: str | None, origin: str = "http://127.0.0.1") -> None:
        headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1")]
        if cookie:
            headers.append((b"cookie", f"sessionid={cookie}".encode()))
        self.comm = WebsocketCommunicator(application, path, headers=headers)
        self.frames: list[dict[str, Any]] = []

    async def connect(self) -> tuple[bool, Any]:
        return await self.comm.connect(timeout=10)

    async def send(self, frame: dict[str, Any]) -> None:
        await self.comm.send_to(text_data=json.dumps(frame))

    async def send_raw(self, text: str) -> None:
        await self.comm.send_to(text_data=text)

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
        await asyncio.sleep(0)


class ChatSocket(Socket):
    def __init__(self, session_id: int, cookie: str | None, origin: str = "http://127.0.0.1") -> None:
        super().__init__(f"/ws/chat/{session_id}/", cookie, origin)


MonitorSocket = Socket


class ModelsSocket(Socket):
    """A rig's model-management socket (staff only)."""

    def __init__(self, rig_id: int, cookie: str | None) -> None:
        super().__init__(f"/ws/rigs/{rig_id}/models/", cookie)


class BoardSocket(Socket):
    """The admin board's socket (/ws/board/)."""

    def __init__(self, cookie: str | None, origin: str = "http://127.0.0.1", path: str = "/ws/board/") -> None:
        super().__init__(path, cookie, origin)


def token_frames(frames: list[dict[str, Any]], turn_id: int) -> list[dict[str, Any]]:
    return [f for f in frames if f["type"] == "token" and f["turn"] == turn_id]
