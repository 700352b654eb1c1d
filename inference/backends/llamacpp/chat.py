"""llama.cpp's ``llama-server``: OpenAI-style streaming with llama.cpp's own per-token timings.

Protocol: https://github.com/ggml-org/llama.cpp/tree/master/tools/server (``/v1/chat/completions`` with
``stream`` and ``timings_per_token``; ``/v1/models``; ``/health``). Closing the HTTP stream frees the slot.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import os
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import httpx

from inference.backends import failures
from inference.backends.base import (
    CONTEXT_FROM_MODEL_FILE,
    CONTEXT_FROM_ROUTER_ARGS,
    CONTEXT_FROM_SERVER,
    Backend,
    BackendBadEvent,
    BackendError,
    BackendNotSupported,
    BackendProtocolError,
    BackendStats,
    BackendUnavailable,
    Capabilities,
    ChatRequest,
    Health,
    LoadedModel,
    ModelArchitecture,
    ModelInfo,
    OnSent,
    ReadGate,
    StreamChunk,
    positive_int,
    refusal_or,
)
from inference.backends.gguf import trained_context
from inference.backends.llamacpp import flags as server_flags
from inference.backends.openai.embeddings import embeddings_post, rerank_post
from inference.backends.openai.stream import (
    EventReader,
    event_object,
    passthrough_merged,
    stream_chat_events,
    tool_call_deltas,
)

LOAD_WAIT_S = 300.0  # a router's model load: the weights read from disk
ContextFigure = tuple[int | None, str | None]  # a model's context in tokens, and where the figure comes from


def with_model(path: str, model: str | None) -> str:
    """A path of a router's per-model endpoint (``/props``, ``/slots``, ``/metrics``: ``?model=``)."""
    return f"{path}?{urlencode({'model': model})}" if model else path


def draft_counts(timings: dict[str, Any]) -> tuple[int | None, int | None]:
    """(drafted, accepted) tokens of speculative decoding: llama-server adds ``draft_n`` and ``draft_n_accepted`` to
    a reply's timings once its draft model proposed a token (``server_slot_stats::to_json`` in
    tools/server/server-common.cpp). Counts that are not whole, or more accepted than drafted, are refused."""
    drafted, accepted = _count(timings.get("draft_n")), _count(timings.get("draft_n_accepted"))
    if drafted is None or accepted is None or accepted > drafted:
        return None, None
    return drafted, accepted


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _context_of(meta: dict[str, Any], details: dict[str, Any], trained: dict[str, int | None]) -> ContextFigure:
    """A listed model's context and its source. A running server's ``meta`` says its slots' context (``n_ctx``; an
    older server only its trained ``n_ctx_train``). A router's unloaded model has no ``meta``, only the command line
    its instance will run (``status.args``): the slot context it sizes, capped by the model file's trained context
    where the file is readable on RigDash's host (``trained``, by path). Otherwise unknown, never guessed."""
    if meta:
        if (n_ctx := positive_int(meta.get("n_ctx"))) is not None:
            return n_ctx, CONTEXT_FROM_SERVER
        n_ctx_train = positive_int(meta.get("n_ctx_train"))
        return n_ctx_train, CONTEXT_FROM_MODEL_FILE if n_ctx_train is not None else None
    if "args" not in details:
        return None, None
    flags = server_flags.parse(details["args"])
    tokens = server_flags.slot_context(flags, trained.get(flags.model_path))
    if tokens is None:
        return None, None
    return tokens, CONTEXT_FROM_ROUTER_ARGS if flags.ctx_size or flags.ctx_per_slot else CONTEXT_FROM_MODEL_FILE


def stats_from_timings(timings: dict[str, Any]) -> BackendStats:
    drafted, accepted = draft_counts(timings)
    return BackendStats(
        prompt_tokens=timings.get("prompt_n"),
        prompt_ms=timings.get("prompt_ms"),
        cached_tokens=timings.get("cache_n"),
        output_tokens=timings.get("predicted_n"),
        decode_ms=timings.get("predicted_ms"),
        decode_tps=timings.get("predicted_per_second"),
        draft_tokens=drafted,
        draft_accepted_tokens=accepted,
        raw=timings,
    )


