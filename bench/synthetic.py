"""A synthetic llama-server: llama.cpp's wire format at a fixed token rate, on one port or many (one per rig).

``POST /v1/chat/completions`` streams ``data: {choices[0].delta.content, timings}`` events, then one with a
finish reason and its timings, then ``data: [DONE]``, chunked, like llama-server; ``POST /completion`` streams
llama-server's native ``data: {content, stop}`` events. The rate, length and time to first token come from a
directive in the last user message (or the prompt), ``[synthetic rate=100 tokens=300 ttft=20]``, capped by
``max_tokens`` / ``n_predict``. ``GET /health``, ``/props``, ``/slots`` (``--slots``), ``/metrics`` (Prometheus
text, ``llamacpp:`` names) and ``/v1/models`` answer as llama-server does, from the port's own slots and counters;
``--busy-rate R`` keeps one more slot decoding at R tokens/s on every port, as a rig working for someone else
(the sampler then samples at its full pace).

Tokens are emitted on a fixed schedule. Each wake-up writes every token due by then, each as its own event, in
one write (an event loop cannot sleep the 0.5 ms between tokens of a 2,000 tokens/s stream; a GPU server's tokens
arrive coalesced by TCP the same way). A stream more than ``CATCH_UP_S`` behind its schedule goes on from now
rather than burst, so a starved source shows a lower rate of its own (its ``timings``: ``predicted_per_second``
= (n - 1) / (t_last - t_first) at emission). ``GET /_synthetic/streams`` returns each stream's emission times
on that port and forgets them; ``GET /_synthetic/requests`` the requests it answered per path since the last ask.

Run: ``python -m bench.synthetic --port P`` (``--ports N`` serves P..P+N-1, or ``--ports-file F`` free ports
written one a line to F).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.httpserve import SSE_HEAD, Request, json_response, read_request
from bench.sse import DONE_LINE, LAST_CHUNK, ProtocolError, chat_event_line, encode_chunk

DIRECTIVE = re.compile(r"\[synthetic((?:\s+\w+=\d+)*)\s*\]")
WORDS = [
    "the",
    "rig",
    "streams",
    "tokens",
    "to",
    "every",
    "browser",
    "that",
    "watches",
    "its",
    "session",
    "while",
    "llama",
    "decodes",
    "on",
    "two",
    "cores",
    "and",
    "each",
    "batch",
    "carries",
    "a",
    "sequence",
    "number",
    "so",
    "nothing",
    "is",
    "lost",
    "or",
    "doubled",
    "when",
    "a",
    "socket",
    "reconnects",
    "midway",
]
CATCH_UP_S = 0.02  # a stream further behind its schedule than this goes on from now (a starved source)
N_CTX_PER_SLOT = 32768
MODEL = "synthetic"


def parse_directive(text: str) -> dict[str, int]:
    """{'rate': .., 'tokens': .., 'ttft': ..} from ``[synthetic rate=.. tokens=.. ttft=..]`` (defaults filled)."""
    found = {"rate": 100, "tokens": 256, "ttft": 20}
    match = DIRECTIVE.search(text)
    if match:
        for key, value in re.findall(r"(\w+)=(\d+)", match.group(1)):
            if key in found:
                found[key] = int(value)
    found["rate"] = max(1, found["rate"])
    return found


def synthetic_token(i: int) -> str:
    """Token i of every synthetic reply: Markdown-like prose (headings, paragraphs, lists, bold, a fence)."""
    block, pos = divmod(i, 120)
    if pos == 0:
        return f"## Part {block + 1}\n\n" if block else "## Part 1\n\n"
    if pos == 60:
        return "\n\n- first item"
    if pos in (61, 62):
        return f"\n- item {pos - 59} with **bold**"
    if pos == 63:
        return "\n\n"
    if block % 5 == 4 and pos == 90:
        return "\n\n```\ncode line " + str(block) + "\n```\n\n"
    if pos == 119:
        return ".\n\n"
    return " " + WORDS[(i * 7 + block) % len(WORDS)]


@dataclass
class Server:
    """One synthetic llama-server: its slots, its counters and the streams it emitted."""

    port: int
    slots: int = 4
    busy_rate: float = 0.0
    started: float = field(default_factory=time.time)
    streams: list[dict[str, Any]] = field(default_factory=list)
    active: dict[int, dict[str, Any]] = field(default_factory=dict)  # slot -> the stream it decodes
    next_task: int = 0
    prompt_tokens_total: int = 0
    tokens_predicted_total: int = 0
    requests_deferred: int = 0
    free: asyncio.Condition | None = None
    requests: dict[str, int] = field(default_factory=dict)  # path -> how many since the last /_synthetic/requests

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await read_request(reader)
            if request is None:
                return
            await self.route(request, writer)
            await writer.drain()
        except (OSError, ProtocolError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def route(self, request: Request, writer: asyncio.StreamWriter) -> None:
        path = request.target.split("?", 1)[0]
        if not path.startswith("/_synthetic/"):
            self.requests[path] = self.requests.get(path, 0) + 1
        if path == "/_synthetic/requests":
            counts = dict(self.requests)
            self.requests.clear()
            writer.write(json_response(200, counts))
        elif path == "/_synthetic/streams":
            streams = list(self.streams)
            self.streams.clear()
            writer.write(json_response(200, streams))
        elif path == "/health":
            writer.write(json_response(200, {"status": "ok"}))
        elif path in ("/v1/models", "/models"):
            writer.write(json_response(200, models_payload()))
        elif path == "/props":
            writer.write(json_response(200, self.props()))
        elif path == "/slots":
            writer.write(json_response(200, self.slot_list()))
        elif path == "/metrics":
            text = self.metrics().encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                + f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n".encode()
                + text
            )
        elif request.method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            body = request.json() or {}
            messages = body.get("messages") or [{}]
            directive = parse_directive(str(messages[-1].get("content", "")))
            await self.stream(body, directive, int(body.get("max_tokens") or directive["tokens"]), writer, chat=True)
        elif request.method == "POST" and path == "/completion":
            body = request.json() or {}
            directive = parse_directive(str(body.get("prompt", "")))
            limit = int(body.get("n_predict") or -1)
            await self.stream(body, directive, limit if limit > 0 else directive["tokens"], writer, chat=False)
        else:
            missing = {"code": 404, "message": "File Not Found", "type": "not_found_error"}
            writer.write(json_response(404, {"error": missing}))

    # --- what llama-server reports about itself ------------------------------------------------------------

    def props(self) -> dict[str, Any]:
        return {
            "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": N_CTX_PER_SLOT, "speculative": False,
                                            "is_processing": False, "params": {"n_predict": -1, "temperature": 0.8}},
            "total_slots": self.slots + (1 if self.busy_rate else 0),
            "model_path": f"/models/{MODEL}.gguf",
            "model_alias": MODEL,
            "chat_template": "{% for message in messages %}{{ message.content }}{% endfor %}",
            "modalities": {"vision": False, "audio": False},
            "build_info": "b0-synthetic",
        }  # fmt: skip

    def slot_list(self) -> list[dict[str, Any]]:
        out = []
        for slot in range(self.slots):
            record = self.active.get(slot)
            out.append(_slot(slot, record["task"] if record else -1, len(record["events"]) if record else 0,
                             processing=record is not None, prompt_n=record["prompt_n"] if record else 0))  # fmt: skip
        if self.busy_rate:
            decoded = int((time.time() - self.started) * self.busy_rate)
            task, n = divmod(decoded, 4000)  # a new request every 4,000 tokens
            out.append(_slot(self.slots, 1_000_000 + task, n + 1, processing=True, prompt_n=64))
        return out

    def metrics(self) -> str:
        processing = len(self.active) + (1 if self.busy_rate else 0)
        values = {
            "prompt_tokens_total": self.prompt_tokens_total,
            "prompt_seconds_total": 0.001 * self.prompt_tokens_total,
            "tokens_predicted_total": self.tokens_predicted_total,
            "tokens_predicted_seconds_total": 0.0,
            "n_decode_total": self.tokens_predicted_total,
            "n_busy_slots_per_decode": float(max(1, processing)),
            "prompt_tokens_seconds": 1000.0,
            "predicted_tokens_seconds": self.busy_rate or 0.0,
            "requests_processing": processing,
            "requests_deferred": self.requests_deferred,
        }
        lines = []
        for name, value in values.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP llamacpp:{name} {name}.", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
        return "\n".join(lines) + "\n"

    # --- streams -------------------------------------------------------------------------------------------

    async def _take_slot(self) -> int:
        assert self.free is not None
        async with self.free:
            if len(self.active) >= self.slots:
                self.requests_deferred += 1
                await self.free.wait_for(lambda: len(self.active) < self.slots)
            slot = min(set(range(self.slots)) - self.active.keys())
            self.active[slot] = {}
            return slot

    async def _give_slot(self, slot: int) -> None:
        assert self.free is not None
        async with self.free:
            self.active.pop(slot, None)
            self.free.notify()

    async def stream(
        self, body: dict[str, Any], directive: dict[str, int], limit: int, writer: asyncio.StreamWriter, *, chat: bool
    ) -> None:
        t_request = time.time()
        n = min(directive["tokens"], limit)
        record: dict[str, Any] = {"t_request": t_request, "request": body, "events": [], "finish_reason": None}
        self.streams.append(record)
        slot = await self._take_slot()
        self.next_task += 1
        live = {"task": self.next_task, "events": record["events"], "prompt_n": 1}
        self.active[slot] = live
        self.prompt_tokens_total += 1
        try:
            writer.write(SSE_HEAD)
            if chat:
                writer.write(encode_chunk(chat_event_line(text=None, model=MODEL)))
            await writer.drain()
            await _emit(record, n, directive, writer, chat=chat, slot=slot)
        finally:
            self.tokens_predicted_total += len(record["events"])
            await self._give_slot(slot)


async def _emit(
    record: dict[str, Any], n: int, directive: dict[str, int], writer: asyncio.StreamWriter, *, chat: bool, slot: int
) -> None:
    """Write ``n`` tokens on the directive's schedule: each wake-up writes every token due by then."""
    t_request = record["t_request"]
    interval = 1.0 / directive["rate"]
    loop = asyncio.get_running_loop()
    due = loop.time() + directive["ttft"] / 1000
    first = last = 0.0
    i = 0
    while i < n:
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif -delay > CATCH_UP_S:
            due = loop.time()  # far behind schedule: go on from now, never burst to catch up
        now = time.time()
        first = first or now
        horizon = loop.time()
        out = []
        while i < n and due <= horizon:
            text = synthetic_token(i)
            last = now
            i += 1
            if chat:
                line = chat_event_line(text=text, timings=_timings(i, first, last, t_request), model=MODEL)
            else:
                line = completion_event_line(text, slot=slot, predicted=i, stop=False)
            out.append(encode_chunk(line))
            record["events"].append([now, text])
            due += interval
        writer.write(b"".join(out))
        await writer.drain()
    record["finish_reason"] = "length"
    record["timings"] = _timings(n, first, last, t_request)
    if chat:
        end = chat_event_line(text=None, finish_reason="length", timings=record["timings"], model=MODEL)
        writer.write(encode_chunk(end) + encode_chunk(DONE_LINE) + LAST_CHUNK)
    else:
        end = completion_event_line("", slot=slot, predicted=n, stop=True, timings=record["timings"])
        writer.write(encode_chunk(end) + LAST_CHUNK)


