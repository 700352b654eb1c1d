"""Servers the API tests start beside the stack's: llama-server on a tiny GGUF written for the test
(tests/tiny_gguf.py), and an OpenAI-compatible stand-in (vLLM cannot run here) that lists one model and answers
``/v1/rerank`` as vLLM's does (serving/score ``RerankResponse``: results with the document, usage with total_tokens
only), scoring each document by its length; anything else it refuses with 404."""

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


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet stand-in server's handler that answers JSON (``_send``)."""

    def log_message(self, *args: Any) -> None:
        return None

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _VLLMLike(JsonHandler):
    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": "vllm-model", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/rerank":
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "NotFoundError", "code": 404}})
            return
        self._send(200, vllm_rerank(body))


def vllm_rerank(body: dict[str, Any]) -> dict[str, Any]:
    """The stand-in's answer to a rerank ``body``: what a test compares RigDash's with."""
    documents = body["documents"]
    scored = sorted(((len(text) / 100, index) for index, text in enumerate(documents)), reverse=True)
    results = [{"index": index, "document": {"text": documents[index]}, "relevance_score": score}
               for score, index in scored[: body.get("top_n") or len(documents)]]  # fmt: skip
    tokens = sum(len(text.split()) + len(body["query"].split()) for text in documents)
    return {"id": "rerank-1", "model": body["model"], "usage": {"total_tokens": tokens}, "results": results}


@contextlib.contextmanager
def served_rig(handler: type[BaseHTTPRequestHandler], name: str, queue: str) -> Iterator[Rig]:
    """An OpenAI-compatible rig whose server is ``handler`` on a free port, for as long as the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Rig.objects.create(name=name, kind=Rig.Kind.OPENAI, base_url=f"http://127.0.0.1:{server.server_address[1]}",
                                 queue=queue)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()


def vllm_like_rig(name: str, queue: str) -> contextlib.AbstractContextManager[Rig]:
    """An OpenAI-compatible rig (vLLM's kind) whose server lists one model, ``vllm-model``, and reranks."""
    return served_rig(_VLLMLike, name, queue)
