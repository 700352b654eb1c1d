"""Ollama's API at ``/api/`` for Ollama clients, with a RigDash key as the bearer token: chat and generate are turns
(the same submit as ``/v1/``: quotas, fair queue, board, usage, cancel), answered whole or as Ollama's NDJSON
stream; tags, show, ps and version describe the catalogue; embed goes to the rig serving the model.

https://github.com/ollama/ollama/blob/main/docs/api.md. A request is translated into the OpenAI request RigDash
passes to any rig (inference/views/openai_request.py): ``options`` become OpenAI's and llama.cpp's sampler names
(``num_predict`` the token cap), ``format`` becomes ``response_format``, images become content parts, a tool call's
arguments a JSON string. What has no equivalent is refused by name (400, Ollama's ``{"error"}``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from inference.board import apikeys
from inference.models import Turn
from inference.views.openai import CatalogueEntry, catalogue_loaded, error_words, model_catalogue, model_resolve
from inference.views.openai_chat import (
    ENDED_STATUSES,
    Piece,
    Submitted,
    answer_confirmed,
    answered,
    ended_error,
    text_stream,
    turn_submit_for,
)
from inference.views.openai_embeddings import embeddings_submit, whole_answer
from inference.views.openai_request import (
    BadRequest,
    ChatCompletionRequest,
    body_read,
    chat_request_parse,
    completion_request_parse,
)
from inference.views.turn_listener import TurnListener, on_db_thread

VERSION = "0.6.0"  # the Ollama API version whose shapes these answers follow (ollama-python 0.6)
# Ollama's option -> the OpenAI request's field; any other option goes on under its own name (llama-server takes
# llama.cpp's: mirostat, typical_p, repeat_last_n, ...; num_ctx changes nothing there: its context is set at start).
OPTIONS = {"num_predict": "max_tokens"}
NO_EQUIVALENT = ("context", "template", "images_only")


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _ollama_shape(response: HttpResponse) -> HttpResponse:
    """An OpenAI-shaped error answer as Ollama's ``{"error": "..."}``, same status."""
    message = error_words(response)
    return response if message is None else _error(response.status_code, message)


def _authenticated(request: HttpRequest, *, remembered: bool = False) -> HttpResponse | None:
    try:
        header = request.headers.get("Authorization", "")
        request.api_key = apikeys.api_key_authenticate(header, remembered=remembered)  # type: ignore[attr-defined]
    except apikeys.KeyRejected as exc:
        return _key_refused(exc)
    return None


def _key_refused(exc: apikeys.KeyRejected) -> HttpResponse:
    response = _error(401, exc.message)
    response["WWW-Authenticate"] = 'Bearer realm="rigdash-api"'
    return response


def _key_view(
    view: Callable[[HttpRequest, dict[str, Any]], Any], *, submits: bool = False
) -> Callable[[HttpRequest], Any]:
    """A database-thread view: the key, then the body (POST) read strictly; errors in Ollama's shape. ``submits``: a
    view that submits through ``turn_submit_for``, whose key may come from memory (``key_checked``)."""

    def wrapped(request: HttpRequest) -> Any:
        if (refused := _authenticated(request, remembered=submits)) is not None:
            return refused
        try:
            body = body_read(request.body) if request.method == "POST" else {}
        except BadRequest as exc:
            return answer_confirmed(request, _error(exc.status, exc.message), _key_refused)
        return answer_confirmed(request, view(request, body), _key_refused)

    return wrapped


# Translation ------------------------------------------------------------------------------------------------