def completion_event_line(
    text: str, *, slot: int, predicted: int, stop: bool, timings: dict[str, Any] | None = None
) -> bytes:
    """One ``data:`` event of llama-server's native ``/completion`` stream."""
    event: dict[str, Any] = {"index": 0, "content": text, "tokens": [], "stop": stop, "id_slot": slot,
                             "tokens_predicted": predicted, "tokens_evaluated": 1}  # fmt: skip
    if stop:
        event.update({"model": MODEL, "stop_type": "limit", "stopping_word": "", "truncated": False,
                      "timings": timings or {}})  # fmt: skip
    return b"data: " + json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _slot(slot: int, task: int, decoded: int, *, processing: bool, prompt_n: int) -> dict[str, Any]:
    return {
        "id": slot, "id_task": task, "n_ctx": N_CTX_PER_SLOT, "speculative": False, "is_processing": processing,
        "n_prompt_tokens": prompt_n if processing else 0,
        "n_prompt_tokens_processed": prompt_n if processing else 0, "n_prompt_tokens_cache": 0,
        "params": {"n_predict": -1, "temperature": 0.8},
        "next_token": [{"has_next_token": processing, "has_new_line": False, "n_remain": -1,
                        "n_decoded": decoded, "stopping_word": ""}],
    }  # fmt: skip


