"""``POST /v1/chat/completions``: one request is one turn (inference/turns/api.py), answered whole or streamed as
OpenAI's server-sent events as the channel layer brings the turn's text (inference/views/turn_listener.py).

https://platform.openai.com/docs/api-reference/chat (``chat.completion``, ``chat.completion.chunk``, ``usage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils import timezone

from inference.backends.openai.stream import tool_calls_merged
from inference.board import apikeys
from inference.errors import InvalidInput, QueueUnavailable, QuotaExceeded
from inference.models import ApiKey, Turn
from inference.queue.early import EarlyStart
from inference.turns.api import api_early_offer, api_early_withdraw, api_turn_submit, api_turn_texts_forget
from inference.turns.lifecycle import turn_cancel
from inference.views.openai import BadRequest, chat_request_parse, key_refused, model_catalogue, model_resolve
from inference.views.openai import openai_error as error
from inference.views.openai_request import ChatCompletionRequest
from inference.views.turn_listener import Extras, TurnListener, on_db_thread, reply_pieces

ENDED_STATUSES: dict[str, int] = {"failed": 502, "interrupted": 502, "cancelled": 409}
# A failed turn whose cause is the request's to change, not the rig's fault: its status, and its kind as the code.
FAILED_BY_REQUEST: dict[str, int] = {"model_not_loaded": 400}
# Finish reasons passed to the client as the backend said them; any other is "stop".
FINISH_REASONS = frozenset({"length", "tool_calls", "content_filter", "function_call"})
USER_AGENT_CHARS = 200


def usage_of(turn: Turn) -> dict[str, Any]:
    """OpenAI's usage, as llama-server gives it: the whole prompt, the reply, and the prompt's tokens read from the
    server's cache (``prompt_tokens_details``) where the backend said how many."""
    prompt, completion = turn.prompt_tokens or 0, turn.output_tokens or 0
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}  # fmt: skip
    cached = (turn.stats or {}).get("cached_tokens")
    if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def finish_reason_of(turn: Turn) -> str:
    return turn.finish_reason if turn.finish_reason in FINISH_REASONS else "stop"


def ended_error(turn: Turn) -> HttpResponse | None:
    """The error answer of a turn that did not finish: the backend's own status and words where it refused the
    request (a field it does not take), a 4xx with its kind as the code where another model must be asked for (one
    the rig's server will not load on request), else 502 (failed, interrupted) or 409 (cancelled)."""
    if turn.status not in ENDED_STATUSES:
        return None
    refused = (turn.stats or {}).get("backend_refused")
    if isinstance(refused, dict) and isinstance(refused.get("status"), int):
        return error(refused["status"], str(refused.get("message") or turn.error), code="backend_refused")
    if turn.status == Turn.Status.FAILED and (status := FAILED_BY_REQUEST.get(turn.finish_reason)) is not None:
        return error(status, turn.error, code=turn.finish_reason, param="model")
    return error(ENDED_STATUSES[turn.status], turn.error or f"The reply was {turn.status}.", code=turn.status,
                 kind="server_error")  # fmt: skip


def _submit(request: HttpRequest) -> tuple[Turn, str, bool, bool] | HttpResponse:
    """The request's turn (model id, stream, include_usage), or the error response that refused it."""
    try:
        parsed = chat_request_parse(request.body)
    except BadRequest as exc:
        return error(exc.status, exc.message, param=exc.param, code=exc.error_code)
    return turn_submit_for(request, parsed)


