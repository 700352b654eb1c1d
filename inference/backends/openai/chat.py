"""Any server that speaks OpenAI's chat-completions API: vLLM, LM Studio, LocalAI, SGLang, llama-server's own ``/v1``.

https://platform.openai.com/docs/api-reference/chat — ``GET /v1/models``, ``POST /v1/chat/completions`` streamed
with ``stream_options.include_usage`` (the token counts arrive in a last chunk with no choices). Such a server
reports no timings, so this plug-in times the reply itself: decode is the interval from the first to the last text
chunk, as received here (network included), and says so in the stats' ``raw``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from inference.backends import failures
from inference.backends.base import (
    Backend,
    BackendBadEvent,
    BackendError,
    BackendProtocolError,
    BackendStats,
    BackendUnavailable,
    Capabilities,
    ChatRequest,
    Health,
    ModelInfo,
    OnSent,
    ReadGate,
    StreamChunk,
    refusal_or,
)
from inference.backends.openai.embeddings import embeddings_post, rerank_post
from inference.backends.openai.stream import event_object, passthrough_merged, stream_chat_events, tool_call_deltas

SERVER = "the OpenAI-compatible server"
# Where servers put a model's context window in /v1/models: vLLM's max_model_len, LM Studio's and others'
# context_length, llama-server's meta.n_ctx_train.
CONTEXT_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length")


def error_from(status: int | None, body: bytes) -> BackendError:
    """A refusal in OpenAI's shape (``{"error": {"message"}}``) or plain text, classed by its words."""
    try:
        payload = json.loads(body)
    except ValueError:
        message = body[:300].decode("utf-8", "replace")
        return refusal_or(failures.classify(SERVER, message, status=status), SERVER, status, message)
    error = payload.get("error") if isinstance(payload, dict) else None
    # Inside a stream (status None) an error object's ``code`` is its status (llama-server's /v1 stream).
    found = failures.classify_object(SERVER, error if error is not None else payload, status=status)
    words = str(error.get("message") or error) if isinstance(error, dict) else str(error or payload)
    return refusal_or(found, SERVER, status, words[:300])


def _context_of(entry: dict[str, Any]) -> int | None:
    meta = entry.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    for value in [entry.get(name) for name in CONTEXT_FIELDS] + [meta.get("n_ctx_train")]:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class OpenAICompatBackend(Backend):
    kind = "openai"
    label = "OpenAI-compatible server"
    calls_read_gate = True
    capabilities = Capabilities(reasoning_switch=False)

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, api_key: str = "") -> None:
        # A URL given with its /v1 (as these servers' docs write it) names the same server.
        base = base_url.rstrip("/")
        super().__init__(base[: -len("/v1")] if base.endswith("/v1") else base, timeout_s=timeout_s, api_key=api_key)

    async def _models_payload(self) -> list[dict[str, Any]]:
        try:
            async with httpx.AsyncClient(
                base_url=self.base_url, timeout=self.timeout_s, trust_env=False, headers=self.headers
            ) as client:
                response = await client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"{SERVER} at {self.base_url} is unreachable: {exc!r}") from exc
        if response.status_code >= 400:
            raise error_from(response.status_code, response.content)
        try:
            data = response.json().get("data")
        except (ValueError, AttributeError) as exc:
            raise BackendProtocolError(f"{SERVER} sent something that is not a model list for /v1/models") from exc
        if not isinstance(data, list):
            raise BackendProtocolError(f"{SERVER}'s /v1/models has no list of models")
        return [entry for entry in data if isinstance(entry, dict) and isinstance(entry.get("id"), str)]

    async def health(self) -> Health:
        try:
            models = await self._models_payload()
        except BackendError as exc:
            return Health(ok=False, detail=str(exc))
        return Health(ok=True, detail=f"ok: serves {len(models)} model(s)")

    async def list_models(self) -> list[ModelInfo]:
        return [
            ModelInfo(name=entry["id"], context_length=_context_of(entry)) for entry in await self._models_payload()
        ]

    async def context_window(self, model: str) -> int | None:
        for entry in await self._models_payload():
            if entry["id"] == model:
                return _context_of(entry)
        return None

    def _payload(self, request: ChatRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": request.model,
            **({"messages": request.messages} if request.prompt is None else {"prompt": request.prompt}),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens,
        }
        # OpenAI's samplers, then the extensions vLLM, llama-server and LocalAI share (sent only when a chat sets them).
        for name in ("temperature", "top_p", "seed", "top_k", "min_p"):
            value = getattr(request, name)
            if value is not None:
                payload[name] = value
        if request.repeat_penalty is not None:
            payload["repetition_penalty"] = request.repeat_penalty
        if request.stop:
            payload["stop"] = list(request.stop)
        return passthrough_merged(payload, request.extra)

    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        return await embeddings_post(
            server=SERVER, base_url=self.base_url, body=body, timeout_s=self.timeout_s, headers=self.headers, tls=True
        )

    async def rerank(self, body: dict[str, Any]) -> dict[str, Any] | list[Any]:
        """``/v1/rerank``, as vLLM and LocalAI serve it (Jina's shape); a server without it refuses with its 404."""
        return await rerank_post(
            server=SERVER, base_url=self.base_url, body=body, timeout_s=self.timeout_s, headers=self.headers, tls=True
        )

    def stream_chat(
        self, request: ChatRequest, *, read_gate: ReadGate | None = None, on_sent: OnSent | None = None
    ) -> AsyncIterator[StreamChunk]:
        return stream_chat_events(
            headers=self.headers,
            server=SERVER,
            base_url=self.base_url,
            payload=self._payload(request),
            reader=UsageEvents(),
            error=error_from,
            path="/v1/chat/completions" if request.prompt is None else "/v1/completions",
            connect_timeout_s=self.timeout_s,
            tls=None,
            read_gate=read_gate,
            on_sent=on_sent,
        )


