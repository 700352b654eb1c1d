"""Servers the API tests start beside the stack's: llama-server on a tiny GGUF written for the test
(tests/tiny_gguf.py), and an OpenAI-compatible stand-in that only lists a model (a rig kind RigDash refuses a request
before asking it anything)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from inference.models import Rig
from rigdash.launcher import Stack, free_port, llama_server_command, wait_http
from tests.conftest import LOG_DIR


def tiny_llama_server(stack: Stack, model: Path, alias: str, *, ctx: int, extra: tuple[str, ...] = ()) -> str:
    """llama-server as RigDash launches it (one slot of ``ctx``), on ``model``, named ``alias``: its URL once it
    answers."""
    before = os.environ.get("LLAMA_MODEL_PATH")
    os.environ["LLAMA_MODEL_PATH"] = str(model)  # llama_server_command reads it
    try:
        port = free_port()
        command = llama_server_command(port=port, slots=1, ctx=ctx, extra=list(extra))
    finally:
        if before is None:
            os.environ.pop("LLAMA_MODEL_PATH")
        else:
            os.environ["LLAMA_MODEL_PATH"] = before
    command[command.index("--alias") + 1] = alias
    proc = stack.start(f"llama-server-{alias}", command, log_path=LOG_DIR / f"llama-server-{alias}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout_s=120, proc=proc)
    return url


class _ModelsOnly(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        data = json.dumps({"object": "list", "data": [{"id": "vllm-model", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def models_only_rig(name: str, queue: str) -> Iterator[Rig]:
    """An OpenAI-compatible rig (vLLM's kind) whose server lists one model, ``vllm-model``, and answers nothing else."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Rig.objects.create(name=name, kind=Rig.Kind.OPENAI, base_url=f"http://127.0.0.1:{server.server_address[1]}",
                                 queue=queue)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
