"""A protocol replay of Ollama's REST API for tests: a small local HTTP server, not Ollama.

No Ollama binary can run on the test machines, so the tests drive RigDash's Ollama plug-in against
this server, which speaks the wire format of Ollama's **v0.32** server series (read against ollama/ollama's source
at v0.33.0-rc2: ``api/types.go``, ``server/routes.go``, ``server/sched.go``, ``docs/api.md``):

- ``POST /api/chat``: HTTP/1.1 chunked NDJSON, ``{model, created_at, message{role, content}, done:false}``
  per token, then one ``done:true`` line with ``done_reason`` (stop | length) and ``total_duration,
  load_duration, prompt_eval_count, prompt_eval_duration, eval_count, eval_duration`` (nanoseconds), each left out
  when zero (``omitempty`` in api.Metrics). A reasoning model (``ReplayModel.thinks``) first streams lines with
  ``message.thinking`` and empty content, unless the request says ``think: false``; ``think`` on a model
  without the capability: 400 ``"x" does not support thinking``. Empty ``messages`` with ``keep_alive`` 0 unloads
  the model (``done_reason: "unload"``), once no reply of that model is running (the scheduler waits for them).
  Unknown model: 404 ``{"error": "model 'x' not found"}``. A model not loaded is loaded first: a real wait of
  ``load_s``, reported as ``load_duration``.
- ``POST /api/generate`` with no prompt: load, or unload with ``keep_alive`` 0. With a prompt: the chat's stream with
  each line's text in ``response``, ``context`` (token ids) on the ``done:true`` line unless ``raw``; refused as
  GenerateHandler refuses: ``raw`` with a template, system or context, ``think`` on a model without thinking, a model
  without "completion" (``does not support generate``), a ``suffix`` for a model without "insert" (``does not
  support insert``).
- ``GET /api/tags``, ``GET|HEAD /api/version``, ``GET|HEAD /`` (``Ollama is running``), ``POST /api/show``
  (``model_info`` with GGUF keys, lists longer than 5 items blanked to ``[]`` unless ``verbose``, and
  ``capabilities``: "completion" or "embedding", and "thinking"), ``GET /api/ps`` (``size, size_vram, expires_at,
  context_length``). ``size`` is what Ollama reports (llm/llama_server.go ``MemorySize``, the buffers llama-server
  logged at load): the model file + the KV cache for ``-c num_ctx*parallel -np parallel`` (each sequence's cells
  padded to 256, f16) + ``graph_bytes`` of compute buffers; ``parallel`` is ``num_parallel`` (OLLAMA_NUM_PARALLEL,
  default 1), forced to 1 for an embedding model and the families server/sched.go ``load`` lists.
- Context overflow: with ``context_shift`` off (or the request's ``shift: false``), a prompt that does not fit the
  loaded context even after chatPrompt dropped the oldest messages is refused with 400 "the prompt is longer than
  the context length currently available to the model; ..." before the stream (llm/llama_server.go
  ``completionPromptForRequest``).
- A load longer than a worker's first-token timeout: ``load_s`` (a real wait, before the 200 head, as Ollama
  schedules the runner before it answers); ``/api/ps`` meanwhile lists the model only once loaded.
  ``prompt_delay_s``: nothing sent for that long after the load (a loaded model that is slow to start).
- ``POST /api/pull``: ``{"status": "pulling manifest"}``, per-layer ``{status, digest, total, completed}``
  lines, ``verifying sha256 digest``, ``writing manifest``, ``success``. A name the registry lacks:
  HTTP 200 with ``pulling manifest`` then ``{"error": "pull model manifest: file does not exist"}``
  (the error arrives after the stream began, as in Ollama's PullHandler/streamResponse).
- ``DELETE /api/delete``: 200 with an empty body, or 404 ``model 'x' not found``. Ollama deletes a model
  that is loaded without complaint (the runner keeps it in memory until it expires), and so does this.
- Routing as gin with ``HandleMethodNotAllowed``: an unknown path is 404 ``404 page not found`` and a known path
  with another method 405 ``405 method not allowed``, both text/plain.

Fault modes: ``refuse_connections()`` (nothing listens on the port), ``cut_after_tokens`` (the chat
stream is closed mid-reply without its terminating chunk), ``omit_done_line`` (the stream ends cleanly
but without ``done:true``), ``fail_status`` / ``fail_message`` (every API call answers that status and error),
``error_after_tokens`` / ``stream_error`` (an ``{"error"}`` line ends a chat stream that began with 200, as
streamResponse sends a runner's failure), ``raw_line_after_tokens`` / ``raw_line`` (bytes sent as one line mid-reply,
such as a line that is not UTF-8). ``closed_early`` records each chat stream the client closed before its
end.

Differences from the real server (what the tests cannot rely on here):
- ``/api/ps`` answers at once while a model loads, without it; real Ollama's waits for the loading runner's lock
  (server/sched.go ``loadedModels``) and then lists it. RigDash treats both as "loading".
- ``size_vram`` is always 0; the KV is f16 and every layer full attention (no OLLAMA_KV_CACHE_TYPE, no sliding
  window); the compute buffers are a fixed ``graph_bytes``, not llama-server's for the batch; the batch itself is
  in no API and not replayed (RigDash's rule for it is tested alone).
- ``done_reason: "load"`` and the 5-minute OLLAMA_LOAD_TIMEOUT stall are not replayed; a load never fails unless
  told to (``fail_message``).
- ``think`` levels are taken as thinking on (ThinkValue.Bool); no model reads the level (gpt-oss's harmony parser,
  ``"max"`` read as ``"high"``, are not replayed). A model's ``think: false`` stops its thoughts.
- Errors inside a stream are the words only, as Ollama's streamResponse sends them once the head is out.
- Replies are fixed words, not a model's; a token is one word, one line; the prompt's count is a word count (+ 4 a
  message), cut to the loaded context as Ollama cuts a chat's history, silently (``chat_prompt_tokens``).
- No memory or GPU: ``size_vram`` is 0, loading never fails for memory unless told to (``fail_message``), and the
  context a model loads with is the request's ``num_ctx`` or 4096 (the real default depends on VRAM: 4k, 32k or
  256k tokens, or OLLAMA_CONTEXT_LENGTH), capped at the model's trained length as Ollama caps it.
- Requests run on their own threads, with no queue: OLLAMA_NUM_PARALLEL sizes ``/api/ps`` only, it limits nothing,
  and OLLAMA_MAX_QUEUE is not modelled (no 503 ``server busy`` unless ``fail_status`` says so); ``keep_alive`` is
  honoured only by ``/api/ps``.
- ``/api/show`` has no ``tensors``, ``projector_info`` or ``template`` worth reading; ``/api/pull`` has no
  registry, digests are made up, and no ``removing unused layers`` step.
- ``/api/embed``, ``/api/create``, ``/api/copy``, ``/api/push``, tools,
  images, ``format`` and the OpenAI-compatible ``/v1`` routes are not replayed (404).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

API_VERSION = "0.32.0"  # the version /api/version reports: the server series whose API this replays
WORDS = [
    "the",
    "keeper",
    "climbed",
    "the",
    "stairs",
    "and",
    "lit",
    "the",
    "lamp",
    "while",
    "waves",
    "broke",
    "on",
    "the",
    "rocks",
    "below",
]


@dataclass
class ReplayModel:
    """A model the replay "has": its listing, its GGUF metadata and its layers (for pulls)."""

    name: str
    size: int = 105_000_000
    family: str = "llama"
    parameter_size: str = "135M"
    quantization: str = "Q4_1"
    model_info: dict[str, Any] = field(default_factory=dict)
    layers: tuple[int, ...] = (100_000_000, 5_000_000)
    thinks: bool = False  # a reasoning model: capability "thinking", thinks unless asked not to
    graph_bytes: int = 16 * 2**20  # compute buffers llama-server allocates at load (SmolLM2: 16 MiB on the CPU)
    embedding: bool = False  # an embedding model: no "completion" capability, one sequence
    inserts: bool = False  # its template fills in the middle: capability "insert" (a generate request's suffix)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.name.encode()).hexdigest()

    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization,
        }


def smollm2(name: str = "smollm2:135m") -> ReplayModel:
    """SmolLM2-135M's real GGUF figures (the model llama-server runs in these tests)."""
    return ReplayModel(
        name=name,
        model_info={
            "general.architecture": "llama",
            "general.parameter_count": 134_515_008,
            "llama.block_count": 30,
            "llama.attention.head_count": 9,
            "llama.attention.head_count_kv": 3,
            "llama.embedding_length": 576,
            "llama.context_length": 8192,
            "llama.feed_forward_length": 1536,
            "llama.rope.dimension_count": 64,
            "llama.vocab_size": 49152,
        },
    )