class UsageEvents:
    """OpenAI's events: text deltas (``content``; a reasoning server's ``reasoning_content`` or ``reasoning``), a
    ``finish_reason``, then ``usage`` in a chunk of its own. The finish is held back until the usage (or
    ``[DONE]``) so that the last chunk carries both, as the contract wants."""

    def __init__(self) -> None:
        self.finished = False
        self.finish_reason: str | None = None
        self.stop_word: str | None = None  # vLLM's ``stop_reason``: the stop string that ended the reply
        self.usage: dict[str, Any] = {}
        self.first_text_at: float | None = None
        self.last_text_at: float | None = None
        self.text_chunks = 0

    def event(self, data: str, *, last_in_read: bool) -> StreamChunk | None:
        event = event_object(data)
        if "error" in event:  # after the stream began: its words, and the status its ``code`` names
            raise error_from(None, data.encode())
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = event.get("choices") or []
        if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
            raise BackendBadEvent(f"fields of unexpected types: {data[:200]!r}")
        if not choices:
            return None
        delta = choices[0].get("delta") or {}
        finish = choices[0].get("finish_reason")
        text = delta.get("content") or "" if isinstance(delta, dict) else None
        if text == "" and isinstance(choices[0].get("text"), str):  # a raw completion's event (/v1/completions)
            text = choices[0]["text"]
        thinking = (delta.get("reasoning_content") or delta.get("reasoning") or "") if isinstance(delta, dict) else None
        if (
            not isinstance(text, str)
            or not isinstance(thinking, str)
            or not (finish is None or isinstance(finish, str))
        ):
            raise BackendBadEvent(f"fields of unexpected types: {data[:200]!r}")
        if finish:
            self.finish_reason = finish
            stopped_by = choices[0].get("stop_reason")  # a stop token's id when no string matched
            self.stop_word = stopped_by if isinstance(stopped_by, str) and stopped_by else None
        calls = tool_call_deltas(delta, data)
        logprobs = choices[0].get("logprobs")
        chunk = StreamChunk(
            text=text, thinking=thinking, tool_calls=calls, logprobs=logprobs if isinstance(logprobs, dict) else None
        )
        if not chunk.carries:
            return None
        now = time.monotonic()
        self.first_text_at = self.first_text_at or now
        self.last_text_at = now
        self.text_chunks += 1
        return chunk

    def done(self) -> StreamChunk | None:
        if self.finish_reason is None:
            return None
        self.finished = True
        return StreamChunk(text="", finish_reason=self.finish_reason, stats=self.stats(), stop_word=self.stop_word)

    def stats(self) -> BackendStats:
        output = self.usage.get("completion_tokens")
        output = output if isinstance(output, int) and output >= 0 else self.text_chunks
        prompt = self.usage.get("prompt_tokens")
        details = self.usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        decode_s = (self.last_text_at or 0) - (self.first_text_at or 0)
        # The first token ends the prompt phase; the rate counts the tokens after it over the time they took.
        decode_tps = round((output - 1) / decode_s, 2) if decode_s > 0 and output > 1 else None
        return BackendStats(
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            cached_tokens=cached if isinstance(cached, int) else None,
            output_tokens=output,
            decode_ms=round(decode_s * 1000, 3) if decode_s > 0 else None,
            decode_tps=decode_tps,
            raw={"usage": self.usage, "timed_by": "RigDash, from the first to the last text chunk received"},
        )
