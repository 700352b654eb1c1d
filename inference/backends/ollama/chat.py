"""Ollama: NDJSON streaming through the official ``ollama`` client, with Ollama's own nanosecond timings.

Protocol: https://github.com/ollama/ollama/blob/main/docs/api.md and ``api/types.go`` (the v0.32 server
series), through the official ``ollama`` Python client 0.6: ``/api/chat`` streams ``{message, done:false}``
lines and ends with one ``done:true`` line carrying ``done_reason`` and the counters (``/api/generate``, for a raw
completion, the same with ``response`` for ``message``); ``/api/tags``,
``/api/version``, ``/api/show``, ``/api/ps``; ``/api/pull`` streams progress and ends ``{"status":
"success"}``; errors are ``{"error": "..."}`` (404 ``model 'x' not found`` for an unknown model).
Closing the HTTP stream makes Ollama stop generating that reply.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar, cast

import httpx
import ollama
import ollama._types as ollama_types
import pydantic

from inference.backends import failures
from inference.backends.base import (
    Backend,
    BackendBadEvent,
    BackendError,
    BackendNotSupported,
    BackendProtocolError,
    BackendRefused,
    BackendStats,
    BackendUnavailable,
    Capabilities,
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
    refusal_or,
)
from inference.backends.ollama.openai_fields import ollama_fields, ollama_message

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
        prompt_counts_cached=True,  # prompt_eval_count = cache_n + prompt_n (llm/llama_server.go promptEvalCount)
        load_ms=_ms(final.get("load_duration")),
    )


def _translate(exc: Exception, what: str) -> BackendError:
    """Map the client's errors to the contract's kinds, by what they say (inference/backends/failures.py): the
    client raises the same ResponseError, with status -1, for an ``{"error"}`` line after a 200 stream began."""
    if isinstance(exc, ollama.ResponseError):
        status = None if exc.status_code == -1 else exc.status_code
        words = str(exc.error)
        # A refusal nothing else classes (a capability the model lacks, a field Ollama rejects) keeps its status.
        return refusal_or(failures.classify(f"Ollama ({what})", words, status=status), "Ollama", status, words[:500])
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


Part = ollama.ChatResponse | ollama.GenerateResponse  # a line of /api/chat's stream, or of /api/generate's


async def _stream_lines(response: httpx.Response, kind: type[Part]) -> AsyncIterator[Part]:
    """The stream's NDJSON lines as the ollama client reads them (``json.loads``, an ``{"error"}`` line is a
    ResponseError, ``ChatResponse(**part)`` or ``GenerateResponse(**part)``), but decoded strictly: a line that is
    not UTF-8 raises UnicodeDecodeError (a ValueError) like any line RigDash cannot read. Blank lines are skipped."""
    pending = b""
    async for data in response.aiter_bytes():
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield _part(line, kind)
    if pending.strip():
        yield _part(pending, kind)


# The status of an ``{"error"}`` line inside a stream that began with 200: Ollama's streamResponse
# (server/routes.go) writes only the words once the head is out, and sends 500 for an error that named no status, so
# a runner's failure mid-reply is a 500 (retryable) unless its words say otherwise (inference/backends/failures.py).
IN_STREAM_STATUS = 500


def _part(line: bytes, kind: type[Part]) -> Part:
    part = json.loads(line.decode("utf-8", errors="strict"))
    if err := part.get("error"):
        raise ollama.ResponseError(err, IN_STREAM_STATUS)
    return kind(**part)


def _said(part: Part) -> tuple[str, str, Any]:
    """(text, thinking, tool calls) of a stream line: a chat line's message, a generate line's response."""
    if isinstance(part, ollama.ChatResponse):
        return part.message.content or "", part.message.thinking or "", part.message.tool_calls
    return part.response or "", part.thinking or "", None


def _generate_body(request: ChatRequest, options: dict[str, Any]) -> dict[str, Any]:
    """A raw completion (OpenAI's /v1/completions) as Ollama's /api/generate (server/routes.go GenerateHandler):
    ``raw`` (the prompt as given, no template), or with a ``suffix`` through the model's template's fill-in-the-middle
    (raw mode takes no suffix; a model whose template has none is refused: "does not support insert"). ``think``
    false: the text comes back as the model wrote it, not parted into thoughts."""
    extra = dict(request.extra)
    suffix = extra.pop("suffix", None)
    more_options, fields = ollama_fields(extra)
    if fields:
        raise BackendNotSupported(f"Ollama's /api/generate has no equivalent of {sorted(fields)}")
    body: dict[str, Any] = {"model": request.model, "prompt": request.prompt, "stream": True, "think": False,
                            "options": {**more_options, **options}}  # fmt: skip
    if suffix:
        body["suffix"] = suffix
    else:
        body["raw"] = True
    if request.keep_alive is not None:
        body["keep_alive"] = request.keep_alive
    return body


def _with_openai_fields(body: dict[str, Any], request: ChatRequest) -> None:
    """An OpenAI client's request in Ollama's terms (inference/backends/ollama/openai_fields.py); the turn's own
    options (its token cap) win."""
    options, fields = ollama_fields(request.extra)
    body["options"] = {**options, **body.get("options", {})}
    body.update(fields)
    body["messages"] = [ollama_message(m) for m in request.messages]


def _tool_call_deltas(calls: Any) -> list[dict[str, Any]] | None:
    """Ollama's whole tool calls (arguments an object) as OpenAI's stream deltas (arguments a JSON string)."""
    if not calls:
        return None
    return [
        {"index": index, "id": f"call_{index}", "type": "function",
         "function": {"name": call.function.name, "arguments": json.dumps(dict(call.function.arguments or {}))}}
        for index, call in enumerate(calls)
    ]  # fmt: skip


class OllamaBackend(Backend):
    kind = "ollama"
    label = "Ollama"
    capabilities = Capabilities(
        request_settings=frozenset({"num_ctx"}), context_per_request=True, context_per_model=True,
        truncates_to_window=True, reasoning_levels=True, loads_on_demand=True,
    )  # fmt: skip
    silent_while_loading = True  # /api/ps waits on a loading runner (server/sched.go loadedModels)
    transport: httpx.AsyncBaseTransport | None = None  # the HTTP transport; None: httpx's own

    def _client(self, *, read_timeout: float | None) -> ollama.AsyncClient:
        timeout = httpx.Timeout(self.timeout_s, read=read_timeout)
        extra: dict[str, Any] = {} if self.transport is None else {"transport": self.transport}
        return ollama.AsyncClient(host=self.base_url, timeout=timeout, trust_env=False, headers=self.headers, **extra)

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
            async with httpx.AsyncClient(
                base_url=self.base_url, timeout=self.timeout_s, trust_env=False, headers=self.headers
            ) as http:
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
        # Ollama's Options (api/types.go): the same names as llama.cpp's sampler, under ``options``.
        for name in ("num_ctx", "temperature", "top_p", "seed", "top_k", "min_p", "repeat_penalty"):
            value = getattr(request, name)
            if value is not None:
                options[name] = value
        if request.stop:
            options["stop"] = list(request.stop)
        return options

    async def stream_chat(
        self, request: ChatRequest, *, read_gate: ReadGate | None = None, on_sent: OnSent | None = None
    ) -> AsyncIterator[StreamChunk]:
        # read_gate is not used: httpx reads the stream itself. Nor can on_sent see its write: it is called as the
        # request starts. The request body is the ollama client's own (its ChatRequest model); the lines are read
        # here, not by the client, whose httpx ``aiter_lines`` replaces bytes that are not UTF-8 instead of failing.
        # No read timeout here: the worker enforces first-token and stall timeouts itself.
        path, kind = "/api/chat", cast(type[Part], ollama.ChatResponse)
        if request.prompt is not None:  # a raw completion
            path, kind = "/api/generate", ollama.GenerateResponse
            body = _generate_body(request, self._options(request))
        else:
            body = ollama_types.ChatRequest(
                model=request.model,
                messages=[
                    ollama.Message.model_validate({k: v for k, v in dict(m).items() if v}) for m in request.messages
                ],
                stream=True,
                options=self._options(request),
                keep_alive=request.keep_alive,
                think=request.think,  # unset: the server's default (a thinking model thinks)
            ).model_dump(exclude_none=True)
            if request.extra or any(set(m) - {"role", "content"} or not isinstance(m.get("content"), str)
                                    for m in request.messages):  # fmt: skip
                _with_openai_fields(body, request)  # an API client's request
        timeout = httpx.Timeout(self.timeout_s, read=None)
        extra: dict[str, Any] = {} if self.transport is None else {"transport": self.transport}
        if on_sent is not None:
            on_sent()
        try:
            async with (
                httpx.AsyncClient(
                    base_url=self.base_url, timeout=timeout, trust_env=False, headers=self.headers, **extra
                ) as http,
                http.stream("POST", path, json=body, headers={"Accept": "application/json"}) as response,
            ):
                if response.is_error:
                    await response.aread()
                    raise ollama.ResponseError(response.text, response.status_code)
                async for part in _stream_lines(response, kind):
                    # A thinking model's lines carry ``message.thinking`` with empty content until it answers.
                    text, thinking, tool_calls = _said(part)
                    if part.done:
                        final = part.model_dump(include=set(FINAL_FIELDS))
                        reason = part.done_reason or "stop"
                        stats = stats_from_final(final)
                        yield StreamChunk(
                            text=text,
                            thinking=thinking,
                            finish_reason=reason,
                            stats=stats,
                            context_tokens=(stats.prompt_tokens or 0) + (stats.output_tokens or 0) or None,
                        )
                        return
                    calls = _tool_call_deltas(tool_calls)
                    if text or thinking or calls:
                        yield StreamChunk(text=text, thinking=thinking, tool_calls=calls)
        except (ollama.ResponseError, ConnectionError, httpx.HTTPError) as exc:  # an unreadable line: below
            raise _translate(exc, path.removeprefix("/api/")) from exc
        except UNREADABLE_LINE_ERRORS as exc:
            raise BackendBadEvent(repr(exc)[:300]) from exc
        raise BackendUnavailable("Ollama closed the stream before the reply finished (no done:true line)")

    # Optional capabilities (base.Backend).
    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's embeddings request through Ollama's ``/api/embed`` (``input``: a string or a list of them),
        answered in OpenAI's shape; a field Ollama has no equivalent of is refused by name."""
        refused = sorted(set(body) - {"model", "input", "encoding_format", "user", "dimensions"})
        if refused or body.get("encoding_format") not in (None, "float"):
            raise BackendNotSupported(f"Ollama's /api/embed has no equivalent of {refused or ['encoding_format']}")
        ask = {name: body[name] for name in ("model", "input", "dimensions") if name in body}
        try:
            async with httpx.AsyncClient(
                base_url=self.base_url, timeout=self.timeout_s, trust_env=False, headers=self.headers
            ) as http:
                response = await http.post("/api/embed", json=ask)
            payload = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise _translate(exc, "embed") from exc
        if response.status_code >= 400 or not isinstance(payload, dict):
            words = payload.get("error") if isinstance(payload, dict) else payload
            raise BackendRefused("Ollama", response.status_code, str(words)[:500])
        vectors = payload.get("embeddings") or []
        count = payload.get("prompt_eval_count") or 0
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "model": body.get("model"),
            "usage": {"prompt_tokens": count, "total_tokens": count},
        }

    async def model_architecture(self, model: str) -> ModelArchitecture:
        """From /api/show's model_info (GGUF keys). Ollama blanks a list longer than 5 items (a per-layer
        ``head_count_kv``) unless asked for verbose output: then it asks again, verbose."""
        from inference.backends.gguf import architecture_from_metadata

        shown = await self._call("show model", lambda c: c.show(model))
        info = dict(shown.modelinfo or {})
        if any(isinstance(value, list) and not value for value in info.values()):
            info = await self._show_verbose(model)
        try:
            return architecture_from_metadata(info)
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendProtocolError(f"Ollama's model_info for {model!r} lacks {exc}") from exc

    async def _show_verbose(self, model: str) -> dict[str, Any]:
        # The client's show() has no verbose flag: this one request goes through httpx directly.
        try:
            async with httpx.AsyncClient(
                base_url=self.base_url, timeout=self.timeout_s, trust_env=False, headers=self.headers
            ) as http:
                response = await http.post("/api/show", json={"model": model, "verbose": True})
        except httpx.HTTPError as exc:
            raise _translate(exc, "show model (verbose)") from exc
        try:
            payload = response.json()
        except ValueError as exc:
            raise BackendProtocolError(f"Ollama sent non-JSON for /api/show of {model!r}") from exc
        if response.status_code >= 400:
            message = payload.get("error", "") if isinstance(payload, dict) else str(payload)
            raise failures.classify("Ollama (show model)", str(message), status=response.status_code)
        info = payload.get("model_info") if isinstance(payload, dict) else None
        return dict(info or {})

    async def model_capabilities(self, model: str) -> frozenset[str]:
        """/api/show ``capabilities`` (server/images.go ``Capabilities``: "completion", "thinking", "tools", ...),
        plus "think_levels" for a thinking model: Ollama takes ``think: "low" | "medium" | "high"`` for any of them
        (api/types.go ThinkValue; server/routes.go hands the level to the model's template or parser, and gpt-oss
        reads it as its reasoning effort, its only switch: ``think: false`` does not stop gpt-oss thinking)."""
        shown = await self._call("show model", lambda c: c.show(model))
        capabilities = frozenset(str(name) for name in (shown.capabilities or []))
        return capabilities | {"think_levels"} if "thinking" in capabilities else capabilities

    async def model_file_bytes(self, model: str) -> int | None:
        """The model's size on disk (/api/tags ``size``: its blobs, the GGUF weights nearly all of it): what Ollama's
        own estimate counts as the weights (llm/llama_server.go PredictServerVRAM: the model file's size)."""
        wanted = _full_name(model)
        for entry in await self.list_models():
            if _full_name(entry.name) == wanted:
                return entry.size_bytes
        return None

    async def context_window(self, model: str) -> int | None:
        """The context the loaded model runs with (/api/ps ``context_length``: one sequence's num_ctx). Not loaded:
        unknown, as the server's default depends on its VRAM (4k, 32k or 256k tokens) and OLLAMA_CONTEXT_LENGTH,
        which no API reports; the model's next load sets it."""
        wanted = _full_name(model)
        for loaded in await self.loaded_models():
            if _full_name(loaded.name) == wanted and loaded.context_length:
                return int(loaded.context_length)
        return None

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


def _full_name(name: str) -> str:
    """Ollama's default tag: ``smollm2`` is ``smollm2:latest``."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