def models_payload() -> dict[str, Any]:
    meta = {"vocab_type": 2, "n_vocab": 49152, "n_ctx_train": 8192, "n_embd": 576, "n_params": 134515008,
            "size": 91_000_000}  # fmt: skip
    return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "llamacpp",
                                        "meta": meta}]}  # fmt: skip


def _timings(n: int, first: float, last: float, t_request: float) -> dict[str, Any]:
    span = last - first
    return {
        "prompt_n": 1,
        "prompt_ms": round((first - t_request) * 1000, 3),
        "cache_n": 0,
        "predicted_n": n,
        "predicted_ms": round(span * 1000, 3),
        "predicted_per_second": (n - 1) / span if n > 1 and span > 0 else 0.0,
    }


def serve_many(servers: list[Server]) -> None:
    """Serve each server on its port until SIGTERM/SIGINT; print READY once every one listens."""

    async def main() -> None:
        listening = []
        for server in servers:
            server.free = asyncio.Condition()
            listening.append(
                await asyncio.start_server(server.handle, "127.0.0.1", server.port, backlog=1024, limit=1 << 22)
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print("READY", flush=True)
        await stop.wait()
        for listener in listening:
            listener.close()

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, help="the first port")
    parser.add_argument("--ports", type=int, default=1, help="serve this many consecutive ports from --port")
    parser.add_argument("--ports-file", type=Path, help="serve the ports listed in this file, one a line")
    parser.add_argument("--slots", type=int, default=16, help="slots per port (requests beyond wait)")
    parser.add_argument("--busy-rate", type=float, default=0.0, help="one more slot per port always decoding at this")
    args = parser.parse_args()
    if args.ports_file:
        ports = [int(line) for line in args.ports_file.read_text().split()]
    elif args.port:
        ports = list(range(args.port, args.port + args.ports))
    else:
        parser.error("give --port or --ports-file")
    serve_many([Server(port=port, slots=args.slots, busy_rate=args.busy_rate) for port in ports])


if __name__ == "__main__":
    main()
