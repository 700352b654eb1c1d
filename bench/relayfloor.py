"""The many-viewers floor: the frames of ``bench.scale viewers``, sent to the same sockets by one minimal relay, with no
RigDash (no Redis, worker, database, channel layer or Django).

It speaks as much of RigDash's websocket protocol as the benchmark's client reads (docs/streaming.md): a chat socket
(``/ws/chat/<n>/``) gets ``session.snapshot``; a ``turn.send`` on it makes the relay read the synthetic source's
stream for that prompt itself and send every socket of that session ``turn.queued``, a ``token`` frame per flush tick
(the same interval as RigDash's, ticks shared by every turn), then ``turn.end``. Every other socket (the dashboards
and the board) gets a ``rig.sample`` frame once a second, all at once, as the sampler's publication reaches them: one
of RigDash's own sample frames from the same run (``--sample-file``, so the client parses the same structure), or
padding of the given size. What is left is the cost of the same frames on the same cores, read by the same client:
the floor of display lag at that many sockets on this machine.

Run: ``python -m bench.relayfloor --port P --source-port S [--interval-ms 20] [--sample-file F | --sample-bytes N]``;
prints READY.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import time
from pathlib import Path
from typing import Any

import orjson

from bench.httpstream import chat_payload, direct_chat
from bench.sse import split_head
from bench.wsproto import OP_CLOSE, OP_TEXT, accept_key, decode_frame, encode_frame
from inference.worker.pace import TICK_EPSILON_S, FlushPace


class Relay:
    def __init__(
        self, source_port: int, interval_s: float, sample_bytes: int, sample: dict[str, Any] | None = None
    ) -> None:
        self.source_port, self.sample_bytes, self.sample = source_port, sample_bytes, sample
        self.pace = FlushPace(interval_s, interval_s)
        self.sessions: dict[int, set[asyncio.StreamWriter]] = {}
        self.passive: set[asyncio.StreamWriter] = set()
        self.turn_ids = itertools.count(1)

    @staticmethod
    def send(writers: set[asyncio.StreamWriter], payload: bytes) -> None:
        frame = encode_frame(OP_TEXT, payload)
        for writer in tuple(writers):
            if not writer.is_closing():
                writer.write(frame)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buffer = b""
        while (split := split_head(buffer)) is None:
            chunk = await reader.read(65536)
            if not chunk:
                writer.close()
                return
            buffer += chunk
        head, rest = split
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        fields = (line.partition(":") for line in lines[1:])
        headers = {name.strip().lower(): value.strip() for name, _, value in fields}
        writer.write(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(headers.get('sec-websocket-key', ''))}\r\n\r\n".encode()
        )
        session = int(path.strip("/").split("/")[-1]) if path.startswith("/ws/chat/") else None
        group = self.sessions.setdefault(session, set()) if session is not None else self.passive
        group.add(writer)
        if session is not None:
            self.send({writer}, orjson.dumps({"type": "session.snapshot", "session": {"id": session}, "turns": []}))
        data = bytearray(rest)
        try:
            while True:
                decoded = decode_frame(data)
                if decoded is None:
                    chunk = await reader.read(65536)
                    if not chunk:
                        return
                    data += chunk
                    continue
                frame, used = decoded
                del data[:used]
                if frame.opcode == OP_CLOSE:
                    return
                if frame.opcode == OP_TEXT and session is not None:
                    message = orjson.loads(frame.payload)
                    if message.get("type") == "turn.send":
                        asyncio.get_running_loop().create_task(self.relay(session, message))
        except (OSError, ValueError):
            return
        finally:
            group.discard(writer)
            writer.close()

    async def relay(self, session: int, message: dict[str, Any]) -> None:
        """One turn: read the source's stream and send its tokens to the session's sockets a tick at a time."""
        turn = next(self.turn_ids)
        writers = self.sessions.get(session, set())
        self.send(writers, orjson.dumps({"type": "turn.queued", "turn": {"id": turn}}))
        pending: list[str] = []
        sent = 0

        def flush() -> None:
            nonlocal sent
            if pending:
                text, count = "".join(pending), len(pending)
                pending.clear()
                batch = {"type": "token", "turn": turn, "seq_from": sent + 1, "seq_to": sent + count, "text": text}
                self.send(writers, orjson.dumps(batch))
                sent += count

        async def ticks() -> None:  # RigDash's own rule for the ticks every turn shares
            while True:
                now = time.perf_counter()
                await asyncio.sleep(self.pace.next_tick(now + TICK_EPSILON_S) - now)
                flush()

        ticker = asyncio.get_running_loop().create_task(ticks())
        max_tokens = int((message.get("params") or {}).get("max_tokens", 256))
        payload = chat_payload(model="synthetic", prompt=str(message.get("text", "")), max_tokens=max_tokens, seed=0)
        try:
            await direct_chat(self.source_port, payload, timeout_s=600, on_text=pending.append)
        finally:
            ticker.cancel()
        flush()
        self.send(writers, orjson.dumps({"type": "turn.end", "turn": {"id": turn, "status": "done"}}))

    async def samples(self) -> None:
        """A sample to every passive socket once a second, all at once (the sampler's one publication)."""
        sample = self.sample or {"pad": "x" * max(0, self.sample_bytes - 80)}
        while True:
            await asyncio.sleep(1.0 - time.time() % 1.0)
            sample = {**sample, "ts": time.time()}
            self.send(self.passive, orjson.dumps({"type": "rig.sample", "rig": 1, "sample": sample}))


async def serve(port: int, relay: Relay) -> None:
    server = await asyncio.start_server(relay.handle, "127.0.0.1", port, limit=1 << 22)
    sampler = asyncio.get_running_loop().create_task(relay.samples())
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("READY", flush=True)
    await stop.wait()
    sampler.cancel()
    server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--source-port", type=int, required=True)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--sample-bytes", type=int, default=6000)
    parser.add_argument("--sample-file", help="a rig.sample frame as RigDash sent it: sent in place of padding")
    args = parser.parse_args(argv)
    sample = orjson.loads(Path(args.sample_file).read_bytes())["sample"] if args.sample_file else None
    asyncio.run(serve(args.port, Relay(args.source_port, args.interval_ms / 1000, args.sample_bytes, sample)))


if __name__ == "__main__":
    main()
