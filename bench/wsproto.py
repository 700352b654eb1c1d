"""A minimal RFC 6455 websocket client on asyncio streams (the venv has no websocket client library).

``encode_frame``/``decode_frame`` are pure; ``WSClient`` adds the opening handshake and the receive loop.
Text frames only (what RigDash speaks), with ping/pong and close handled.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import orjson

from bench.sse import parse_response_head, split_head

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


class WSClosed(Exception):
    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"websocket closed ({code}) {reason}".strip())
        self.code = code


def _mask(payload: bytes, key: bytes) -> bytes:
    if not payload:
        return payload
    repeated = (key * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


def encode_frame(opcode: int, payload: bytes, *, mask_key: bytes | None = None, fin: bool = True) -> bytes:
    """One frame; clients must mask (pass a 4-byte key), servers must not."""
    head = bytearray([(0x80 if fin else 0) | opcode])
    mask_bit = 0x80 if mask_key is not None else 0
    n = len(payload)
    if n < 126:
        head.append(mask_bit | n)
    elif n < 1 << 16:
        head.append(mask_bit | 126)
        head += struct.pack("!H", n)
    else:
        head.append(mask_bit | 127)
        head += struct.pack("!Q", n)
    if mask_key is None:
        return bytes(head) + payload
    if len(mask_key) != 4:
        raise ValueError("mask key must be 4 bytes")
    return bytes(head) + mask_key + _mask(payload, mask_key)


@dataclass(frozen=True)
class Frame:
    fin: bool
    opcode: int
    payload: bytes


def decode_frame(buffer: bytes | bytearray) -> tuple[Frame, int] | None:
    """(frame, bytes consumed) for the first whole frame in ``buffer``; None if it is not all there yet."""
    if len(buffer) < 2:
        return None
    b0, b1 = buffer[0], buffer[1]
    n = b1 & 0x7F
    pos = 2
    if n == 126:
        if len(buffer) < 4:
            return None
        n = struct.unpack_from("!H", buffer, 2)[0]
        pos = 4
    elif n == 127:
        if len(buffer) < 10:
            return None
        n = struct.unpack_from("!Q", buffer, 2)[0]
        pos = 10
    key = None
    if b1 & 0x80:
        if len(buffer) < pos + 4:
            return None
        key = bytes(buffer[pos : pos + 4])
        pos += 4
    if len(buffer) < pos + n:
        return None
    payload = bytes(buffer[pos : pos + n])
    if key is not None:
        payload = _mask(payload, key)
    return Frame(fin=bool(b0 & 0x80), opcode=b0 & 0x0F, payload=payload), pos + n


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()  # noqa: S324 - RFC 6455


class WSClient:
    """One websocket connection to 127.0.0.1; ``recv_json`` returns (arrival time.time(), frame)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._buffer = bytearray()
        self._parts: list[bytes] = []
        self.closed: WSClosed | None = None

    @classmethod
    async def connect(
        cls, port: int, path: str, *, cookie: str | None = None, origin: str | None = None, timeout_s: float = 20
    ) -> WSClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, limit=1 << 22), timeout_s)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            f"Origin: {origin or f'http://127.0.0.1:{port}'}",
        ]
        if cookie:
            lines.append(f"Cookie: {cookie}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        buffer = b""
        deadline = time.monotonic() + timeout_s
        while (split := split_head(buffer)) is None:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
            if not chunk:
                writer.close()
                raise WSClosed(None, "connection closed during the handshake")
            buffer += chunk
        head, rest = split
        response = parse_response_head(head)
        if response.status != 101 or response.headers.get("sec-websocket-accept") != accept_key(key):
            writer.close()
            raise WSClosed(None, f"handshake refused with HTTP {response.status}")
        client = cls(reader, writer)
        client._buffer += rest
        return client

    async def send_json(self, obj: Any) -> None:
        await self.send_text(json.dumps(obj))

    async def send_text(self, text: str) -> None:
        self.writer.write(encode_frame(OP_TEXT, text.encode(), mask_key=os.urandom(4)))
        await self.writer.drain()

    async def recv_text(self, timeout_s: float | None = None) -> tuple[float, str]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            decoded = decode_frame(self._buffer)
            if decoded is None:
                if self.closed:
                    raise self.closed
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                chunk = await asyncio.wait_for(self.reader.read(1 << 18), wait)
                if not chunk:
                    self.closed = WSClosed(None, "connection lost")
                    raise self.closed
                self._buffer += chunk
                continue
            frame, used = decoded
            del self._buffer[:used]
            if frame.opcode == OP_PING:
                self.writer.write(encode_frame(OP_PONG, frame.payload, mask_key=os.urandom(4)))
                continue
            if frame.opcode == OP_CLOSE:
                code = struct.unpack("!H", frame.payload[:2])[0] if len(frame.payload) >= 2 else None
                self.closed = WSClosed(code, frame.payload[2:].decode("utf-8", "replace"))
                raise self.closed
            if frame.opcode in (OP_TEXT, OP_BINARY, OP_CONT):
                self._parts.append(frame.payload)
                if frame.fin:
                    payload = b"".join(self._parts)
                    self._parts.clear()
                    return time.time(), payload.decode("utf-8")

    async def recv_json(self, timeout_s: float | None = None) -> tuple[float, dict[str, Any]]:
        arrived, text = await self.recv_text(timeout_s)
        return arrived, orjson.loads(text)  # the client shares the cores with what it measures: orjson is cheapest

    async def close(self) -> None:
        if self.writer.is_closing():
            return
        try:
            self.writer.write(encode_frame(OP_CLOSE, struct.pack("!H", 1000), mask_key=os.urandom(4)))
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 2)
        except (OSError, TimeoutError):
            pass
