"""llama-server's own API through RigDash: ``POST /completion`` (and ``/completions``) and ``/infill`` as turns, as
``/v1/completions`` is (quotas, fair queue, board, usage); ``/tokenize`` and ``/detokenize`` answered by the rig's
server, counted in the minute's rate limits as the token counts are (inference/turns/counting.py).

These are what llama.cpp's own clients speak: llama.vim and llama.vscode ask ``/infill`` for code completion,
SillyTavern's llama.cpp mode asks ``/completion`` and ``/tokenize``. A request is read as llama-server reads it
(tools/server/server-context.cpp, ``post_completions``, ``post_infill``, ``post_tokenize``), and answered in its
shapes (server-task.cpp, ``to_json_non_oaicompat``): a stream of ``data:`` events, each ``content`` and ``stop``, the
last one with the timings and no ``[DONE]``; errors as ``{"error": {"code", "message", "type"}}``. RigDash owns the
model, the stream flag, the reply's cap (``n_predict``) and ``response_fields`` (applied to its own answer: the
server's stream is read by the fields it would leave out); every other field goes to the server as it came
(docs/openai.md, "llama-server's own API"). Only rigs whose server has this API take these requests (llama-server).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from inference.backends import capabilities
from inference.backends.base import BackendError, BackendNotSupported, BackendRefused, user_message
from inference.board import apikeys
from inference.errors import InvalidInput
from inference.models import Turn
from inference.queue.ratelimits import RateLimited
from inference.turns.counting import api_count_admit, api_tokens_convert
from inference.turns.params import params_validate
from inference.views.openai import CatalogueEntry, error_words, key_authenticated, model_catalogue, model_resolve
from inference.views.openai_chat import (
    ENDED_STATUSES,
    Piece,
    Submitted,
    answer_confirmed,
    answered,
    ended_error,
    sse,
    text_stream,
    turn_submit_for,
)
from inference.views.openai_request import DROPPED, BadRequest, ChatCompletionRequest, body_read
from inference.views.turn_listener import TurnListener, on_db_thread

# Read by RigDash; the rest of a body goes to the rig's server as it came (inference/backends/llamacpp/chat.py sets
# its own model, stream, timings and cap), but ``DROPPED`` (the slot: the fair queue's).
OWNED = frozenset({"model", "stream", "n_predict", "max_tokens", "response_fields", "timings_per_token"}) | DROPPED
# llama-server's error types by status (tools/server/server-common.cpp, ``format_error_response``).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}  # fmt: skip


def native_error(status: int, message: str) -> JsonResponse:
    """llama-server's error body: ``{"error": {"code": <status>, "message", "type"}}``."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return JsonResponse({"error": {"code": status, "message": message, "type": kind}}, status=status)


def native_shape(response: HttpResponse) -> HttpResponse:
    """An OpenAI-shaped error answer in llama-server's shape, same status (and ``Retry-After``)."""
    if (message := error_words(response)) is None:
        return response
    shaped = native_error(response.status_code, message)
    for header in ("Retry-After", "WWW-Authenticate"):
        if response.has_header(header):
            shaped[header] = response[header]
    return shaped


def native_authenticated(request: HttpRequest, *, remembered: bool = False) -> HttpResponse | None:
    """The key as llama-server's ``--api-key`` takes it (``Authorization: Bearer``, or ``X-Api-Key``), as
    ``request.api_key``; else the 401 in llama-server's shape."""
    return key_authenticated(request, _key_refused, remembered=remembered)


def _key_refused(exc: apikeys.KeyRejected) -> HttpResponse:
    return native_error(401, exc.message)


# Reading a request ------------------------------------------------------------------------------------------------


def _text(body: dict[str, Any], name: str, *, required: bool) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f'"{name}" is required and must be a string' if required else f'"{name}" must be a string')
    return value


def _cap(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reply's cap as the turn's params, and what the server gets of the client's: ``n_predict`` (or
    ``max_tokens``, which llama-server reads in its place) -1 or left out is RigDash's cap; 0 reads the prompt only
    (the turn's cap is 1, the server is sent 0)."""
    name = "n_predict" if body.get("n_predict") is not None else "max_tokens"
    value = body.get(name)
    if value is None or (value == -1 and not isinstance(value, bool)):
        return {}, {}
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f'"{name}" must be -1 (no limit of the client\'s) or a whole number of tokens from 0')
    if value == 0:
        return {"max_tokens": 1}, {"n_predict": 0}
    try:
        return params_validate({"max_tokens": value}), {}
    except InvalidInput as exc:
        raise BadRequest(exc.message.replace("max_tokens", name, 1)) from exc


def _response_fields(body: dict[str, Any]) -> list[str] | None:
    fields = body.get("response_fields")
    if fields is None:
        return None
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise BadRequest('"response_fields" must be an array of strings')
    return fields