def turn_submit_for(request: HttpRequest, parsed: ChatCompletionRequest) -> tuple[Turn, str, bool, bool] | HttpResponse:
    """Submit a parsed request as a turn of the key's owner: its model resolved, the quotas' refusals answered. A key
    from memory (``ApiKey.unconfirmed``) first sends the request's early request, to the rig this process's last
    catalogue names (``GUESS_WITHIN_S``), then is confirmed by its row; the model is resolved anew, and the submit
    uses the early request only if it asked for what the turn does."""
    key, client = request.api_key, request.headers.get("User-Agent", "")[:USER_AGENT_CHARS]  # type: ignore[attr-defined]
    sent = _early_guess(key, parsed, client) if key.unconfirmed else None
    try:
        request.api_key = key = apikeys.api_key_confirm(key)  # type: ignore[attr-defined]
        entry = model_resolve(parsed.model, model_catalogue())
    except apikeys.KeyRejected as exc:
        api_early_withdraw(sent, key=key)
        return key_refused(exc)
    except BaseException:
        api_early_withdraw(sent, key=key)
        raise
    if entry is None:
        api_early_withdraw(sent, key=key)
        return error(404, f"The model '{parsed.model}' does not exist", code="model_not_found", param="model")
    turn = submitted_or_refused(
        request, lambda key, client: api_turn_submit(
            key=key, rig=entry.rig, model=entry.model, history=parsed.history, text=parsed.user_text,
            params=parsed.params, placed=entry.placed, client=client, early_sent=sent,
        ),
    )  # fmt: skip
    return turn if isinstance(turn, HttpResponse) else (turn, entry.id, parsed.stream, parsed.include_usage)


# An early request guesses its rig from this process's last catalogue if it is this recent: the model lists it reads
# are kept a minute (inference/live/served.py).
GUESS_WITHIN_S = 60.0


def _early_guess(key: ApiKey, parsed: ChatCompletionRequest, client: str) -> EarlyStart | None:
    """The early request of a request whose key came from memory, sent before any database read."""
    entry = model_resolve(parsed.model, model_catalogue(within_s=GUESS_WITHIN_S))
    if entry is None:
        return None
    return api_early_offer(key=key, rig=entry.rig, model=entry.model, history=parsed.history, text=parsed.user_text,
                           params=parsed.params, client=client)  # fmt: skip


def submitted_or_refused(request: HttpRequest, submit: Callable[[ApiKey, str], Turn]) -> Turn | HttpResponse:
    """``submit(key, client)`` for the request's key and user agent: its turn, or OpenAI's answer to the refusal (a
    quota's 429 with ``Retry-After``, a bad input's 400, the task queue's 503)."""
    key = request.api_key  # type: ignore[attr-defined]
    assert isinstance(key, ApiKey)
    try:
        return submit(key, request.headers.get("User-Agent", "")[:USER_AGENT_CHARS])
    except QuotaExceeded as exc:
        response = error(429, exc.message, code="rate_limit_exceeded", kind=getattr(exc, "kind", "requests"))
        if exc.resets_at is not None:
            response["Retry-After"] = str(max(1, math.ceil((exc.resets_at - timezone.now()).total_seconds())))
        return response
    except InvalidInput as exc:
        return error(400, exc.message, code=exc.code)
    except QueueUnavailable as exc:
        return error(503, exc.message, code=exc.code, kind="server_error")


async def _cancel_if_running(turn_id: int) -> None:
    """The client went away before the end: cancel the turn, which frees the backend's slot."""

    def cancel() -> None:
        latest = Turn.objects.filter(pk=turn_id, status__in=Turn.ACTIVE).select_related("session").first()
        if latest is not None:
            with contextlib.suppress(InvalidInput):  # it ended meanwhile
                turn_cancel(turn=latest)

    await on_db_thread(cancel)()


async def wait_for_end(turn: Turn) -> Turn:
    """The turn's ended row, told by its end event (``TurnListener``); a client that goes away cancels the turn."""
    listener = listener_for(turn)
    ended: Turn | None = None
    try:
        await listener.join()
        async for piece in reply_pieces(listener):
            if isinstance(piece, Turn):
                ended = piece
        assert ended is not None
        return ended
    finally:
        await asyncio.shield(listener_finish(listener, ended is None))


