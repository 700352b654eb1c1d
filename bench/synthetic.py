"""A synthetic stream source speaking llama-server's chat SSE format at a fixed token rate (the stress level).

``POST /v1/chat/completions`` streams ``data: {choices[0].delta.content, timings}`` events, then one with a
finish reason and its timings, then ``data: [DONE]``, chunked, like llama-server. The rate, length and
time to first token come from a directive in the last user message, ``[synthetic rate=100 tokens=300
ttft=20]``, capped by ``max_tokens``. Tokens are emitted on a fixed schedule; when the process falls behind
it does not burst to catch up, so a starved source shows a lower rate of its own (its ``timings``:
``predicted_per_second`` = (n - 1) / (t_last - t_first) at emission). ``GET /_synthetic/streams`` returns
each stream's emission times and forgets them.

Run: ``python -m bench.synthetic --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from typing import Any

from bench.httpserve import SSE_HEAD, json_response, read_request, serve_forever
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
STREAMS: list[dict[str, Any]] = []


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


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await read_request(reader)
        if request is None:
            return
        if request.target.startswith("/_synthetic/streams"):
            streams = list(STREAMS)
            STREAMS.clear()
            writer.write(json_response(200, streams))
        elif request.target.startswith("/health"):
            writer.write(json_response(200, {"status": "ok"}))
        elif request.target.startswith("/v1/models"):
            writer.write(json_response(200, {"object": "list", "data": [{"id": "synthetic", "meta": {}}]}))
        elif request.method == "POST" and request.target.startswith("/v1/chat/completions"):
            await stream(request.json() or {}, writer)
        else:
            writer.write(json_response(404, {"error": {"code": "not_found", "message": request.target}}))
        await writer.drain()
    except (OSError, ProtocolError, TimeoutError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def stream(body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    t_request = time.time()
    messages = body.get("messages") or [{}]
    directive = parse_directive(str(messages[-1].get("content", "")))
    n = min(directive["tokens"], int(body.get("max_tokens") or directive["tokens"]))
    interval = 1.0 / directive["rate"]
    record: dict[str, Any] = {"t_request": t_request, "request": body, "events": [], "finish_reason": None}
    STREAMS.append(record)
    writer.write(SSE_HEAD + encode_chunk(chat_event_line(text=None)))
    await writer.drain()
    loop = asyncio.get_running_loop()
    due = loop.time() + directive["ttft"] / 1000
    first = last = 0.0
    for i in range(n):
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            due = loop.time()  # behind schedule: go on from now, never burst to catch up
        now = time.time()
        first = first or now
        last = now
        text = synthetic_token(i)
        timings = _timings(i + 1, first, last, t_request)
        writer.write(encode_chunk(chat_event_line(text=text, timings=timings)))
        record["events"].append([now, text])
        await writer.drain()
        due += interval
    record["finish_reason"] = "length"
    record["timings"] = _timings(n, first, last, t_request)
    writer.write(encode_chunk(chat_event_line(text=None, finish_reason="length", timings=record["timings"])))
    writer.write(encode_chunk(DONE_LINE) + LAST_CHUNK)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    serve_forever(handle, parser.parse_args().port)


if __name__ == "__main__":
    main()
