"""Many passive websocket clients in their own process: tabs watching chat sessions, and idle sockets.

The benchmark starts this with a JSON config, waits for ``READY``, runs its turns, then writes ``stop`` to
stdin; the swarm closes its sockets and prints one ``RESULT {json}`` line: per turn, how many clients got
it, whether every one got every seq once and in order, and the hashes of the texts they assembled.

Config: {"port": P, "cookie": "sessionid=..", "groups": [{"session": id, "count": n}], "deadline_s": s}.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.wsproto import WSClient, WSClosed


@dataclass
class TurnSeen:
    last_seq: int = 0
    gaps: int = 0
    duplicates: int = 0
    parts: list[str] = field(default_factory=list)
    t_first: float | None = None
    t_last: float | None = None
    ended: bool = False
    end_reply_sha1: str | None = None


@dataclass
class Viewer:
    path: str
    turns: dict[int, TurnSeen] = field(default_factory=dict)
    frames: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    error: str | None = None


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 - a content fingerprint


async def watch(client: WSClient, viewer: Viewer) -> None:
    try:
        while True:
            arrived, frame = await client.recv_json()
            viewer.frames += 1
            kind = str(frame.get("type"))
            viewer.kinds[kind] = viewer.kinds.get(kind, 0) + 1
            if kind == "token":
                seen = viewer.turns.setdefault(frame["turn"], TurnSeen())
                if frame["seq_to"] <= seen.last_seq:
                    seen.duplicates += 1
                    continue
                if frame["seq_from"] != seen.last_seq + 1:
                    seen.gaps += 1
                seen.parts.append(frame["text"])
                seen.last_seq = frame["seq_to"]
                seen.t_first = seen.t_first or arrived
                seen.t_last = arrived
            elif kind == "turn.end":
                seen = viewer.turns.setdefault(frame["turn"]["id"], TurnSeen())
                seen.ended = True
                seen.end_reply_sha1 = sha1(frame["turn"].get("reply") or "")
            elif kind == "error":
                viewer.error = f"{frame.get('code')}: {frame.get('message')}"
    except (WSClosed, OSError, asyncio.IncompleteReadError) as exc:
        viewer.error = viewer.error or repr(exc)


def summarize(viewers: list[Viewer]) -> dict[str, Any]:
    turns: dict[int, dict[str, Any]] = {}
    for viewer in viewers:
        for turn_id, seen in viewer.turns.items():
            entry = turns.setdefault(
                turn_id,
                {"clients": 0, "ended": 0, "gaps": 0, "duplicates": 0, "text_sha1": [], "last_seq": [], "rates": []},
            )
            text = "".join(seen.parts)
            entry["clients"] += 1
            entry["ended"] += int(seen.ended)
            entry["gaps"] += seen.gaps
            entry["duplicates"] += seen.duplicates
            entry["text_sha1"].append(sha1(text))
            entry["last_seq"].append(seen.last_seq)
            if seen.t_first and seen.t_last and seen.t_last > seen.t_first and seen.last_seq > 1:
                entry["rates"].append((seen.last_seq - 1) / (seen.t_last - seen.t_first))
    kinds = {kind for viewer in viewers for kind in viewer.kinds}
    for entry in turns.values():
        entry["text_sha1"] = sorted(set(entry["text_sha1"]))
        entry["last_seq"] = sorted(set(entry["last_seq"]))
    return {
        "clients": len(viewers),
        "errors": sorted({v.error for v in viewers if v.error and "closed (1000)" not in v.error})[:10],
        "frames": sum(v.frames for v in viewers),
        "frames_by_type": {kind: sum(v.kinds.get(kind, 0) for v in viewers) for kind in sorted(kinds)},
        "turns": {str(k): v for k, v in turns.items()},
    }


async def main(config: dict[str, Any]) -> None:
    port, cookie = config["port"], config["cookie"]
    deadline = time.monotonic() + float(config.get("deadline_s", 1800))
    gate = asyncio.Semaphore(int(config.get("concurrency", 16)))
    viewers: list[Viewer] = []
    clients: list[WSClient] = []
    tasks: list[asyncio.Task[None]] = []
    failed = 0

    async def open_one(group: dict[str, Any]) -> None:
        """A chat page socket (``session``: it starts with a session.snapshot) or any other path (``path``)."""
        nonlocal failed
        path = group.get("path") or f"/ws/chat/{group['session']}/"
        async with gate:
            try:
                client = await WSClient.connect(port, path, cookie=cookie, timeout_s=30)
                if "session" in group:
                    await client.recv_json(timeout_s=30)  # session.snapshot
            except (WSClosed, OSError, TimeoutError) as exc:
                failed += 1
                print(f"connect failed: {exc!r}", file=sys.stderr, flush=True)
                return
        viewer = Viewer(path=path)
        viewers.append(viewer)
        clients.append(client)
        tasks.append(asyncio.create_task(watch(client, viewer)))

    await asyncio.gather(*(open_one(g) for g in config["groups"] for _ in range(int(g["count"]))))
    print(f"READY ok={len(clients)} failed={failed}", flush=True)
    while time.monotonic() < deadline:
        try:
            line = await asyncio.wait_for(asyncio.to_thread(sys.stdin.readline), max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            break
        if not line or line.strip() == "stop":
            break
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    result = summarize(viewers)
    result["connect_failed"] = failed
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