def listener_for(turn: Turn) -> TurnListener:
    """The listener of a just-submitted turn (its session is the one the submit made, held on the turn)."""
    return TurnListener(session_id=turn.session_id, turn_id=turn.pk, forget=turn.session.hidden)


async def listener_finish(listener: TurnListener, cancel: bool) -> None:
    """The view is done with the turn: it leaves the group, cancels a turn whose client went away before its end,
    and, for a key that stores nothing, wipes the ended turn's texts, which the view has read by now (the answer is
    built, or the last event sent). A turn not ended yet is wiped by the periodic pass (``api_texts_forget_ended``)."""
    await listener.leave()
    if cancel:
        await _cancel_if_running(listener.turn_id)
    if listener.forget:
        await on_db_thread(api_turn_texts_forget)(listener.turn_id)


def _message(turn: Turn) -> dict[str, Any]:
    """The reply as OpenAI's assistant message: its text, a reasoning model's thoughts, the tool calls it made."""
    calls = (turn.stats or {}).get("tool_calls")
    message: dict[str, Any] = {"role": "assistant", "content": turn.reply_text or (None if calls else "")}
    if turn.thinking_text:
        message["reasoning_content"] = turn.thinking_text
    if calls:
        message["tool_calls"] = calls
    return message


async def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Async, so that waiting for a reply holds no thread; the key check, the parsing and the submit run in one
    hop to a database thread that keeps its connection (``on_db_thread``), and the reply is pushed by the channel
    layer (``TurnListener``)."""
    if request.method != "POST":
        return error(405, "Use POST.", code="method_not_allowed")
    submitted = await on_db_thread(authenticated_submit)(request)
    return await answered(submitted, _stream, _whole)


def _whole(turn: Turn, model_id: str) -> HttpResponse:
    logprobs = (turn.stats or {}).get("logprobs")
    return JsonResponse({
        "id": f"chatcmpl-rd{turn.pk}", "object": "chat.completion", "created": int(turn.created_at.timestamp()),
        "model": model_id,
        "choices": [{"index": 0, "message": _message(turn), "finish_reason": finish_reason_of(turn),
                     "logprobs": {"content": logprobs} if logprobs else None}],
        "usage": usage_of(turn),
    })  # fmt: skip


chat_completions.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie


Submitted = tuple[Turn, str, bool, bool] | HttpResponse  # the turn, model id, stream, include_usage; or a refusal


def authenticated_submit(request: HttpRequest, submit: Callable[[HttpRequest], Submitted] | None = None) -> Submitted:
    """The key check, then ``submit`` (a chat completion's, by default; any submits through ``turn_submit_for``): one
    hop to a database thread."""
    return key_checked(request, submit or _submit, remembered=True)


T = TypeVar("T")


def key_checked(
    request: HttpRequest, then: Callable[[HttpRequest], T], *, remembered: bool = False
) -> T | HttpResponse:
    """``then(request)`` once the request's key is checked (``request.api_key``), else OpenAI's 401. ``remembered``:
    the key may come from this process's memory (``apikeys.api_key_authenticate``), for a ``then`` that submits
    through ``turn_submit_for``, which confirms it before storing anything; an answer ``then`` gives without
    confirming it is given only once the key's row is read."""
    try:
        request.api_key = apikeys.api_key_authenticate(request.headers.get("Authorization", ""), remembered=remembered)  # type: ignore[attr-defined]
    except apikeys.KeyRejected as exc:
        return key_refused(exc)
    return answer_confirmed(request, then(request), key_refused)


def answer_confirmed(
    request: HttpRequest, answer: T, refused: Callable[[apikeys.KeyRejected], HttpResponse]
) -> T | HttpResponse:
    """``answer``, once the request's key is confirmed by its row if it came from memory (a refusal answered before
    the submit confirmed it: a body or model refused); else ``refused(why)``."""
    try:
        apikeys.api_key_confirm(request.api_key)  # type: ignore[attr-defined]  # a no-op for a key read already
    except apikeys.KeyRejected as exc:
        return refused(exc)
    return answer


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


Piece = str | Extras | Turn


Body = Callable[[TurnListener, AsyncIterator[Piece], Piece], AsyncIterator[bytes]]


StreamBody = Callable[[Turn, str, bool, TurnListener, AsyncIterator[Piece], Piece], AsyncIterator[bytes]]


async def answered(
    submitted: Submitted,
    stream_body: StreamBody,
    whole: Callable[[Turn, str], HttpResponse],
    *,
    refuse: Callable[[Turn], HttpResponse | None] = ended_error,
    content_type: str = "text/event-stream",
) -> HttpResponse | StreamingHttpResponse:
    """The answer to a submitted request (any API's): its refusal; or its stream (``stream_body(turn, model id,
    include_usage, ...)`` once the first piece is in: ``stream_response``); or, once the turn has ended, the failure
    ``refuse`` makes of it, else ``whole(turn, model id)``."""
    if isinstance(submitted, HttpResponse):
        return submitted
    turn, model_id, stream, include_usage = submitted
    if stream:
        return await stream_response(
            turn,
            functools.partial(stream_body, turn, model_id, include_usage),
            refuse=refuse,
            content_type=content_type,
        )
    ended = await wait_for_end(turn)
    if (refused := refuse(ended)) is not None:
        return refused
    return whole(ended, model_id)


async def stream_response(
    turn: Turn,
    body: Body,
    *,
    refuse: Callable[[Turn], HttpResponse | None] = ended_error,
    content_type: str = "text/event-stream",
) -> HttpResponse | StreamingHttpResponse:
    """Wait for the reply's first piece before answering, so that a request the backend refused (or a turn that
    failed before its first token) gets its status and words as an error, not a 200 stream that ends in one."""
    listener = listener_for(turn)
    pieces: AsyncIterator[Piece] | None = None
    try:
        await listener.join()
        pieces = reply_pieces(listener)
        first = await anext(pieces)
    except BaseException:  # the client went away (the view is cancelled) or the layer failed
        await asyncio.shield(listener_finish(listener, True))
        raise
    if isinstance(first, Turn) and (refused := refuse(first)) is not None:
        await listener_finish(listener, False)
        return refused
    response = StreamingHttpResponse(body(listener, pieces, first), content_type=content_type)
    response["Cache-Control"] = "no-cache"
    return response


async def _stream(
    turn: Turn, model_id: str, include_usage: bool, listener: TurnListener, pieces: AsyncIterator[Piece], first: Piece
) -> AsyncIterator[bytes]:
    """The turn's reply as ``chat.completion.chunk`` events, as the channel layer brings it: text, a reasoning model's
    thoughts (``reasoning_content``), tool-call deltas and logprobs as the backend streamed them. Closing the
    iterator before the end (the client went away) cancels the turn."""
    base = {"id": f"chatcmpl-rd{turn.pk}", "object": "chat.completion.chunk",
            "created": int(turn.created_at.timestamp()), "model": model_id}  # fmt: skip
    # A text chunk's JSON around its text, serialised once here rather than once per chunk.
    head = "data: " + json.dumps(base, ensure_ascii=False, separators=(",", ":"))[:-1]
    head += ',"choices":[{"index":0,"delta":{"content":'
    tail = '},"finish_reason":null}]}\n\n'

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs:
            choice["logprobs"] = {"content": logprobs}
        return sse({**base, "choices": [choice]})

    ended: Turn | None = None
    calls_sent: list[dict[str, Any]] = []
    try:
        yield chunk({"role": "assistant", "content": ""})
        async for piece in chained(first, pieces):
            if isinstance(piece, Turn):
                ended = piece
            elif isinstance(piece, str):
                yield (head + json.dumps(piece, ensure_ascii=False) + tail).encode()
            elif thought := piece.get("thinking"):  # as llama-server streams a reasoning model's thoughts
                yield chunk({"reasoning_content": thought})
            else:
                calls = piece.get("tool_calls") or []
                calls_sent.extend(calls)
                yield chunk({"tool_calls": calls} if calls else {}, logprobs=piece.get("logprobs"))
        assert ended is not None
        if ended.status in ENDED_STATUSES:
            yield sse({"error": {"message": ended.error or f"The reply was {ended.status}.",
                                  "type": "server_error", "param": None, "code": ended.status}})  # fmt: skip
        else:
            if missed := tool_call_rest(calls_sent, (ended.stats or {}).get("tool_calls") or []):
                yield chunk({"tool_calls": missed})
            yield chunk({}, finish_reason_of(ended))
            if include_usage:
                yield sse({**base, "choices": [], "usage": usage_of(ended)})
        yield sse("[DONE]")
    finally:
        await asyncio.shield(listener_finish(listener, ended is None))


async def chained(first: Piece, rest: AsyncIterator[Piece]) -> AsyncIterator[Piece]:
    yield first
    if not isinstance(first, Turn):
        async for piece in rest:
            yield piece


async def text_stream(
    listener: TurnListener,
    first: Piece,
    rest: AsyncIterator[Piece],
    text: Callable[[str], bytes],
    end: Callable[[Turn], list[bytes]],
    thinking: Callable[[str], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """A reply as an API's events of its text (and, with ``thinking``, of its thoughts), in order, then what ``end``
    makes of the ended turn; closing it before the end (the client went away) cancels the turn."""
    ended: Turn | None = None
    try:
        async for piece in chained(first, rest):
            if isinstance(piece, Turn):
                ended = piece
            elif isinstance(piece, str):
                yield text(piece)
            elif thinking is not None and (thought := piece.get("thinking")):
                yield thinking(thought)
        assert ended is not None
        for event in end(ended):
            yield event
    finally:
        await asyncio.shield(listener_finish(listener, ended is None))


class PieceWriter(Protocol):
    """An API's events for a reply's pieces (Anthropic's content blocks, the Responses API's output items)."""

    def text(self, text: str) -> list[bytes]: ...

    def thinking(self, text: str) -> list[bytes]: ...

    def tool(self, call: dict[str, Any]) -> list[bytes]: ...


async def written(
    first: Piece, rest: AsyncIterator[Piece], writer: PieceWriter, calls_sent: list[dict[str, Any]]
) -> AsyncIterator[bytes | Turn]:
    """Each piece of a reply as ``writer``'s events, in order, then the ended turn; the tool-call deltas written are
    kept in ``calls_sent`` (``tool_call_rest`` completes them from the ended turn)."""
    async for piece in chained(first, rest):
        if isinstance(piece, Turn):
            yield piece
            return
        if isinstance(piece, str):
            events = writer.text(piece)
        elif thought := piece.get("thinking"):
            events = writer.thinking(thought)
        else:
            calls = piece.get("tool_calls") or []
            calls_sent.extend(calls)
            events = [event for call in calls for event in writer.tool(call)]
        for event in events:
            yield event


def tool_call_rest(sent: list[dict[str, Any]], stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The deltas that complete the tool calls ``sent`` to the ``stored`` ones (batches the listener missed and
    resynced as text only): a call not begun whole, and the rest of a call's arguments."""
    begun = {call_index: call for call_index, call in enumerate(tool_calls_merged(sent))}
    rest: list[dict[str, Any]] = []
    for index, call in enumerate(stored):
        function = call.get("function") or {}
        had = begun.get(index)
        if had is None:
            rest.append({"index": index, **call})
            continue
        arguments, said = function.get("arguments") or "", had["function"]["arguments"]
        if arguments.startswith(said) and len(arguments) > len(said):
            rest.append({"index": index, "function": {"arguments": arguments[len(said) :]}})
    return rest
