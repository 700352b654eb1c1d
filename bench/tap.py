"""A recording pass-through proxy between RigDash's worker and llama-server: a direct reader of the same stream.

RigDash's rig points here. Every request is forwarded unchanged (but with ``Connection: close``), every
response byte is passed on as soon as it arrives, and for chat streams the arrival time (``time.time()``)
of each token is recorded before it is forwarded. That makes the tap a minimal client reading the very
stream RigDash reads, in the same run: display lag is measured against it token by token.
``GET /_tap/streams`` returns the streams recorded so far and forgets them.

Run: ``python -m bench.tap --port P --upstream U`` (both on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any

from bench.httpserve import Request, json_response, read_request, serve_forever
from bench.sse import ChunkedDecoder, ProtocolError, SSEParser, parse_chat_event, parse_response_head, split_head

STREAMS: list[dict[str, Any]] = []
UPSTREAM = 0


def forwarded_head(request: Request) -> bytes:
    lines = request.raw_head.decode("latin-1").split("\r\n")
    kept = [line for line in lines[1:] if line.split(":", 1)[0].strip().lower() not in ("connection", "keep-alive")]
    return ("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")


class Recorder:
    """Parses the response as it passes: head, chunked body, SSE events with their arrival times."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.buffer = b""
        self.head_done = False
        self.decoder: ChunkedDecoder | None = None
        self.parser = SSEParser()

    def feed(self, data: bytes, now: float) -> None:
        if not self.head_done:
            self.buffer += data
            split = split_head(self.buffer)
            if split is None:
                return
            head, data = split
            self.head_done = True
            response = parse_response_head(head)
            self.record["status"] = response.status
            self.decoder = ChunkedDecoder() if response.chunked else None
        body = self.decoder.feed(data) if self.decoder else data
        for raw in self.parser.feed(body):
            event = parse_chat_event(raw)
            if event.text:
                self.record["events"].append([now, event.text])
            if event.finish_reason:
                self.record["finish_reason"] = event.finish_reason
                self.record["timings"] = event.timings
            if event.error:
                self.record["error"] = event.error


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await read_request(reader)
        if request is None:
            return
        if request.target.startswith("/_tap/streams"):
            streams = list(STREAMS)
            STREAMS.clear()
            writer.write(json_response(200, streams))
            await writer.drain()
            return
        await relay(request, reader, writer)
    except (OSError, ProtocolError, TimeoutError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def relay(request: Request, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
    t_request = time.time()
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", UPSTREAM, limit=1 << 22)
    except OSError:
        client.write(json_response(502, {"error": {"code": "tap_upstream", "message": "llama-server unreachable"}}))
        return
    recorder = None
    if request.method == "POST" and request.target.startswith("/v1/chat/completions"):
        try:
            body = json.loads(request.body)
        except ValueError:
            body = None
        record: dict[str, Any] = {
            "t_request": t_request,
            "request": body,
            "events": [],
            "status": None,
            "finish_reason": None,
            "timings": None,
            "t_end": None,
            "client_closed": False,
        }
        STREAMS.append(record)
        recorder = Recorder(record)
    up_writer.write(forwarded_head(request) + request.body)
    # The worker closes its connection to cancel a reply: watch for that and close upstream in turn.
    client_gone = asyncio.ensure_future(client_reader.read(1))
    try:
        while True:
            read = asyncio.ensure_future(up_reader.read(65536))
            done, _ = await asyncio.wait({read, client_gone}, return_when=asyncio.FIRST_COMPLETED)
            if read not in done:
                read.cancel()
                if recorder:
                    recorder.record["client_closed"] = True
                break
            data = read.result()
            if not data:
                break
            now = time.time()
            client.write(data)  # forward first, then record
            if recorder:
                try:
                    recorder.feed(data, now)
                except (ProtocolError, ValueError) as exc:
                    recorder.record["error"] = repr(exc)
                    recorder = None
            await client.drain()
    finally:
        client_gone.cancel()
        with contextlib.suppress(Exception):
            await client_gone
        if recorder:
            recorder.record["t_end"] = time.time()
        up_writer.close()


def main() -> None:
    global UPSTREAM
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    args = parser.parse_args()
    UPSTREAM = args.upstream
    serve_forever(handle, args.port)


if __name__ == "__main__":
    main()