def context_tokens(timings: dict[str, Any]) -> int | None:
    """Tokens in the slot's context: cached prompt + processed prompt + decoded (llama.cpp timings)."""
    try:
        return int(timings.get("cache_n", 0)) + int(timings["prompt_n"]) + int(timings["predicted_n"])
    except (KeyError, TypeError, ValueError):
        return None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context per process. Without it httpx builds one, loading the CA bundle, for every client: on every
    turn, before the request is sent."""
    return httpx.create_ssl_context(trust_env=False)


def _error_body(status: int | None, body: bytes) -> BackendError:
    """llama-server's refusal ``{"error": {"code", "type", "message", ...}}`` by what it says and its fields (a 503
    ``Loading model`` is retryable; out of memory is not; ``exceed_context_size_error`` names both sizes)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return _error(status, body[:300].decode("utf-8", "replace"))
    error = payload.get("error") if isinstance(payload, dict) else None
    found = failures.classify_object("llama-server", error if error is not None else payload, status=status)
    words = str(error.get("message") or error) if isinstance(error, dict) else str(error or payload)
    return refusal_or(found, "llama-server", status, words[:300])


def _error(status: int | None, message: str) -> BackendError:
    """llama-server's error by what it says (a 503 ``Loading model`` is retryable; out of memory is not)."""
    return refusal_or(failures.classify("llama-server", message, status=status), "llama-server", status, message)


def _answer_object(path: str, response: httpx.Response) -> dict[str, Any]:
    """A JSON object answer of llama-server's to ``path``, or its error by what the server said."""
    if response.status_code >= 400:
        raise _error_body(response.status_code, response.content)
    try:
        payload = response.json()
    except ValueError as exc:
        raise BackendProtocolError(f"llama-server sent non-JSON for {path}") from exc
    if not isinstance(payload, dict):
        raise BackendProtocolError(f"llama-server's {path} answer is not an object")
    return payload