def _message(message: Any) -> dict[str, Any]:
    """An Ollama message as OpenAI's: images as content parts, tool calls' arguments as JSON strings."""
    if not isinstance(message, dict):
        raise BadRequest("each message must be an object")
    out = {k: v for k, v in message.items() if k not in ("images", "tool_calls", "tool_name", "thinking")}
    if images := message.get("images"):
        text = [{"type": "text", "text": message.get("content") or ""}]
        out["content"] = text + [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}
                                 for image in images]  # fmt: skip
    if calls := message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": f"call_{index}", "type": "function",
             "function": {"name": (call.get("function") or {}).get("name"),
                          "arguments": json.dumps((call.get("function") or {}).get("arguments") or {})}}
            for index, call in enumerate(calls) if isinstance(call, dict)
        ]  # fmt: skip
    if message.get("tool_name"):
        out["name"] = message["tool_name"]
    return out


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    """Ollama's request fields beyond the messages or prompt, in the OpenAI request's names."""
    if refused := [name for name in NO_EQUIVALENT if body.get(name) is not None]:
        raise BadRequest(f"RigDash has no equivalent of the field {refused[0]!r}")
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise BadRequest("options must be an object")
    fields: dict[str, Any] = {OPTIONS.get(str(name), str(name)): value for name, value in options.items()}
    fmt = body.get("format")
    if fmt == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise BadRequest(f"format must be 'json' or a JSON schema, not {fmt!r}")
    if body.get("tools"):
        fields["tools"] = body["tools"]
    fields["stream"] = body.get("stream", True) is not False  # Ollama streams unless told not to
    return fields


def _openai_body(model: Any, fields: dict[str, Any], **rest: Any) -> bytes:
    return json.dumps({"model": model, **fields, **rest}).encode()


def _think(parsed: ChatCompletionRequest, body: dict[str, Any]) -> ChatCompletionRequest:
    if isinstance(body.get("think"), bool):
        parsed.params["think"] = body["think"]
    return parsed


def _chat_submit(request: HttpRequest, body: dict[str, Any]) -> Submitted:
    try:
        messages = [_message(m) for m in body.get("messages") or []]
        parsed = chat_request_parse(_openai_body(body.get("model"), _fields(body), messages=messages))
    except BadRequest as exc:
        return _error(exc.status, exc.message)
    submitted = turn_submit_for(request, _think(parsed, body))
    return _ollama_shape(submitted) if isinstance(submitted, HttpResponse) else submitted


def _generate_submit(request: HttpRequest, body: dict[str, Any]) -> Submitted:
    """``raw`` or a ``suffix``: a raw completion; otherwise the prompt as a user message (the model's template)."""
    try:
        fields = _fields(body)
        if body.get("raw") or body.get("suffix"):
            if body.get("suffix"):
                fields["suffix"] = body["suffix"]
            parsed = completion_request_parse(_openai_body(body.get("model"), fields, prompt=body.get("prompt")))
        else:
            system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
            messages = [*system, {"role": "user", "content": body.get("prompt")}]
            parsed = chat_request_parse(_openai_body(body.get("model"), fields, messages=messages))
    except BadRequest as exc:
        return _error(exc.status, exc.message)
    submitted = turn_submit_for(request, _think(parsed, body))
    return _ollama_shape(submitted) if isinstance(submitted, HttpResponse) else submitted


# Answers ----------------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _final(turn: Turn, model_id: str) -> dict[str, Any]:
    stats = turn.stats or {}
    ns = 1_000_000
    return {"model": model_id, "created_at": _now(), "done": True,
            "done_reason": "length" if turn.finish_reason == "length" else "stop",
            "total_duration": int((stats.get("e2e_ms") or 0) * ns), "prompt_eval_count": turn.prompt_tokens or 0,
            "prompt_eval_duration": int((stats.get("prompt_ms") or 0) * ns), "eval_count": turn.output_tokens or 0,
            "eval_duration": int(((stats.get("e2e_ms") or 0) - (stats.get("ttft_ms") or 0)) * ns)}  # fmt: skip


def _tool_calls(turn: Turn) -> list[dict[str, Any]]:
    """The turn's tool calls in Ollama's shape (arguments an object; a malformed one kept as its text)."""
    calls = []
    for call in (turn.stats or {}).get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = function.get("arguments")
        calls.append({"function": {"name": function.get("name"), "arguments": arguments}})
    return calls


def _ended_error(turn: Turn) -> HttpResponse | None:
    refused = ended_error(turn)
    return None if refused is None else _ollama_shape(refused)