def _parsed(body: dict[str, Any], route: str, model_id: str) -> ChatCompletionRequest:
    """A ``/completion`` or ``/infill`` body as a turn's request: its text (the prompt; for an infill, prefix, prompt
    and suffix, which the board shows and the quota estimates), cap, and the rest passed on."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest('"stream" must be a boolean')
    cap, sent = _cap(body)
    if route == "completion":
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest('"prompt" must be a non-empty string: RigDash runs one prompt, as text, per request')
        text, taken = prompt, OWNED | {"prompt"}
    else:
        # As llama-server's /infill checks them; ``input_extra`` (files for context) goes to it as it came.
        prefix = _text(body, "input_prefix", required=True)
        suffix = _text(body, "input_suffix", required=True)
        text, taken = prefix + _text(body, "prompt", required=False) + suffix, OWNED
        if not text.strip():
            extra = body.get("input_extra")
            text = f"(context only: {len(extra) if isinstance(extra, list) else 0} extra chunks)"
    limit = settings.RIGDASH.max_message_chars
    if len(text) > limit:
        raise BadRequest(f"The prompt is longer than {limit} characters (RIGDASH_MAX_MESSAGE_CHARS).")
    passthrough = {name: value for name, value in body.items() if name not in taken and value is not None}
    params = {**cap, "raw_prompt": True, "native": route, "passthrough": {**passthrough, **sent}}
    return ChatCompletionRequest(model_id, [], text, bool(stream), False, params)


def model_entry(body: dict[str, Any]) -> CatalogueEntry:
    """The model the request names, or where it names none (llama-server serves one model and reads no ``model``),
    the one model of the default rig; BadRequest (404 for a model not served) otherwise."""
    model = body.get("model")
    catalogue = model_catalogue()
    if model is not None:
        if not isinstance(model, str) or not model:
            raise BadRequest('"model" must be a non-empty string')
        if (entry := model_resolve(model, catalogue)) is None:
            raise BadRequest(f"The model '{model}' is not served here (GET /v1/models lists them).", status=404)
        return entry
    default = [entry for entry in catalogue if entry.rig.is_default and not entry.id.startswith(f"{entry.rig.name}/")]
    if len(default) != 1:
        ids = ", ".join(sorted({entry.id for entry in catalogue})[:20]) or "none"
        raise BadRequest(f'"model" is required here: the default rig does not serve exactly one model (served: {ids}).')
    return default[0]


def _native_rig(entry: CatalogueEntry) -> None:
    if not capabilities(entry.rig.kind).native_completions:
        raise BadRequest(
            f"Rig {entry.rig.name}'s server ({entry.rig.kind}) has no llama-server API: ask /v1/completions or "
            "/v1/chat/completions for this model.",
            status=501,
        )


# Completions ------------------------------------------------------------------------------------------------------


def _submit(request: HttpRequest, route: str) -> tuple[Submitted, list[str] | None]:
    if (refused := native_authenticated(request, remembered=True)) is not None:
        return refused, None
    try:
        body = body_read(request.body)
        entry = model_entry(body)
        _native_rig(entry)
        fields = _response_fields(body)
        parsed = _parsed(body, route, entry.id)
    except BadRequest as exc:
        return answer_confirmed(request, native_error(exc.status, exc.message), _key_refused), None
    submitted = turn_submit_for(request, parsed)
    return (native_shape(submitted) if isinstance(submitted, HttpResponse) else submitted), fields


async def _completion_answer(request: HttpRequest, route: str) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return native_error(405, "Use POST.")
    submitted, fields = await on_db_thread(_submit)(request, route)

    def whole(turn: Turn, model_id: str) -> HttpResponse:
        return JsonResponse(_selected(_final(turn, model_id, turn.reply_text), fields))

    def stream(
        turn: Turn, model_id: str, _usage: bool, listener: TurnListener, pieces: AsyncIterator[Piece], first: Piece
    ) -> AsyncIterator[bytes]:
        return _stream(turn, model_id, fields, listener, pieces, first)

    return await answered(submitted, stream, whole, refuse=_refused)


async def completion(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """``POST /completion`` (``/completions``): a prompt completed with no chat template."""
    return await _completion_answer(request, "completion")


async def infill(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """``POST /infill``: code completion between ``input_prefix`` and ``input_suffix``, with ``input_extra`` files
    for context; a model without fill-in-the-middle tokens is refused by the server (501, its words)."""
    return await _completion_answer(request, "infill")


completion.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie
infill.csrf_exempt = True  # type: ignore[attr-defined]


def _refused(turn: Turn) -> HttpResponse | None:
    refused = ended_error(turn)
    return None if refused is None else native_shape(refused)


def _stop_type(turn: Turn, ending: dict[str, Any]) -> str:
    if isinstance(ending.get("stop_type"), str):
        return str(ending["stop_type"])
    if turn.finish_reason == "length":
        return "limit"
    return "word" if (turn.stats or {}).get("stop_sequence") else "eos"


def _final(turn: Turn, model_id: str, content: str) -> dict[str, Any]:
    """llama-server's last result: the server's own figures where it sent them (``native_ending``: the tokens in
    its cache, whether the prompt was cut), the timings as it sent them, RigDash's counts otherwise. The token ids
    (``tokens``), the slot, the prompt and the generation settings are not kept, and not given."""
    stats = turn.stats or {}
    found = stats.get("native_ending")
    ending: dict[str, Any] = found if isinstance(found, dict) else {}
    word = stats.get("stop_sequence")
    final: dict[str, Any] = {
        "index": 0,
        "content": content,
        "tokens": [],
        "stop": True,
        "model": model_id,
        "tokens_predicted": turn.output_tokens or 0,
        "tokens_evaluated": turn.prompt_tokens or 0,
        "has_new_line": "\n" in turn.reply_text,
        "stopping_word": word if isinstance(word, str) else "",
        **ending,
        "stop_type": _stop_type(turn, ending),
    }
    if isinstance(timings := stats.get("backend_timings"), dict):
        final["timings"] = timings
    return final


def _selected(answer: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """``response_fields`` as llama-server applies them (server-common.cpp ``json_get_nested_values``): each path
    (``timings/prompt_n``) found in the answer, under the path as its name; the whole answer where none are asked."""
    if not fields:
        return answer
    chosen: dict[str, Any] = {}
    for path in fields:
        current: Any = answer
        for key in path.split("/"):
            if not isinstance(current, dict) or key not in current:
                break
            current = current[key]
        else:
            chosen[path] = current
    return chosen


def _stream(
    turn: Turn,
    model_id: str,
    fields: list[str] | None,
    listener: TurnListener,
    pieces: AsyncIterator[Piece],
    first: Piece,
) -> AsyncIterator[bytes]:
    """The reply as llama-server streams it: ``content`` pieces with ``stop`` false, then the last result (its
    ``response_fields`` applied) or an error event; no ``[DONE]``. Closing it early cancels the turn."""

    def end(ended: Turn) -> list[bytes]:
        if ended.status in ENDED_STATUSES:
            status = ENDED_STATUSES[ended.status]
            error = {"code": status, "message": ended.error or f"The reply was {ended.status}.",
                     "type": ERROR_TYPES.get(status, "server_error")}  # fmt: skip
            return [sse({"error": error})]
        return [sse(_selected(_final(ended, model_id, ""), fields))]

    def text(piece: str) -> bytes:
        return sse({"index": 0, "content": piece, "tokens": [], "stop": False})

    return text_stream(listener, first, pieces, text, end)


# Tokens -----------------------------------------------------------------------------------------------------------


def _convert_checked(request: HttpRequest) -> tuple[CatalogueEntry, dict[str, Any], set[str] | None] | HttpResponse:
    if (refused := native_authenticated(request)) is not None:
        return refused
    try:
        body = body_read(request.body)
        entry = model_entry(body)
    except BadRequest as exc:
        return native_error(exc.status, exc.message)
    try:
        kept = api_count_admit(key=request.api_key, rig=entry.rig, model=entry.model)  # type: ignore[attr-defined]
    except RateLimited as exc:
        limited = native_error(429, exc.message)
        limited["Retry-After"] = str(exc.retry_after_s)
        return limited
    except InvalidInput as exc:
        return native_error(409, exc.message)
    return entry, {**body, "model": entry.model}, kept


async def _convert(request: HttpRequest, way: str) -> HttpResponse:
    """``way`` "tokenize" or "detokenize", asked of the rig's server on the loop (an unreachable rig holds no
    database thread); its answer as it sent it, its refusal with its status and words."""
    if request.method != "POST":
        return native_error(405, "Use POST.")
    checked = await on_db_thread(_convert_checked)(request)
    if isinstance(checked, HttpResponse):
        return checked
    entry, body, kept = checked
    rig = entry.rig
    try:
        answer = await api_tokens_convert(rig=rig, model=entry.model, body=body, kept=kept, way=way)
    except InvalidInput as exc:  # the server does not hold the model now
        return native_error(409, exc.message)
    except BackendRefused as exc:
        return native_error(exc.status, exc.words)
    except BackendNotSupported:
        return native_error(501, f"Rig {rig.name}'s server ({rig.kind}) has no /{way}.")
    except BackendError as exc:
        return native_error(503, user_message(rig.name, exc))
    return HttpResponse(json.dumps(answer, ensure_ascii=False), content_type="application/json")


async def tokenize(request: HttpRequest) -> HttpResponse:
    """``POST /tokenize``: ``content`` as the model's token ids (``with_pieces``: with their text)."""
    return await _convert(request, "tokenize")


async def detokenize(request: HttpRequest) -> HttpResponse:
    """``POST /detokenize``: ``tokens`` as text."""
    return await _convert(request, "detokenize")


tokenize.csrf_exempt = True  # type: ignore[attr-defined]
detokenize.csrf_exempt = True  # type: ignore[attr-defined]
