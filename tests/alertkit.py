"""Real receivers for alert deliveries, started by the tests: an HTTP server (http.server in a thread) that records
every POST, and a minimal SMTP server (asyncio streams in a thread) that speaks a real SMTP conversation over a
socket (RFC 5321: greeting, EHLO/HELO, MAIL, RCPT, DATA with dot-unstuffing, RSET, NOOP, QUIT) and records each
message."""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    at: float  # time.time() when it arrived
    where: str  # the HTTP path, or "smtp"
    headers: dict[str, str]
    body: bytes
    rcpt: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)

    def mail(self) -> email.message.EmailMessage:
        return email.message_from_bytes(self.body, policy=email.policy.default)  # type: ignore[return-value]


class HttpReceiver:
    """POSTs to any path are recorded and answered 200; ``fail_first`` POSTs are answered 500 first."""

    def __init__(self, fail_first: int = 0) -> None:
        self.received: list[Received] = []
        self.fail_left = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if receiver.fail_left > 0:
                    receiver.fail_left -= 1
                    self.send_response(500)
                else:
                    receiver.received.append(Received(time.time(), self.path, dict(self.headers.items()), body))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.where == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SmtpReceiver:
    """An SMTP server on 127.0.0.1 (its own event loop in a thread)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._session, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def reply(line: str) -> None:
            writer.write(f"{line}\r\n".encode())
            await writer.drain()

        await reply("220 rigdash-test ESMTP")
        rcpt: list[str] = []
        sender = ""
        try:
            while line := await reader.readline():
                verb = line.decode(errors="replace").strip()
                upper = verb.upper()
                if upper.startswith("EHLO"):
                    await reply("250-rigdash-test")
                    await reply("250 8BITMIME")
                elif upper.startswith("HELO"):
                    await reply("250 rigdash-test")
                elif upper.startswith("MAIL FROM:"):
                    sender, rcpt = verb[10:].strip(), []
                    await reply("250 OK")
                elif upper.startswith("RCPT TO:"):
                    rcpt.append(verb[8:].strip().strip("<>"))
                    await reply("250 OK")
                elif upper == "DATA":
                    await reply("354 End data with <CR><LF>.<CR><LF>")
                    lines = []
                    while (data := await reader.readline()) not in (b".\r\n", b".\n", b""):
                        lines.append(data[1:] if data.startswith(b"..") else data)
                    self.received.append(Received(time.time(), "smtp", {"from": sender}, b"".join(lines), rcpt))
                    await reply("250 OK: queued")
                elif upper in ("RSET", "NOOP"):
                    await reply("250 OK")
                elif upper == "QUIT":
                    await reply("221 Bye")
                    break
                else:
                    await reply("502 Command not implemented")
        finally:
            writer.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def wait_for(predicate: Any, *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