async def _answer(
    request: HttpRequest, submit: Callable[..., Submitted], chat: bool
) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return _error(405, "Use POST.")
    submitted = await on_db_thread(_key_view(submit, submits=True))(request)
    return await answered(
        submitted,
        functools.partial(_ndjson, chat),
        functools.partial(_whole, chat),
        refuse=_ended_error,
        content_type="application/x-ndjson",
    )


def _whole(chat: bool, turn: Turn, model_id: str) -> HttpResponse:
    if not chat:
        return JsonResponse({**_final(turn, model_id), "response": turn.reply_text})
    message: dict[str, Any] = {"role": "assistant", "content": turn.reply_text}
    if turn.thinking_text:
        message["thinking"] = turn.thinking_text
    if calls := _tool_calls(turn):
        message["tool_calls"] = calls
    return JsonResponse({**_final(turn, model_id), "message": message})


def _ndjson(
    chat: bool,
    turn: Turn,
    model_id: str,
    include_usage: bool,
    listener: TurnListener,
    pieces: AsyncIterator[Piece],
    first: Piece,
) -> AsyncIterator[bytes]:
    """Ollama's stream: a line per batch of text or thoughts, then the tool calls (Ollama sends them whole), then
    ``done`` with the counts (always: ``include_usage`` is OpenAI's)."""

    def line(payload: dict[str, Any]) -> bytes:
        return json.dumps(payload, ensure_ascii=False).encode() + b"\n"

    def text_line(text: str, **more: Any) -> bytes:
        part: dict[str, Any] = (
            {"message": {"role": "assistant", "content": text, **more}} if chat else {"response": text}
        )
        return line({"model": model_id, "created_at": _now(), **part, "done": False})

    def end(ended: Turn) -> list[bytes]:
        if ended.status in ENDED_STATUSES:
            return [line({"error": ended.error or f"The reply was {ended.status}."})]
        calls = [text_line("", tool_calls=found)] if chat and (found := _tool_calls(ended)) else []
        final = _final(ended, model_id)
        done = {**final, "message": {"role": "assistant", "content": ""}} if chat else {**final, "response": ""}
        return [*calls, line(done)]

    def thought(text: str) -> bytes:  # Ollama streams thoughts as the message's thinking
        return text_line("", thinking=text)

    return text_stream(listener, first, pieces, text_line, end, thinking=thought if chat else None)


