"""The gateway floor: a bare HTTP relay in front of a backend, with no RigDash (no key check, database, queue, worker
or channel layer), for ``tests/test_openai_stream_cost.py`` to read the same replies through.

It is what the least a gateway can do costs on this machine: it reads a client's HTTP/1.1 request (head and
``Content-Length`` body, keep-alive), writes it unchanged to the backend over a connection it keeps open (opened on
the client connection's first request, and again when the backend closed it), and copies the response's bytes back
as they arrive, until the last chunk of a chunked body (or the declared length). Times added over reading the
backend directly are the floor RigDash's ``/v1/`` is measured against (performance.md: added TTFT).

Run: ``python -m bench.httprelay --port P --upstream-port U``; prints READY.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from bench.sse import ChunkedDecoder, ProtocolError, parse_request_head, parse_response_head, split_head

READ = 65536
Upstream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _head(reader: asyncio.StreamReader, buffer: bytes) -> tuple[bytes, bytes] | None:
    """The next message's head and what followed it, or None when the peer closed before one began."""
    while (split := split_head(buffer)) is None:
        chunk = await reader.read(READ)
        if not chunk:
            if buffer:
                raise ProtocolError("connection closed inside a message head")
            return None
        buffer += chunk
    return split


async def _exactly(reader: asyncio.StreamReader, have: bytes, length: int) -> tuple[bytes, bytes]:
    """``length`` bytes (from ``have``, then the stream), and what came after them."""
    while len(have) < length:
        chunk = await reader.read(READ)
        if not chunk:
            raise ProtocolError("connection closed inside a body")
        have += chunk
    return have[:length], have[length:]


class Relay:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: Upstream | None = None
        buffer = b""
        try:
            while (message := await _head(reader, buffer)) is not None:
                raw_head, rest = message
                _, _, headers = parse_request_head(raw_head)
                body, buffer = await _exactly(reader, rest, int(headers.get("content-length", "0")))
                upstream, head = await self._send(upstream, raw_head + b"\r\n\r\n" + body)
                if not await self._copy_response(upstream[0], writer, *head):
                    upstream[1].close()
                    upstream = None
        except (OSError, ProtocolError):
            pass
        finally:
            for w in (writer, *(upstream[1:] if upstream else ())):
                w.close()

    async def _send(self, upstream: Upstream | None, request: bytes) -> tuple[Upstream, tuple[bytes, bytes]]:
        """Write the request to the backend and read its response head, on the kept connection or, when there is
        none or the backend closed it meanwhile, a new one."""
        if upstream is not None:
            try:
                upstream[1].write(request)
                if (head := await _head(upstream[0], b"")) is not None:
                    return upstream, head
            except OSError:
                pass
            upstream[1].close()
        upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port, limit=1 << 22)
        upstream[1].write(request)
        if (head := await _head(upstream[0], b"")) is None:
            raise ProtocolError("the backend closed before its response")
        return upstream, head

    @staticmethod
    async def _copy_response(upstream: asyncio.StreamReader, writer: asyncio.StreamWriter, raw_head: bytes,
                             rest: bytes) -> bool:  # fmt: skip
        """Copy one response from the backend to the client as its bytes arrive; False when the backend closes
        the connection after it (cpp-httplib does after a few requests on one connection)."""
        writer.write(raw_head + b"\r\n\r\n" + rest)
        response = parse_response_head(raw_head)
        if not response.chunked:
            body, _ = await _exactly(upstream, rest, response.content_length or 0)
            writer.write(body[len(rest) :])
        else:
            decoder = ChunkedDecoder()  # only to see the last chunk: the bytes go on as they came
            decoder.feed(rest)
            tail = rest[-4:]
            # The decoder is done at the last chunk's size line; the blank line that ends its trailers may come in a
            # later read, and a client waits for it before the next request on the connection.
            while not (decoder.done and tail == b"\r\n\r\n"):
                chunk = await upstream.read(READ)
                if not chunk:
                    raise ProtocolError("the backend closed inside its response")
                writer.write(chunk)
                decoder.feed(chunk)
                tail = (tail + chunk)[-4:]
        return response.headers.get("connection", "").lower() != "close"


async def serve(port: int, upstream_port: int) -> None:
    relay = Relay(upstream_port)
    server = await asyncio.start_server(relay.handle, "127.0.0.1", port, limit=1 << 22)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("READY", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