class LlamaCppBackend(Backend):
    kind = "llamacpp"
    label = "llama.cpp server"
    calls_read_gate = True
    # loads_on_demand: router and sleep modes.
    capabilities = Capabilities(reasoning_levels=True, loads_on_demand=True, native_completions=True)

    def _client(self, *, read_timeout: float | None) -> httpx.AsyncClient:
        timeout = httpx.Timeout(self.timeout_s, read=read_timeout)
        return httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, trust_env=False, verify=tls_context(), headers=self.headers
        )

    async def _get_json(self, path: str) -> Any:
        try:
            async with self._client(read_timeout=self.timeout_s) as client:
                response = await client.get(path)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"llama-server at {self.base_url} is unreachable: {exc!r}") from exc
        if response.status_code >= 400:
            raise _error_body(response.status_code, response.content)
        try:
            return response.json()
        except ValueError as exc:
            raise BackendProtocolError(f"llama-server sent non-JSON for {path}") from exc

    async def health(self) -> Health:
        try:
            await self._get_json("/health")
        except BackendError as exc:
            return Health(ok=False, detail=str(exc))
        return Health(ok=True, detail="ok")

    async def list_models(self) -> list[ModelInfo]:
        """``/v1/models``: one model, or in router mode every model the router knows, each with its ``status``
        (``loaded``, ``loading``, ``unloaded``) and the command line its instance runs (``status.args``), each with
        its context and that figure's source (``_context_of``). An entry of an odd shape is skipped; a payload without
        a list of models is a protocol error, never a crash."""
        payload = await self._get_json("/v1/models")
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            raise BackendProtocolError("llama-server's /v1/models answer has no list of models")
        entries = []
        for entry in data:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
                continue
            meta: dict[str, Any] = entry["meta"] if isinstance(entry.get("meta"), dict) else {}
            details = dict(meta)
            status = entry.get("status")
            if isinstance(status, dict):
                details["status"] = str(status.get("value") or "")
                args = status.get("args")
                details["args"] = [str(arg) for arg in args] if isinstance(args, list) else []
            entries.append((entry["id"], meta, details))
        paths = {server_flags.parse(details["args"]).model_path for _, meta, details in entries
                 if not meta and details.get("args")} - {""}  # fmt: skip
        trained = await asyncio.to_thread(lambda: {path: trained_context(path) for path in paths}) if paths else {}
        models = []
        for name, meta, details in entries:
            tokens, source = _context_of(meta, details, trained)
            models.append(ModelInfo(name=name, context_length=tokens, size_bytes=positive_int(meta.get("size")),
                                    details=details, context_source=source))  # fmt: skip
        return models

    async def props(self, model: str | None = None) -> dict[str, Any]:
        payload = await self._get_json(with_model("/props", model))
        if not isinstance(payload, dict):
            raise BackendProtocolError("llama-server /props is not an object")
        return payload

    async def _model_props(self, model: str) -> dict[str, Any]:
        """The model's own /props: the server's, or in router mode its instance's (``?model=``, which loads it)."""
        props = await self.props()
        return await self.props(model) if props.get("role") == "router" and model else props

    async def context_window(self, model: str) -> int | None:
        settings = (await self._model_props(model)).get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return positive_int(n_ctx)

    async def loaded_models(self) -> list[LoadedModel]:
        """The models in memory: in router mode those whose status is ``loaded``; otherwise the one model."""
        loaded = []
        for model in await self.list_models():
            status = model.details.get("status")
            if status is not None and status != "loaded":
                continue
            loaded.append(
                LoadedModel(
                    name=model.name,
                    size_bytes=model.size_bytes or 0,
                    context_length=positive_int(model.details.get("n_ctx")),
                    details=model.details,
                )
            )
        return loaded

    async def needs_load(self, model: str) -> bool:
        """Router mode: the model's status is not ``loaded`` (a request for it loads it; never with
        ``--no-models-autoload``, whose router refuses it instead); one model: the server sleeps
        (``--sleep-idle-seconds``: the request wakes it, which loads the model again)."""
        props = await self.props()
        if props.get("role") == "router":
            if props.get("models_autoload") is False:
                return False
            status = next((m.details.get("status") for m in await self.list_models() if m.name == model), None)
            return status not in (None, "loaded")
        return bool(props.get("is_sleeping"))

    async def _router_call(self, path: str, model: str) -> None:
        if (await self.props()).get("role") != "router":
            raise BackendNotSupported("this llama-server serves one model: start it with --models-dir to swap models")
        await self._post_json(path, {"model": model})

    async def load_model(self, model: str) -> None:
        """Router mode: load ``model`` (``POST /models/load``) and wait until the router reports it loaded."""
        await self._router_call("/models/load", model)
        deadline = asyncio.get_running_loop().time() + max(self.timeout_s, LOAD_WAIT_S)
        while True:
            status = next((m.details.get("status") for m in await self.list_models() if m.name == model), None)
            if status == "loaded":
                return
            if status not in ("loading", "unloaded") or asyncio.get_running_loop().time() > deadline:
                raise BackendUnavailable(f"llama-server did not load {model} (its status: {status or 'unknown'})")
            await asyncio.sleep(0.2)

    async def unload_model(self, model: str) -> None:
        """Router mode: free ``model``'s instance (``POST /models/unload``); the next request for it loads it."""
        await self._router_call("/models/unload", model)

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            async with self._client(read_timeout=self.timeout_s) as client:
                return await client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"llama-server at {self.base_url} is unreachable: {exc!r}") from exc

    async def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return _answer_object(path, await self._post(path, body))

    async def prompt_tokens(self, model: str, messages: list[dict[str, str]]) -> int:
        """The count llama-server's ``prompt_n`` gives the same messages with nothing cached (``_templated_tokens``)."""
        return await self._templated_tokens({"messages": messages})

    async def input_tokens(self, body: dict[str, Any]) -> int:
        """``/v1/chat/completions/input_tokens`` (the request's template, tools and images, as its chat completion
        would read them; a router passes it to the model's instance). A build without it (404) gets
        ``_templated_tokens``, which counts an image as its placeholder text."""
        path = "/v1/chat/completions/input_tokens"
        response = await self._post(path, body)
        if response.status_code == 404:
            return await self._templated_tokens(body)
        count = _answer_object(path, response).get("input_tokens")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise BackendProtocolError("llama-server's token count is not a count")
        return count

    async def _templated_tokens(self, body: dict[str, Any]) -> int:
        """``/apply-template`` then ``/tokenize`` with the special tokens the template writes parsed as such: the
        tokens of the chat request ``body``'s prompt (a router routes both by its ``model``, where it names one)."""
        prompt = (await self._post_json("/apply-template", body)).get("prompt")
        if not isinstance(prompt, str):
            raise BackendProtocolError("llama-server's /apply-template answer has no prompt")
        tokenize = {"content": prompt, "add_special": True, "parse_special": True}
        if "model" in body:
            tokenize["model"] = body["model"]
        tokens = (await self._post_json("/tokenize", tokenize)).get("tokens")
        if not isinstance(tokens, list):
            raise BackendProtocolError("llama-server's /tokenize answer has no tokens")
        return len(tokens)

    async def model_architecture(self, model: str) -> ModelArchitecture:
        """From the GGUF file itself, when llama-server's model file is readable on RigDash's host."""
        from inference.backends.gguf import architecture_from_metadata, read_metadata

        path = (await self._model_props(model)).get("model_path") or ""
        if not isinstance(path, str) or not path or not os.path.isfile(path):
            raise BackendNotSupported(f"the model file {path!r} is not readable from RigDash's host")
        try:
            return architecture_from_metadata(await asyncio.to_thread(read_metadata, path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BackendProtocolError(f"cannot read the GGUF metadata of {path}: {exc}") from exc

    def _payload(self, request: ChatRequest) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": request.model,
            "stream": True,
            "timings_per_token": True,
            "max_tokens": request.max_tokens,
        }
        if request.prompt is None:
            payload["messages"] = request.messages
        else:
            payload["prompt"] = request.prompt
        # llama-server's own sampling names (tools/server/README.md, "POST /completion" options).
        for name in ("temperature", "top_p", "seed", "top_k", "min_p", "repeat_penalty"):
            value = getattr(request, name)
            if value is not None:
                payload[name] = value
        if request.think is not None:
            # The template's own switch (Qwen3-style ``enable_thinking``); reasoning arrives apart from the answer
            # as ``delta.reasoning_content`` (``reasoning_format`` deepseek), whatever the server's default format.
            # A level goes as OpenAI's ``reasoning_effort``, which llama-server hands to a template that reads one
            # (gpt-oss's; the b11434 server's jinja ``caps_apply_reasoning_effort``) and others ignore.
            payload["chat_template_kwargs"] = {"enable_thinking": request.think is not False}
            payload["reasoning_format"] = "deepseek"
            if isinstance(request.think, str):
                payload["reasoning_effort"] = request.think
        if request.stop:
            payload["stop"] = list(request.stop)
        if request.prompt is None and (request.stop or request.extra.get("stop")):  # the chat's, or the client's
            # Which sequence ended the reply comes only in the final result's ``__verbose`` object: ``verbose`` asks
            # for it and ``response_fields`` keeps it to that field (tools/server/server-task.cpp
            # ``to_json_oaicompat_chat_stream``, ``to_json_non_oaicompat``). A server without them ignores them. A
            # chat's partial chunks carry none; a raw completion's would carry one each, so it is not asked there.
            payload["verbose"], payload["response_fields"] = True, ["stopping_word"]
        return passthrough_merged(payload, request.extra)

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post_json("/tokenize", body)

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post_json("/detokenize", body)

    async def rerank(self, body: dict[str, Any]) -> dict[str, Any] | list[Any]:
        """``/v1/rerank`` (a server started with ``--reranking``; otherwise its 501 "Start it with ``--reranking``")."""
        return await rerank_post(server="llama-server", base_url=self.base_url, body=body, timeout_s=self.timeout_s,
                                 headers=self.headers, tls=tls_context())  # fmt: skip

    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        return await embeddings_post(
            server="llama-server", base_url=self.base_url, body=body, timeout_s=self.timeout_s, headers=self.headers,
            tls=tls_context(),
        )  # fmt: skip

    def stream_chat(
        self, request: ChatRequest, *, read_gate: ReadGate | None = None, on_sent: OnSent | None = None
    ) -> AsyncIterator[StreamChunk]:
        # The stream is read with the lean client in sse.py (httpx's line iterator was the worker's largest
        # cost per token).
        payload, path = self._payload(request), "/v1/chat/completions"
        reader: EventReader = _Events()
        if request.native is not None:
            payload, path, reader = _native(request), f"/{request.native}", _NativeEvents()
        elif request.prompt is not None:
            payload, path = _infill(payload) if "suffix" in request.extra else (payload, "/v1/completions")
            reader = _NativeEvents() if path == "/infill" else reader
        return stream_chat_events(
            headers=self.headers,
            server="llama-server",
            base_url=self.base_url,
            payload=payload,
            reader=reader,
            path=path,
            error=_error_body,
            connect_timeout_s=self.timeout_s,
            tls=tls_context(),
            read_gate=read_gate,
            on_sent=on_sent,
        )


def _infill(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A completion with a ``suffix`` (code completion, fill-in-the-middle) as llama-server's ``/infill``: its
    ``/v1/completions`` ignores a suffix. A model without FIM tokens is refused there (501, in its words)."""
    body = {name: value for name, value in payload.items() if name not in ("prompt", "suffix", "max_tokens")}
    body.update(input_prefix=payload["prompt"], input_suffix=payload["suffix"], n_predict=payload["max_tokens"])
    return body, "/infill"


# What RigDash sets in a request in llama-server's own API, whatever the client sent: the stream it reads, with running
# timings, the model and the reply's cap. ``response_fields`` would leave out the fields the stream is read by: the
# answer to the client applies the client's (inference/views/llamacpp_native.py).
NATIVE_OWNED = frozenset({"model", "stream", "timings_per_token", "n_predict", "max_tokens", "response_fields"})


def _native(request: ChatRequest) -> dict[str, Any]:
    """A request in llama-server's own API (``/completion``, ``/infill``) as the client wrote it, with RigDash's own
    fields (``NATIVE_OWNED``). The cap is the turn's, or the client's ``n_predict`` where it asked for fewer (0: a
    prompt only read into the server's cache, as llama.vim warms it with the files it will send for context)."""
    body = {name: value for name, value in request.extra.items() if name not in NATIVE_OWNED}
    asked = request.extra.get("n_predict")
    fewer = isinstance(asked, int) and not isinstance(asked, bool) and 0 <= asked < request.max_tokens
    body.update(
        model=request.model, stream=True, timings_per_token=True, n_predict=asked if fewer else request.max_tokens
    )
    if request.native == "completion":
        body["prompt"] = request.prompt
    return body


class _NativeEvents:
    """llama-server's own completion events (``/infill``, ``/completion``): ``content``, ``stop`` at the end with
    ``stop_type`` and the timings."""

    def __init__(self) -> None:
        self.finished = False

    def event(self, data: str, *, last_in_read: bool) -> StreamChunk:
        event = event_object(data)
        if not isinstance(event.get("content", ""), str):
            raise BackendBadEvent(f"fields of unexpected types: {data[:200]!r}")
        if "error" in event:  # as in the chat stream: its words, and its status as the object's ``code``
            raise failures.classify_object("llama-server", event["error"])
        times = event.get("timings") if isinstance(event.get("timings"), dict) else None
        if times is not None and not _timings_ok(times):
            raise BackendBadEvent(f"fields of unexpected types: {data[:200]!r}")
        finish = None
        if event.get("stop") is True:
            self.finished = True
            finish = "length" if event.get("stop_type") == "limit" else "stop"
        return StreamChunk(
            text=event.get("content") or "",
            finish_reason=finish,
            stats=stats_from_timings(times) if times else None,
            context_tokens=context_tokens(times) if times else None,
            stop_word=_stop_word(event) if finish else None,
            ending=_ending(event) if finish else None,
        )

    def done(self) -> None:
        return None


# A native completion's last event's own figures that its answer repeats (tools/server/server-task.cpp,
# ``server_task_result_cmpl_final::to_json_non_oaicompat``); RigDash reads the rest (the timings, the stop word) itself.
NATIVE_ENDING = ("tokens_predicted", "tokens_evaluated", "tokens_cached", "truncated", "has_new_line", "stop_type")


def _ending(event: dict[str, Any]) -> dict[str, Any]:
    """``NATIVE_ENDING``'s fields of ``event`` that are a flag, a word or a count (a hostile server's other values are
    left out)."""
    kept: dict[str, Any] = {}
    for name in NATIVE_ENDING:
        value = event.get(name)
        if isinstance(value, bool | str) or (isinstance(value, int) and 0 <= value < 1 << 53):
            kept[name] = value[:32] if isinstance(value, str) else value
    return kept


class _Events:
    """llama-server's events: the running timings of the last event a read brought are the ones read; the events
    before it in the same read are parsed for their text, their timings only type-checked."""

    def __init__(self) -> None:
        self.finished = False
        self.stop_word: str | None = None

    def event(self, data: str, *, last_in_read: bool) -> StreamChunk:
        chunk = _chunk(data, timings=last_in_read)
        self.stop_word = chunk.stop_word or self.stop_word
        if chunk.finish_reason:
            self.finished = True
            if self.stop_word and not chunk.stop_word:
                return dataclasses.replace(chunk, stop_word=self.stop_word)  # the finish carries the reply's end
        return chunk

    def done(self) -> None:
        return None


def _chunk(data: str, *, timings: bool = True) -> StreamChunk:
    """One SSE event of llama-server's chat stream. Anything but the shape llama-server sends raises
    BackendBadEvent: an event that cannot be read ends the reply at once.

    With ``timings_per_token`` every event carries the running timings. Without ``timings`` (an event followed by
    another in the same read) they are only checked to be an object and not read: reading, checking and copying
    them was half of the worker's cost per token, and the next event's supersede them. The final event's (with a
    finish reason) are always read."""
    event = event_object(data)
    if "error" in event:  # after the stream began: its words, and its status as the event's ``code``
        raise failures.classify_object("llama-server", event["error"])
    choices = event.get("choices") or [{}]
    choice = choices[0] if isinstance(choices, list) else None
    delta = choice.get("delta") or {} if isinstance(choice, dict) else None
    text = delta.get("content") or "" if isinstance(delta, dict) else None
    if text == "" and isinstance(choice, dict) and "text" in choice:  # a raw completion's event (/v1/completions)
        text = choice["text"] or ""
    thinking = delta.get("reasoning_content") or "" if isinstance(delta, dict) else None
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    times = event.get("timings")
    if (
        not isinstance(text, str)
        or not isinstance(thinking, str)
        or not (finish is None or isinstance(finish, str))
        or not (times is None or isinstance(times, dict))
    ):
        raise BackendBadEvent(f"fields of unexpected types: {data[:200]!r}")
    calls = tool_call_deltas(delta, data)  # an API client's tools: None for every chat-page token
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    logprobs = logprobs if isinstance(logprobs, dict) else None
    # The final result's first chunk, where the request asked for it: before the finish when the end brought text.
    verbose = event.get("__verbose")
    stop_word = _stop_word(verbose) if isinstance(verbose, dict) else None
    if times is None or not (timings or finish):
        return StreamChunk(text=text, thinking=thinking, finish_reason=finish, tool_calls=calls, logprobs=logprobs,
                           stop_word=stop_word)  # fmt: skip
    if not _timings_ok(times):
        raise BackendBadEvent(f"fields of unexpected types: {data[:200]!r}")
    # With timings_per_token every chunk carries the running timings; the first one already holds prompt_n
    # (the prompt's real size), which the quota check reads before decode goes on.
    return StreamChunk(
        text=text,
        thinking=thinking,
        finish_reason=finish,
        stats=stats_from_timings(times) if times else None,
        context_tokens=context_tokens(times) if times else None,
        tool_calls=calls,
        logprobs=logprobs,
        stop_word=stop_word,
    )


def _stop_word(fields: dict[str, Any]) -> str | None:
    """The stop sequence that ended a reply (llama-server's ``stopping_word``; "" when none did)."""
    word = fields.get("stopping_word")
    return word if isinstance(word, str) and word else None


def _timings_ok(timings: dict[str, Any]) -> bool:
    """Every timing RigDash reads is a finite number (or absent)."""
    for name in ("prompt_n", "prompt_ms", "cache_n", "predicted_n", "predicted_ms", "predicted_per_second"):
        value = timings.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        if abs(value) > 1e15:
            return False
    return True
