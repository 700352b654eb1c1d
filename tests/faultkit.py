"""Parts of the fault campaign (tests/test_fault_campaign.py): a PostgreSQL of the test's own that it may restart,
RigDash processes pointed at it, and a websocket client over the network that resyncs as the page does.

Never the machine's PostgreSQL (5432) or Redis (6379): other runs use them. A test that restarts one starts its own
on a free port, and runs the processes that need it (web, worker) against that one."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from rigdash.launcher import ROOT, Stack, free_port, wait_http, web_command


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or (
        [shutil.which(name)] if shutil.which(name) else []
    )
    if not found or found[-1] is None:
        pytest.skip(f"PostgreSQL's {name} is not installed")
    return str(found[-1])


class PrivatePostgres:
    """A PostgreSQL cluster in a temporary directory of its own on a free port (trust authentication, no fsync: a
    test's throwaway), run as the ``postgres`` user when this process is root (initdb refuses root). Not under
    pytest's temporary directory: other runs' pytest sessions (all root here) make /tmp/pytest-of-root private again
    and remove old sessions' directories while this cluster runs."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rigdash-pg-"))
        self.dir.chmod(0o711)
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/rigdash"

    def _run(self, *cmd: str, timeout: float = 120) -> str:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *cmd], capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
        return done.stdout

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._ctl("start")
        self._run(_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "rigdash")

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", action, *extra)

    def restart(self, *, down_s: float = 0.0) -> None:
        """Stop (fast: every connection is cut), stay down ``down_s``, and start again."""
        self._ctl("stop", "-m", "fast")
        time.sleep(down_s)
        self._ctl("start")

    def close(self) -> None:
        """Stop the cluster (its postmaster by its pid file if pg_ctl cannot) and remove its directory."""
        try:
            if (self.data / "postmaster.pid").exists():
                try:
                    self._ctl("stop", "-m", "immediate")
                except (RuntimeError, subprocess.TimeoutExpired):
                    pid = int((self.data / "postmaster.pid").read_text().split()[0])
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGQUIT)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def django_run(env: dict[str, str], code: str, timeout: float = 300) -> Any:
    """Run ``code`` in a Django process with ``env`` (another database than the test's); what it prints as JSON on
    its last line."""
    script = "import django, json, os\nos.environ['DJANGO_SETTINGS_MODULE'] = 'rigdash.settings'\ndjango.setup()\n"
    done = subprocess.run(
        [sys.executable, "-c", script + code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"django_run failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_web(stack: Stack, env: dict[str, str], log_path: Path) -> str:
    port = free_port()
    proc = stack.start("web", web_command(host="127.0.0.1", port=port), env=env, log_path=log_path)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/static/rigdash/app.css", timeout_s=60, proc=proc)
    return url


class RawChatClient:
    """A chat socket on a plain TCP connection whose reading this test controls byte by byte (websockets' sans-I/O
    protocol parses the frames): a client on a slow link, or one that never reads. Blocking calls: run them in a
    thread."""

    def __init__(self, web_url: str, session_id: int, cookie: str) -> None:
        from websockets.client import ClientProtocol
        from websockets.typing import Origin
        from websockets.uri import parse_uri

        self.sock = socket.create_connection(("127.0.0.1", int(web_url.rsplit(":", 1)[1])), timeout=15)
        uri = parse_uri(f"{web_url.replace('http://', 'ws://', 1)}/ws/chat/{session_id}/")
        self.protocol = ClientProtocol(uri, origin=Origin(web_url), max_size=None)
        request = self.protocol.connect()
        request.headers["Cookie"] = f"sessionid={cookie}"
        self.protocol.send_request(request)
        self._flush()
        self.frames: list[dict[str, Any]] = []
        self.read_bytes = 0
        while self.protocol.state.name == "CONNECTING":
            self._feed(self.sock.recv(4096))

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the server has gone: EOF next
                    self.sock.sendall(data)

    def _feed(self, data: bytes) -> None:
        self.read_bytes += len(data)
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        for event in self.protocol.events_received():
            if getattr(event, "opcode", None) is not None and event.opcode.name == "TEXT":
                self.frames.append(json.loads(event.data))
        self._flush()  # pongs, the answer to a close

    def send(self, frame: dict[str, Any]) -> None:
        self.protocol.send_text(json.dumps(frame).encode())
        self._flush()

    @property
    def closed(self) -> bool:
        return self.protocol.state.name == "CLOSED" or self.protocol.close_code is not None

    def read_slowly(self, *, bytes_per_s: float, until: Any, timeout_s: float) -> None:
        """Read at most ``bytes_per_s`` until ``until()`` is true, the socket closes or the time is up."""
        deadline = time.monotonic() + timeout_s
        chunk = max(1, int(bytes_per_s / 10))
        while not self.closed and not until() and time.monotonic() < deadline:
            self.sock.settimeout(0.1)
            with contextlib.suppress(TimeoutError):
                self._feed(self.sock.recv(chunk))
            time.sleep(0.1)

    def drain(self, timeout_s: float = 30) -> int | None:
        """Read everything that is left, as fast as it comes, until the socket closes; its close code."""
        deadline = time.monotonic() + timeout_s
        self.sock.settimeout(1.0)
        while not self.closed and time.monotonic() < deadline:
            try:
                self._feed(self.sock.recv(262144))
            except TimeoutError:
                continue
            except ConnectionResetError:
                self._feed(b"")
        return self.protocol.close_code

    def close(self) -> None:
        self.sock.close()


async def open_chat(web_url: str, session_id: int, cookie: str) -> ClientConnection:
    """A chat socket over the network, from RigDash's own origin, as the page opens it."""
    return await connect(
        f"{web_url.replace('http://', 'ws://', 1)}/ws/chat/{session_id}/",
        origin=web_url,  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={cookie}"},
        max_size=None,
        open_timeout=15,
    )


class PageView:
    """What a page keeps of one turn under docs/streaming.md's contract: a token frame that continues the text is
    appended, one already held is dropped, a gap asks for ``turn.resync`` and waits for its snapshot; ``turn.end``
    replaces everything. ``doubled`` counts frames that would have repeated text (must stay 0)."""

    def __init__(self, turn_id: int) -> None:
        self.turn_id, self.text, self.seq = turn_id, "", 0
        self.status = ""
        self.gaps = self.doubled = 0
        self.resyncing = False
        self.end: dict[str, Any] | None = None

    def take_snapshot(self, turn: dict[str, Any]) -> None:
        self.text, self.seq, self.status = turn["reply"], int(turn.get("seq") or 0), turn["status"]
        self.resyncing = False

    async def feed(self, ws: ClientConnection, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "session.snapshot":
            for turn in frame["turns"]:
                if turn["id"] == self.turn_id:
                    self.take_snapshot(turn)
        elif kind == "turn.snapshot" and frame["turn"]["id"] == self.turn_id:
            self.take_snapshot(frame["turn"])
        elif kind == "token" and frame["turn"] == self.turn_id and not self.resyncing:
            if frame["seq_to"] <= self.seq:
                return
            if frame["seq_from"] != self.seq + 1:
                self.gaps += 1
                self.resyncing = True
                await ws.send(json.dumps({"type": "turn.resync", "turn": self.turn_id}))
                return
            self.text += frame["text"]
            self.seq = frame["seq_to"]
        elif kind == "turn.end" and frame["turn"]["id"] == self.turn_id:
            self.end = frame
            self.take_snapshot(frame["turn"])


async def follow(ws: ClientConnection, view: PageView, *, timeout_s: float) -> PageView:
    """Read ``ws`` into ``view`` until the turn's end (or the time is up: AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while view.end is None:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"turn {view.turn_id} did not end within {timeout_s} s (seq {view.seq})"
        frame = json.loads(await asyncio.wait_for(ws.recv(decode=True), timeout=remaining))
        await view.feed(ws, frame)
    return view
