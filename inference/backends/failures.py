"""A backend's error classed by what it says, not by when it arrives: a server that fails after the stream began
sends the same words with HTTP 200 (Ollama's ``{"error": ...}`` line mid-stream) as it sends with a 5xx before.

The phrases are the servers' own: Ollama's ``llm/status.go`` (out-of-memory substrings), ``server/sched.go``
(``server busy``), ``llm/llama_server.go`` (runner start and stop; ``completionPromptForRequest``: "the prompt is
longer than the context length ..."), ``server/routes.go`` (``"x" does not support thinking``, "the input length
exceeds the context length"); llama-server's 503 ``Loading model``, its router's 400 "model is not loaded"
(tests/test_gateway_server_matrix.py) and its ``exceed_context_size_error`` (HTTP 400 ``{"error": {"code": 400,
"type": "exceed_context_size_error", "message": "request (631 tokens) exceeds the available context size (256
tokens), try increasing it", "n_prompt_tokens": 631, "n_ctx": 256}}``, as the b11434 server answers:
tests/test_context_overflow.py holds RigDash to the real one).

Statuses inside a stream: llama-server's error event carries its status as ``error.code`` (the 500 of a failed
decode stays a 500, so retryable); Ollama's ``{"error"}`` line carries none, and its ``streamResponse``
(server/routes.go) sends 500 for an error that names no status, so a line RigDash cannot class otherwise is a 500.
"""

from __future__ import annotations

import re
from typing import Any

from inference.backends.base import (
    BackendError,
    BackendOutOfMemory,
    BackendUnavailable,
    ContextOverflow,
    ModelLoadFailed,
    ModelLoading,
    ModelNotFound,
    ModelNotLoaded,
    ThinkingNotSupported,
)

OUT_OF_MEMORY = (
    "requires more system memory",
    "out of memory",
    "out of device memory",
    "cudamalloc failed",
    "hipmalloc failed",
    "failed to allocate",
    "allocation failed",
    "not enough memory",
    "insufficient memory",
    "unable to load full model on gpu",
    "erroroutofmemory",
)
LOADING = (
    "loading model",
    "model is loading",
    "timed out waiting for llama runner",
    "timed out waiting for llama-server to start",
    "server busy",
    "maximum pending requests exceeded",
)
# The server will not load the model for a request: a llama-server router started with --no-models-autoload
# (server-models.cpp, router_validate_model).
NOT_LOADED = "model is not loaded"
# The server could not load the model: llama-server's router ("model name=X failed to load", server-models.cpp),
# Ollama's runner ("error loading model", "unable to load model", llm/server.go). Before LOADING: "error loading
# model" holds "loading model".
LOAD_FAILED = ("failed to load", "error loading model", "unable to load model")
CRASHED = ("model runner has unexpectedly stopped", "llama runner process has terminated")
CONTEXT_OVERFLOW = (
    "exceed_context_size_error",
    "exceeds the available context size",  # llama-server's message
    "the prompt is longer than the context length",  # Ollama, llm/llama_server.go
    "the input length exceeds the context length",  # Ollama, server/routes.go
    "input exceeds maximum context length",  # Ollama, server/routes.go
    "input after truncation exceeds maximum context length",
)
NO_THINKING = "does not support thinking"
# llama-server's words, and its fields as text (Ollama forwards the runner's body as its error string).
_SIZES_IN_WORDS = re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)")
_FIELD = {name: re.compile(rf'"?{name}"?\s*[:=]\s*(\d+)') for name in ("n_prompt_tokens", "n_ctx")}


def _overflow(server: str, message: str, fields: dict[str, Any]) -> ContextOverflow:
    prompt, context = fields.get("n_prompt_tokens"), fields.get("n_ctx")
    if not isinstance(prompt, int) or isinstance(prompt, bool):
        prompt = None
    if not isinstance(context, int) or isinstance(context, bool):
        context = None
    if (prompt is None or context is None) and (words := _SIZES_IN_WORDS.search(message)):
        prompt, context = prompt or int(words[1]), context or int(words[2])
    for name, pattern in _FIELD.items():
        if (found := pattern.search(message)) is not None:
            if name == "n_prompt_tokens" and prompt is None:
                prompt = int(found[1])
            if name == "n_ctx" and context is None:
                context = int(found[1])
    return ContextOverflow(server, prompt_tokens=prompt, context_tokens=context)


def classify(
    server: str, message: str, *, status: int | None = None, fields: dict[str, Any] | None = None
) -> BackendError:
    """The contract's kind for an error ``server`` reported with ``message`` (``status``: its HTTP status, None
    for a line inside a stream that told none; ``fields``: the rest of an error object, as llama-server's
    ``n_prompt_tokens`` and ``n_ctx``). The words decide first; the status only when they say nothing known (5xx
    retryable, 404 unknown model, any other permanent)."""
    said = message.lower()
    error_type = str((fields or {}).get("type") or "").lower()
    if error_type == "exceed_context_size_error" or any(phrase in said for phrase in CONTEXT_OVERFLOW):
        return _overflow(server, message, fields or {})
    if NO_THINKING in said:
        return ThinkingNotSupported(
            f"{server}: this model does not think (it has no reasoning capability): set Thinking to"
            " \u201cmodel default\u201d for this chat, or pick a reasoning model."
        )
    if any(phrase in said for phrase in OUT_OF_MEMORY):
        return BackendOutOfMemory(
            f"{server} has not enough memory for this model and its context ({message}). Unload other models, "
            "or use a smaller model, quantisation or context; trying again as is will fail the same way."
        )
    if NOT_LOADED in said:
        return ModelNotLoaded(f"{server} does not load models on request, and this one is not loaded ({message})")
    if any(phrase in said for phrase in LOAD_FAILED):
        return ModelLoadFailed(f"{server} could not load the model: {message}")
    if any(phrase in said for phrase in LOADING):
        return ModelLoading(f"{server} is still loading the model or is busy ({message}); try again shortly.")
    if any(phrase in said for phrase in CRASHED):
        return BackendUnavailable(f"{server}'s model runner stopped ({message}); the next request starts it again.")
    if status == 404:
        return ModelNotFound(f"{server}: {message}")
    if status is not None and status >= 500:
        return BackendUnavailable(f"{server} answered {status}: {message}")
    return BackendError(f"{server}: {message}" if status is None else f"{server} answered {status}: {message}")


def classify_object(server: str, error: Any, *, status: int | None = None) -> BackendError:
    """An OpenAI-shaped error (``{"code", "type", "message", ...}``, llama-server's) or a bare string, classed.
    Inside a stream (``status`` None) the object's own ``code`` is its status: llama-server sends the HTTP status
    it would have answered there (``send_error`` in tools/server), so a 500 stays retryable."""
    if isinstance(error, dict):
        code = error.get("code")
        if status is None and isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
            status = code
        message = str(error.get("message") or error)[:300]
        return classify(server, message, status=status, fields=error)
    return classify(server, str(error)[:300], status=status)