def reasoner(name: str = "qwen3:0.6b") -> ReplayModel:
    """A reasoning model (SmolLM2's figures under another name, with the "thinking" capability)."""
    model = smollm2(name)
    model.family, model.thinks = "qwen3", True
    return model


def single_sequence(name: str = "qwen3-vl:2b", family: str = "qwen3vl") -> ReplayModel:
    """A model of a family Ollama always runs with one sequence (server/sched.go load)."""
    model = smollm2(name)
    model.family = family
    return model


# server/sched.go load(): families forced to one sequence, written out again here rather than imported from RigDash.
SINGLE_SEQUENCE = {"mllama", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3next", "lfm2", "lfm2moe",
                   "nemotron_h", "nemotron_h_moe", "nemotron_h_omni"}  # fmt: skip


def kv_cache_bytes(model: ReplayModel, context: int, parallel: int) -> int:
    """llama-server's KV buffer for ``-c context*parallel -np parallel`` (f16, every layer full attention): each
    sequence's cells padded to 256 (llama.cpp's llama_kv_cache), x 2 (K and V) x layers x KV heads x head dim x 2."""
    info = model.model_info
    arch = info.get("general.architecture", "llama")
    layers, kv_heads = int(info[f"{arch}.block_count"]), int(info[f"{arch}.attention.head_count_kv"])
    head_dim = int(
        info.get(f"{arch}.attention.key_length")
        or info[f"{arch}.embedding_length"] // info[f"{arch}.attention.head_count"]
    )
    pad = lambda n: -(-n // 256) * 256  # noqa: E731
    cells = pad(pad(context * parallel) // parallel) * parallel
    return cells * 2 * layers * kv_heads * head_dim * 2


def full_name(name: str) -> str:
    """Ollama's default tag: ``smollm2`` means ``smollm2:latest``."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _blank_long_lists(info: dict[str, Any]) -> dict[str, Any]:
    return {key: [] if isinstance(value, list) and len(value) > 5 else value for key, value in info.items()}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


NUM_KEEP = 4  # api.DefaultOptions NumKeep
OVERFLOW_WORDS = (
    "the prompt is longer than the context length currently available to the model; shorten the prompt, adjust the"
    " context length in settings, or use a model with a longer context length"
)


def chat_prompt_tokens(
    messages: list[dict[str, Any]], num_ctx: int, *, truncate: bool = True, shift: bool = True
) -> int:
    """The prompt's size as Ollama reads it (its prompt_eval_count), cut as server/prompt.go ``chatPrompt`` cuts it:
    drop messages from the front, keeping the system messages among them, until the rest fits ``num_ctx``; the
    last message always stays. If it alone is over, llama-server's context shift keeps ``num_keep`` and about half
    of the rest (llm/llama_server.go ``contextShiftPromptLimit``). A message is its word count + 4 tokens here."""
    sizes = [len(str(m.get("content", "")).split()) + 4 for m in messages]
    total = sum(sizes)
    if not truncate:
        return total
    for start in range(len(messages)):
        kept_system = sum(size for size, m in zip(sizes[:start], messages, strict=False) if m.get("role") == "system")
        total = kept_system + sum(sizes[start:])
        if total <= num_ctx:
            return total
    if not shift:  # no context shift: the shortest history chatPrompt keeps, whole (the runner then refuses it)
        return total
    keep = min(NUM_KEEP + 1, num_ctx - 1)  # num_keep and the BOS token
    return min(total, num_ctx - max((num_ctx - keep) // 2, 1))


@dataclass
class Loaded:
    model: ReplayModel
    expires_at: datetime
    context_length: int
    parallel: int = 1

    @property
    def size(self) -> int:
        """/api/ps ``size``: model + KV + compute buffers as llama-server logged them (llm/llama_server.go
        MemorySize); the model buffer is the file's size here."""
        return self.model.size + kv_cache_bytes(self.model, self.context_length, self.parallel) + self.model.graph_bytes


class OllamaReplay:
    """The replay server's state and controls; ``start()`` serves it on 127.0.0.1 in a thread."""

    def __init__(
        self,
        models: list[ReplayModel] | None = None,
        registry: list[ReplayModel] | None = None,
        *,
        reply_tokens: int = 12,
        thinking_tokens: int = 6,
        token_interval_s: float = 0.002,
        pull_step_s: float = 0.02,
        load_s: float = 0.02,
        num_parallel: int = 1,
    ) -> None:
        self.models: dict[str, ReplayModel] = {m.name: m for m in (models if models is not None else [smollm2()])}
        self.registry: dict[str, ReplayModel] = {m.name: m for m in (registry or [])}
        self.loaded: dict[str, Loaded] = {}
        self.reply_tokens = reply_tokens
        self.thinking_tokens = thinking_tokens  # a thinking model's thoughts before its answer, in tokens
        self.token_interval_s = token_interval_s
        self.pull_step_s = pull_step_s
        self.load_s = load_s  # how long loading a model that is not loaded takes (a real wait)
        self.num_parallel = num_parallel  # OLLAMA_NUM_PARALLEL (envconfig/config.go: default 1)
        self.prompt_delay_s = 0.002  # "prompt processing": nothing is sent meanwhile
        # The runner's context shift (on unless the request's ``shift`` is false): off, a prompt longer than the
        # context is refused with 400 (llm/llama_server.go completionPromptForRequest) instead of cut.
        self.context_shift = True
        self.running: dict[str, int] = {}  # replies streaming now, per model (an unload waits for them)
        self.cut_after_tokens: int | None = None
        self.omit_done_line = False
        self.fail_status: int | None = None
        self.fail_message = "server busy, please try again.  maximum pending requests exceeded"
        # After this many lines of a chat stream, an {"error"} line ends it (HTTP 200 already sent), as Ollama's
        # streamResponse does when the runner fails mid-reply.
        self.error_after_tokens: int | None = None
        self.stream_error = "model runner has unexpectedly stopped, this may be due to resource limitations"
        # After this many reply lines, ``raw_line`` is sent as one more line, as is (not Ollama's: a hostile or
        # broken server), and the stream goes on as before.
        self.raw_line_after_tokens: int | None = None
        self.raw_line = b""
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.closed_early: list[dict[str, Any]] = []  # {"path", "tokens_sent"} per stream the client left
        self.streams_open = 0
        self.lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # Lifecycle and fault controls
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OllamaReplay:
        replay = self

        class Handler(ReplayHandler):
            state = replay

        self._httpd = QuietServer(("127.0.0.1", self.port), Handler)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ollama-replay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def refuse_connections(self) -> None:
        """Close the listening socket: connecting now fails with ECONNREFUSED. ``start()`` reopens the port."""
        self.stop()

    def last_request(self, path: str) -> dict[str, Any]:
        return next(body for method, p, body in reversed(self.requests) if p == path)

    def wait_closed_early(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if self.closed_early:
                    return self.closed_early[-1]
            time.sleep(0.01)
        return None


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that drops a kept-alive connection is normal here, not an error worth a traceback."""


class ReplayHandler(BaseHTTPRequestHandler):
    state: OllamaReplay
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as Go's net/http serves them
    server_version = "OllamaReplay"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # Plumbing
    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        return body if isinstance(body, dict) else {"__invalid__": True}

    def _json(self, status: int, payload: Any | None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _line(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _cut(self) -> None:
        """Drop the connection mid-body: no terminating chunk, as when the server process dies."""
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _dispatch(self, method: str) -> None:
        state = self.state
        body = self._body() if method in ("POST", "DELETE") else {}
        with state.lock:
            state.requests.append((method, self.path, body))
        if state.fail_status:
            self._error(state.fail_status, state.fail_message)
            return
        routes = {
            ("GET", "/"): self.running_text,
            ("GET", "/api/version"): self.version,
            ("GET", "/api/tags"): self.tags,
            ("GET", "/api/ps"): self.ps,
            ("POST", "/api/show"): self.show,
            ("POST", "/api/chat"): self.chat,
            ("POST", "/api/generate"): self.generate,
            ("POST", "/api/pull"): self.pull,
            ("DELETE", "/api/delete"): self.delete,
        }
        route = routes.get((method, self.path))
        if route is None:  # gin: 404 for an unknown path, 405 for a known one (HandleMethodNotAllowed)
            known = any(path == self.path for _, path in routes)
            self._text(405, "405 method not allowed") if known else self._text(404, "404 page not found")
            return
        if body.get("__invalid__"):
            self._error(400, "invalid character looking for beginning of value")
            return
        route(body)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_HEAD(self) -> None:
        if self.path in ("/", "/api/version"):
            self._text(200, "") if self.path == "/" else self._json(200, {"version": API_VERSION})
        else:
            self._text(404, "404 page not found")

    def _text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def running_text(self, body: dict[str, Any]) -> None:
        self._text(200, "Ollama is running")

    # Endpoints
    def version(self, body: dict[str, Any]) -> None:
        self._json(200, {"version": API_VERSION})

    def tags(self, body: dict[str, Any]) -> None:
        models = [
            {
                "name": m.name,
                "model": m.name,
                "modified_at": _now(),
                "size": m.size,
                "digest": m.digest,
                "details": m.details(),
            }
            for m in self.state.models.values()
        ]
        self._json(200, {"models": models})

    def ps(self, body: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        with self.state.lock:
            for name in [n for n, entry in self.state.loaded.items() if entry.expires_at <= now]:
                del self.state.loaded[name]
            models = [
                {
                    "name": entry.model.name,
                    "model": entry.model.name,
                    "size": entry.size,
                    "digest": entry.model.digest,
                    "details": entry.model.details(),
                    "expires_at": entry.expires_at.isoformat().replace("+00:00", "Z"),
                    "size_vram": 0,  # a CPU-only server, like this machine
                    "context_length": entry.context_length,
                }
                for entry in self.state.loaded.values()
            ]
        self._json(200, {"models": models})

    def _model(self, body: dict[str, Any]) -> ReplayModel | None:
        name = body.get("model") or body.get("name") or ""
        if not name:
            self._error(400, "model is required")
            return None
        model = self.state.models.get(full_name(str(name)))
        if model is None:
            self._error(404, f"model '{name}' not found")
        return model

    def show(self, body: dict[str, Any]) -> None:
        model = self._model(body)
        if model is not None:
            self._json(
                200,
                {
                    "license": "Apache-2.0",
                    "modelfile": f"FROM {model.name}",
                    "parameters": "",
                    "template": "{{ .Prompt }}",
                    "details": model.details(),
                    # Lists longer than 5 items come back empty unless verbose (server/routes.go getModelData).
                    "model_info": model.model_info if body.get("verbose") else _blank_long_lists(model.model_info),
                    "capabilities": (["embedding"] if model.embedding else ["completion"])
                    + (["thinking"] if model.thinks else [])
                    + (["insert"] if model.inserts else []),
                    "modified_at": _now(),
                },
            )

    def _keep_alive_s(self, body: dict[str, Any]) -> float:
        value = body.get("keep_alive", "5m")
        if isinstance(value, int | float):
            return float(value)
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
        for suffix in ("ms", "s", "m", "h"):
            if str(value).endswith(suffix):
                return float(str(value)[: -len(suffix)]) * units[suffix]
        return float(value)

    def _load(self, model: ReplayModel, body: dict[str, Any]) -> int:
        """Load the model if it is not (a real wait of ``load_s``), or unload it once no reply of it runs; mark it
        loaded until keep_alive runs out. Returns load_duration in ns."""
        started = time.perf_counter_ns()
        keep_alive_s = self._keep_alive_s(body)
        context = int((body.get("options") or {}).get("num_ctx") or 4096)
        arch = model.model_info.get("general.architecture")
        trained = model.model_info.get(f"{arch}.context_length")
        if trained and context > trained:  # llm/server.go NewLlamaServer: num_ctx no more than the trained length
            context = int(trained)
        if keep_alive_s == 0:
            deadline = time.monotonic() + 60
            while self.state.running.get(model.name) and time.monotonic() < deadline:
                time.sleep(0.01)  # the scheduler unloads a runner once its replies are done
        with self.state.lock:
            loaded = self.state.loaded.get(model.name)
            reload = loaded is None or (loaded.context_length != context and keep_alive_s != 0)
        if reload and keep_alive_s != 0:
            time.sleep(self.state.load_s)
        with self.state.lock:
            if keep_alive_s == 0:
                self.state.loaded.pop(model.name, None)
            else:
                expires = datetime.now(UTC) + timedelta(seconds=keep_alive_s if keep_alive_s > 0 else 3650 * 86400)
                parallel = self.state.num_parallel  # server/sched.go load(): 1 for embeddings and some families
                if model.embedding or model.family in SINGLE_SEQUENCE:
                    parallel = 1
                self.state.loaded[model.name] = Loaded(model, expires, context, max(parallel, 1))
        return time.perf_counter_ns() - started

    def _load_or_unload(self, model: ReplayModel, body: dict[str, Any], reply: dict[str, Any]) -> None:
        self._load(model, body)
        reason = "unload" if self._keep_alive_s(body) == 0 else "load"
        self._json(200, {"model": model.name, "created_at": _now(), **reply, "done": True, "done_reason": reason})

    def generate(self, body: dict[str, Any]) -> None:
        """server/routes.go GenerateHandler: its refusals in its order, then the load (no prompt: load or unload
        only), then the stream of ``response`` lines; ``context`` on the last line unless raw."""
        model = self._model(body)
        if model is None:
            return
        if body.get("raw") and (body.get("template") or body.get("system") or body.get("context")):
            self._error(400, "raw mode does not support template, system, or context")
            return
        if body.get("think") not in (None, False) and not model.thinks:
            self._error(400, f'"{model.name}" does not support thinking')
            return
        if model.embedding:  # scheduleRunner's errCapabilityCompletion
            self._error(400, f'"{model.name}" does not support generate')
            return
        if body.get("suffix") and not model.inserts:  # CheckCapabilities: errCapabilities joined with "insert"
            self._error(400, "does not support insert")
            return
        if not body.get("prompt"):
            self._load_or_unload(model, body, {"response": ""})
            return
        messages = [{"role": "user", "content": str(body["prompt"]) + " " + str(body.get("suffix") or "")}]
        self._chat_stream(model, body, messages, generate=True)

    def chat(self, body: dict[str, Any]) -> None:
        model = self._model(body)
        if model is None:
            return
        messages = body.get("messages") or []
        if not messages:
            self._load_or_unload(model, body, {"message": {"role": "assistant", "content": ""}})
            return
        if body.get("think") not in (None, False) and not model.thinks:  # server/routes.go ChatHandler
            self._error(400, f'"{model.name}" does not support thinking')
            return
        self._chat_stream(model, body, messages)

    def _thoughts(self, model: ReplayModel, body: dict[str, Any]) -> list[str]:
        """What a thinking model thinks before it answers: nothing when asked not to (``think: false``)."""
        if not model.thinks or body.get("think") is False:
            return []
        return [("" if i == 0 else " ") + WORDS[(i + 5) % len(WORDS)] for i in range(self.state.thinking_tokens)]

    def _context(self, model: ReplayModel) -> int:
        with self.state.lock:
            loaded = self.state.loaded.get(model.name)
        return loaded.context_length if loaded else 4096

    def _chat_stream(
        self, model: ReplayModel, body: dict[str, Any], messages: list[dict[str, Any]], *, generate: bool = False
    ) -> None:
        """A chat's stream, or with ``generate`` /api/generate's: the same words, each line's text in ``response``
        (and ``thinking``) instead of ``message``."""

        def said(text: str, thinking: str = "") -> dict[str, Any]:
            if generate:
                return {"response": text, **({"thinking": thinking} if thinking else {})}
            return {"message": {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}}

        state = self.state
        started = time.perf_counter_ns()
        load_ns = self._load(model, body)
        options = body.get("options") or {}
        limit = int(options.get("num_predict") or -1)
        thoughts = self._thoughts(model, body)
        budget = len(thoughts) + state.reply_tokens  # num_predict counts the thinking tokens too
        if 0 <= limit < len(thoughts):
            thoughts = thoughts[:limit]
        planned = max(0, (budget if limit < 0 else min(limit, budget)) - len(thoughts))
        reason = "length" if 0 <= limit <= budget else "stop"
        context = self._context(model)
        shift = state.context_shift and body.get("shift") is not False
        truncate = body.get("truncate") is not False
        prompt_tokens = chat_prompt_tokens(messages, context, truncate=truncate, shift=shift)
        if not shift and prompt_tokens > context - 1:
            # llm/llama_server.go completionPromptForRequest: no context shift, the prompt does not fit: 400 before
            # the stream (server/routes.go sends the runner's StatusError with its status when nothing was written).
            self._error(400, OVERFLOW_WORDS)
            return
        prompt_started = time.perf_counter_ns()
        time.sleep(state.prompt_delay_s)  # "prompt processing"
        prompt_ns = time.perf_counter_ns() - prompt_started
        sent = 0
        eval_started = time.perf_counter_ns()
        with state.lock:
            state.streams_open += 1
            state.running[model.name] = state.running.get(model.name, 0) + 1
        try:
            self._start_stream()
            for thought in thoughts:  # thinking lines: message.thinking, empty content
                if state.cut_after_tokens is not None and sent >= state.cut_after_tokens:
                    self._cut()
                    return
                if state.error_after_tokens is not None and sent >= state.error_after_tokens:
                    self._line({"error": state.stream_error})
                    self._end_stream()
                    return
                self._line({"model": model.name, "created_at": _now(), **said("", thought), "done": False})
                sent += 1
                time.sleep(state.token_interval_s)
            for index in range(planned):
                if state.cut_after_tokens is not None and sent >= state.cut_after_tokens:
                    self._cut()
                    return
                if state.error_after_tokens is not None and sent >= state.error_after_tokens:
                    self._line({"error": state.stream_error})
                    self._end_stream()
                    return
                if state.raw_line_after_tokens is not None and sent == state.raw_line_after_tokens:
                    data = state.raw_line + b"\n"
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                word = WORDS[index % len(WORDS)]
                text = word if index == 0 else f" {word}"
                self._line({"model": model.name, "created_at": _now(), **said(text), "done": False})
                sent += 1
                time.sleep(state.token_interval_s)
            eval_ns = time.perf_counter_ns() - eval_started
            if state.omit_done_line:  # a well-formed stream that still never says done:true
                self._end_stream()
                return
            final = {
                "model": model.name,
                "created_at": _now(),
                **said(""),
                "done": True,
                "done_reason": reason,
                "total_duration": time.perf_counter_ns() - started,  # the load included
                "load_duration": load_ns,
                "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": prompt_ns,
                "eval_count": sent,
                "eval_duration": eval_ns,
            }
            if generate and not body.get("raw"):
                final["context"] = list(range(prompt_tokens + sent))  # the conversation's tokens, to continue it
            self._line({key: value for key, value in final.items() if value != 0})  # omitempty metrics
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            # The client closed the stream early: Ollama cancels the request's context and stops decoding.
            with state.lock:
                state.closed_early.append({"path": self.path, "tokens_sent": sent})
            self.close_connection = True
        finally:
            with state.lock:
                state.streams_open -= 1
                state.running[model.name] -= 1

    def pull(self, body: dict[str, Any]) -> None:
        name = str(body.get("model") or body.get("name") or "")
        if not name or any(ch.isspace() for ch in name) or name.startswith(("/", ":")):
            self._error(400, "invalid model name")
            return
        wanted = self.state.registry.get(full_name(name))
        self._start_stream()
        try:
            self._line({"status": "pulling manifest"})
            time.sleep(self.state.pull_step_s)
            if wanted is None:
                self._line({"error": "pull model manifest: file does not exist"})
                self._end_stream()
                return
            for index, total in enumerate(wanted.layers):
                digest = f"sha256:{index:02d}{wanted.digest[2:]}"
                steps = 5
                for step in range(steps + 1):
                    line: dict[str, Any] = {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total}
                    completed = total * step // steps
                    if completed:
                        line["completed"] = completed  # omitempty in api.ProgressResponse
                    self._line(line)
                    time.sleep(self.state.pull_step_s)
            for status in ("verifying sha256 digest", "writing manifest", "success"):
                self._line({"status": status})
            with self.state.lock:
                self.state.models[wanted.name] = wanted
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            with self.state.lock:
                self.state.closed_early.append({"path": self.path, "tokens_sent": 0})
            self.close_connection = True

    def delete(self, body: dict[str, Any]) -> None:
        name = str(body.get("model") or body.get("name") or "")
        if not name:
            self._error(400, 'name "" is invalid')
            return
        if full_name(name) not in self.state.models:
            self._error(404, f"model '{name}' not found")
            return
        with self.state.lock:
            del self.state.models[full_name(name)]
        self._json(200, None)


@pytest.fixture(name="ollama")
def ollama_fixture() -> Iterator[OllamaReplay]:
    """A fresh replay server per test, serving smollm2:135m; ``tinyllama`` can be pulled from its registry."""
    replay = OllamaReplay(registry=[smollm2("tinyllama:latest")]).start()
    yield replay
    replay.stop()