async def chat(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    return await _answer(request, _chat_submit, chat=True)


async def generate(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    return await _answer(request, _generate_submit, chat=False)


# The catalogue and embeddings -------------------------------------------------------------------------------


def _model_entry(entry: CatalogueEntry) -> dict[str, Any]:
    return {"name": entry.id, "model": entry.id, "modified_at": entry.rig.created_at.isoformat(), "size": 0,
            "digest": "", "details": {"format": "gguf", "family": "", "parameter_size": "",
                                      "quantization_level": ""}}  # fmt: skip


def _tags(request: HttpRequest, body: dict[str, Any]) -> HttpResponse:
    return JsonResponse({"models": [_model_entry(entry) for entry in model_catalogue()]})


def _ps(request: HttpRequest, body: dict[str, Any]) -> HttpResponse:
    """The models the enabled rigs hold in memory now (``catalogue_loaded``)."""
    catalogue = model_catalogue()
    held = catalogue_loaded(catalogue)
    models = [{**_model_entry(entry), "size_vram": 0, "expires_at": "0001-01-01T00:00:00Z",
               "context_length": entry.context_length} for entry in catalogue if entry.id in held]  # fmt: skip
    return JsonResponse({"models": models})


def _show(request: HttpRequest, body: dict[str, Any]) -> HttpResponse:
    """The model's context as ``model_info["general.context_length"]`` where known, and (RigDash's addition, as on
    ``/v1/models``) where that figure comes from."""
    entry = model_resolve(str(body.get("model") or body.get("name") or ""), model_catalogue())
    if entry is None:
        return _error(404, f"model '{body.get('model')}' not found")
    info = {"general.context_length": entry.context_length} if entry.context_length else {}
    return JsonResponse({**_model_entry(entry), "modelfile": "", "parameters": "", "template": "",
                         "model_info": info, "capabilities": ["completion", "tools"],
                         "context_length_source": entry.context_source if info else None})  # fmt: skip


def _embed_submit(request: HttpRequest, body: dict[str, Any]) -> Any:
    """Ollama's embed request as an OpenAI embeddings turn (``input`` and ``dimensions`` mean the same)."""
    entry = model_resolve(body["model"], model_catalogue()) if isinstance(body.get("model"), str) else None
    if entry is None:
        return _error(404, f"model '{body.get('model')}' not found")
    if not isinstance(body.get("input"), str | list) or not body.get("input"):
        return _error(400, "input must be a string or a non-empty list of strings")
    asked = {name: body[name] for name in ("input", "dimensions") if name in body}
    submitted = embeddings_submit(request, entry, asked)
    return _ollama_shape(submitted) if isinstance(submitted, HttpResponse) else submitted


async def embed(request: HttpRequest) -> HttpResponse:
    """Ollama's /api/embed: a turn like /v1/embeddings (inference/views/openai_embeddings.py), answered in Ollama's
    shape."""
    if request.method != "POST":
        return _error(405, "Use POST.")
    answered = await whole_answer(request, _key_view(_embed_submit), _ollama_shape)
    if isinstance(answered, HttpResponse):
        return answered
    answer, model_id = answered
    vectors = [item.get("embedding") for item in answer.get("data") or [] if isinstance(item, dict)]
    tokens = (answer.get("usage") or {}).get("prompt_tokens") or 0
    return JsonResponse({"model": model_id, "embeddings": vectors, "prompt_eval_count": tokens})


def _embeddings_submit(request: HttpRequest, body: dict[str, Any]) -> Any:
    """Ollama's older ``/api/embeddings``: one ``prompt``'s vector. An empty prompt is answered with no vector and
    no turn (Ollama's loads the model for it; RigDash loads models in their turn)."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _error(400, "model is required")
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        return _error(400, "prompt must be a string")
    entry = model_resolve(body["model"], model_catalogue())
    if entry is None:
        return _error(404, f"model '{body['model']}' not found")
    if not prompt:
        return JsonResponse({"embedding": []})
    submitted = embeddings_submit(request, entry, {"input": prompt})
    return _ollama_shape(submitted) if isinstance(submitted, HttpResponse) else submitted


async def embeddings(request: HttpRequest) -> HttpResponse:
    """Ollama's older /api/embeddings (still served by Ollama, and used by older clients): a turn like /api/embed,
    answered as ``{"embedding": [...]}``."""
    if request.method != "POST":
        return _error(405, "Use POST.")
    answered = await whole_answer(request, _key_view(_embeddings_submit), _ollama_shape)
    if isinstance(answered, HttpResponse):
        return answered
    answer, _ = answered
    vectors = [item.get("embedding") for item in answer.get("data") or [] if isinstance(item, dict)]
    return JsonResponse({"embedding": vectors[0] if vectors else []})


def _sync(view: Callable[[HttpRequest, dict[str, Any]], HttpResponse], method: str) -> Callable[..., Any]:
    async def wrapped(request: HttpRequest) -> HttpResponse:
        if request.method != method:
            return _error(405, f"Use {method}.")
        response: HttpResponse = await on_db_thread(_key_view(view))(request)
        return response

    wrapped.csrf_exempt = True  # type: ignore[attr-defined]
    return wrapped


MODELS_MANAGED = (
    "RigDash does not pull, push, create, copy or delete models through Ollama's API: staff manage a rig's models on "
    "its models page (/rigs/<id>/models/), where each action is audited."
)


def _models_managed(request: HttpRequest, body: dict[str, Any]) -> HttpResponse:
    """Ollama's model management routes: a rig's models are its staff's to change, on the rig's models page, where
    each action is audited (docs/admin.md); a client of the API gets that answer rather than a 404."""
    return _error(501, MODELS_MANAGED)


async def version(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"version": VERSION})


tags = _sync(_tags, "GET")
ps = _sync(_ps, "GET")
show = _sync(_show, "POST")
pull, push, create, copy = (_sync(_models_managed, "POST") for _ in range(4))
delete = _sync(_models_managed, "DELETE")
for _view in (chat, generate, embed, embeddings):
    _view.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie
