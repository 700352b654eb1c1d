"""Ollama: NDJSON streaming through the official ``ollama`` client, with Ollama's own nanosecond timings.

Protocol: https://github.com/ollama/ollama/blob/main/docs/api.md and ``api/types.go`` (the v0.12 server
series), through the official ``ollama`` Python client 0.6: ``/api/chat`` streams ``{message, done:false}``
lines and ends with one ``done:true`` line carrying ``done_reason`` and the counters; ``/api/tags``,
``/api/version``, ``/api/show``, ``/api/ps``; ``/api/pull`` streams progress and ends ``{"status":
"success"}``; errors are ``{"error": "..."}`` (404 ``model 'x' not found`` for an unknown model).
Closing the HTTP stream makes Ollama stop generating that reply.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar, cast

import httpx
import ollama
import pydantic

from inference.backends.base import (
    Backend,
    BackendBadEvent,
    BackendError,
    BackendProtocolError,
    BackendStats,
    BackendUnavailable,
    ChatRequest,
    Health,
    LoadedModel,
    ModelArchitecture,
    ModelInfo,
    ModelNotFound,
    OnSent,
    PullProgress,
    ReadGate,
    StreamChunk,
)

T = TypeVar("T")
NS_PER_MS = 1_000_000
FINAL_FIELDS = (
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
    "load_duration",
    "total_duration",
    "done_reason",
)


def _ms(nanoseconds: int | None) -> float | None:
    return None if nanoseconds is None else round(nanoseconds / NS_PER_MS, 3)


def stats_from_final(final: dict[str, Any]) -> BackendStats:
    """BackendStats from the ``done:true`` line (durations are nanoseconds); ``raw`` keeps the fields as sent."""
    eval_count, eval_ns = final.get("eval_count"), final.get("eval_duration")
    decode_tps = round(eval_count / eval_ns * 1e9, 2) if eval_count and eval_ns else None
    return BackendStats(
        prompt_tokens=final.get("prompt_eval_count"),
        prompt_ms=_ms(final.get("prompt_eval_duration")),
        output_tokens=eval_count,
        decode_ms=_ms(eval_ns),
        decode_tps=decode_tps,
        raw={name: final[name] for name in FINAL_FIELDS if final.get(name) is not None},
    )


def _translate(exc: Exception, what: str) -> BackendError:
    """Map the client's errors to the contract's kinds: 404 unknown model, 5xx and transport retryable."""
    if isinstance(exc, ollama.ResponseError):
        message = f"Ollama {what}: {exc.error}"
        if exc.status_code == 404:
            return ModelNotFound(message)
        if exc.status_code >= 500:
            return BackendUnavailable(message)
        return BackendError(message)
    if isinstance(exc, ConnectionError | httpx.ConnectError | httpx.ConnectTimeout):
        return BackendUnavailable(f"Ollama is unreachable ({what}): {exc!r}")
    if isinstance(exc, httpx.HTTPError):
        return BackendUnavailable(f"the connection to Ollama failed during {what}: {exc!r}")
    return BackendProtocolError(f"Ollama sent something unexpected for {what}: {exc!r}")


# What the client raises: its own ResponseError, ConnectionError (refused), httpx errors mid-stream,
# pydantic's ValidationError or ValueError (bad JSON) for a reply it cannot parse.
CLIENT_ERRORS = (ollama.ResponseError, ConnectionError, httpx.HTTPError, pydantic.ValidationError, ValueError)
# What reading a chat line that is not Ollama's raises in the client (json.loads, ``part.get``, ``cls(**part)``,
# pydantic): not JSON, not an object, fields of the wrong types.
UNREADABLE_LINE_ERRORS = (pydantic.ValidationError, ValueError, TypeError, AttributeError, KeyError, RecursionError)


class OllamaBackend(Backend):
    kind = "ollama"
    transport: httpx.AsyncBaseTransport | None = None  # the HTTP transport; None: httpx's own

    def _client(self, *, read_timeout: float | None) -> ollama.AsyncClient:
        timeout = httpx.Timeout(self.timeout_s, read=read_timeout)
        extra: dict[str, Any] = {} if self.transport is None else {"transport": self.transport}
        return ollama.AsyncClient(host=self.base_url, timeout=timeout, trust_env=False, **extra)

    async def _call(self, what: str, call: Callable[[ollama.AsyncClient], Awaitable[T]]) -> T:
        """Run ``call(client)`` with a fresh client, translating its errors."""
        client = self._client(read_timeout=self.timeout_s)
        try:
            async with client:  # closes its connections
                return await call(client)
        except CLIENT_ERRORS as exc:
            raise _translate(exc, what) from exc

    async def health(self) -> Health:
        # The client has no call for /api/version, so this one request goes through httpx directly.
        try:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s, trust_env=False) as http:
                response = await http.get("/api/version")
                response.raise_for_status()
                version = str(response.json().get("version", ""))
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            return Health(ok=False, detail=f"Ollama at {self.base_url} is unreachable or unwell: {exc!r}")
        return Health(ok=True, detail="ok", version=version)

    async def list_models(self) -> list[ModelInfo]:
        listing = await self._call("list models", lambda c: c.list())
        return [
            ModelInfo(
                name=entry.model or "",
                size_bytes=int(entry.size) if entry.size is not None else None,
                details=entry.details.model_dump(exclude_none=True) if entry.details else {},
            )
            for entry in listing.models
            if entry.model
        ]

    def _options(self, request: ChatRequest) -> dict[str, Any]:
        options: dict[str, Any] = {"num_predict": request.max_tokens}
        for name in ("num_ctx", "temperature", "top_p", "seed"):
            value = getattr(request, name)
            if value is not None:
                options[name] = value
        return options

    async def stream_chat(
        self, request: ChatRequest, *, read_gate: ReadGate | None = None, on_sent: OnSent | None = None
    ) -> AsyncIterator[StreamChunk]:
        # read_gate is not used: the ollama client reads the stream itself. Nor can on_sent see its write: it is
        # called as the request starts.
        # No read timeout here: the worker enforces first-token and stall timeouts itself.
        client = self._client(read_timeout=None)
        if on_sent is not None:
            on_sent()
        try:
            async with client:
                parts = await client.chat(
                    model=request.model,
                    messages=request.messages,
                    stream=True,
                    options=self._options(request),
                    keep_alive=request.keep_alive,
                )
                # aclosing: leaving early exits the client's ``async with stream``, closing the response.
                async with aclosing(cast(AsyncGenerator[ollama.ChatResponse, None], parts)) as stream:
                    async for part in stream:
                        text = part.message.content or ""
                        if part.done:
                            final = part.model_dump(include=set(FINAL_FIELDS))
                            reason = part.done_reason or "stop"
                            yield StreamChunk(text=text, finish_reason=reason, stats=stats_from_final(final))
                            return
                        if text:
                            yield StreamChunk(text=text)
        except (ollama.ResponseError, ConnectionError, httpx.HTTPError) as exc:
            raise _translate(exc, "chat") from exc
        except UNREADABLE_LINE_ERRORS as exc:
            raise BackendBadEvent(repr(exc)[:300]) from exc
        raise BackendUnavailable("Ollama closed the stream before the reply finished (no done:true line)")

    # Optional capabilities (base.Backend).
    async def model_architecture(self, model: str) -> ModelArchitecture:
        shown = await self._call("show model", lambda c: c.show(model))
        info = dict(shown.modelinfo or {})
        arch = info.get("general.architecture")
        try:
            return ModelArchitecture(
                arch=str(arch),
                block_count=int(info[f"{arch}.block_count"]),
                head_count=int(info[f"{arch}.attention.head_count"]),
                head_count_kv=int(info.get(f"{arch}.attention.head_count_kv", info[f"{arch}.attention.head_count"])),
                embedding_length=int(info[f"{arch}.embedding_length"]),
                context_length=_int_or_none(info.get(f"{arch}.context_length")),
                key_length=_int_or_none(info.get(f"{arch}.attention.key_length")),
                value_length=_int_or_none(info.get(f"{arch}.attention.value_length")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendProtocolError(f"Ollama's model_info for {model!r} lacks {exc}") from exc

    async def loaded_models(self) -> list[LoadedModel]:
        listing = await self._call("list loaded models", lambda c: c.ps())
        return [
            LoadedModel(
                name=entry.model or entry.name or "",
                size_bytes=int(entry.size or 0),
                size_vram_bytes=int(entry.size_vram) if entry.size_vram is not None else None,
                context_length=entry.context_length,
                expires_at=entry.expires_at.isoformat() if entry.expires_at else None,
                details=entry.details.model_dump(exclude_none=True) if entry.details else {},
            )
            for entry in listing.models
        ]

    async def pull_model(self, model: str) -> AsyncIterator[PullProgress]:
        # A download may take hours between progress lines on a slow link: no read timeout.
        client = self._client(read_timeout=None)
        try:
            async with client:
                parts = await client.pull(model, stream=True)
                async with aclosing(cast(AsyncGenerator[ollama.ProgressResponse, None], parts)) as stream:
                    async for part in stream:
                        step = PullProgress(
                            status=part.status or "", digest=part.digest, total=part.total, completed=part.completed
                        )
                        yield step
                        if step.done:
                            return
        except ollama.ResponseError as exc:
            # An error after the stream began comes as an {"error"} line (no status): a name the
            # registry does not have reads "pull model manifest: file does not exist".
            if exc.status_code == -1 and "file does not exist" in str(exc.error):
                raise ModelNotFound(f"The registry has no model named {model!r} ({exc.error})") from exc
            raise _translate(exc, f"pull of {model!r}") from exc
        except CLIENT_ERRORS as exc:
            raise _translate(exc, f"pull of {model!r}") from exc
        raise BackendUnavailable(f"Ollama ended the pull of {model!r} before it succeeded")

    async def delete_model(self, model: str) -> None:
        await self._call(f"delete of {model!r}", lambda c: c.delete(model))

    async def unload_model(self, model: str) -> None:
        # Documented unload: a generate request with no prompt and keep_alive 0 (done_reason "unload").
        await self._call(f"unload of {model!r}", lambda c: c.generate(model=model, keep_alive=0))


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
