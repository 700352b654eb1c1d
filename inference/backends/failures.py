"""A backend's error classed by what it says, not by when it arrives: a server that fails after the stream began
sends the same words with HTTP 200 (Ollama's ``{"error": ...}`` line mid-stream) as it sends with a 5xx before.

The phrases are the servers' own: Ollama's ``llm/status.go`` (out-of-memory substrings), ``server/sched.go``
(``server busy``), ``llm/llama_server.go`` (runner start and stop); llama-server's 503 ``Loading model``.
"""

from __future__ import annotations

from inference.backends.base import (
    BackendError,
    BackendOutOfMemory,
    BackendUnavailable,
    ModelLoading,
    ModelNotFound,
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
CRASHED = ("model runner has unexpectedly stopped", "llama runner process has terminated")


def classify(server: str, message: str, *, status: int | None = None) -> BackendError:
    """The contract's kind for an error ``server`` reported with ``message`` (``status``: its HTTP status, None
    for a line inside a stream that began with 200). The words decide first; the status only when they say
    nothing known (5xx retryable, 404 unknown model, any other permanent)."""
    said = message.lower()
    if any(phrase in said for phrase in OUT_OF_MEMORY):
        return BackendOutOfMemory(
            f"{server} has not enough memory for this model and its context ({message}). Unload other models, "
            "or use a smaller model, quantisation or context; trying again as is will fail the same way."
        )
    if any(phrase in said for phrase in LOADING):
        return ModelLoading(f"{server} is still loading the model or is busy ({message}); try again shortly.")
    if any(phrase in said for phrase in CRASHED):
        return BackendUnavailable(f"{server}'s model runner stopped ({message}); the next request starts it again.")
    if status == 404:
        return ModelNotFound(f"{server}: {message}")
    if status is not None and status >= 500:
        return BackendUnavailable(f"{server} answered {status}: {message}")
    return BackendError(f"{server}: {message}" if status is None else f"{server} answered {status}: {message}")
