"""``POST /v1/completions``: a raw completion (a prompt with no chat template; with ``suffix``, code completion) as
one turn, answered whole or streamed as OpenAI's ``text_completion`` events, as chat completions are
(inference/views/openai_chat.py).

https://platform.openai.com/docs/api-reference/completions. On llama-server, a request with ``suffix`` goes to its
``/infill`` (its ``/v1/completions`` ignores a suffix); a model without fill-in-the-middle tokens is refused there
with 501 and its words, which the client gets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from inference.models import Turn
from inference.views.openai import openai_error as error
from inference.views.openai_chat import (
    ENDED_STATUSES,
    Piece,
    Submitted,
    answered,
    authenticated_submit,
    finish_reason_of,
    sse,
    text_stream,
    turn_submit_for,
    usage_of,
)
from inference.views.openai_request import BadRequest, completion_request_parse
from inference.views.turn_listener import TurnListener, on_db_thread


def _submit(request: HttpRequest) -> Submitted:
    try:
        parsed = completion_request_parse(request.body)
    except BadRequest as exc:
        return error(exc.status, exc.message, param=exc.param, code=exc.error_code)
    return turn_submit_for(request, parsed)


async def completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return error(405, "Use POST.", code="method_not_allowed")
    submitted = await on_db_thread(authenticated_submit)(request, _submit)
    return await answered(submitted, _stream, _whole)


def _whole(turn: Turn, model_id: str) -> HttpResponse:
    return JsonResponse({
        **_base(turn, model_id),
        "choices": [{"text": turn.reply_text, "index": 0, "logprobs": None, "finish_reason": finish_reason_of(turn)}],
        "usage": usage_of(turn),
    })  # fmt: skip


completions.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie


def _base(turn: Turn, model_id: str) -> dict[str, Any]:
    return {"id": f"cmpl-rd{turn.pk}", "object": "text_completion", "created": int(turn.created_at.timestamp()),
            "model": model_id}  # fmt: skip


def _stream(
    turn: Turn, model_id: str, include_usage: bool, listener: TurnListener, pieces: AsyncIterator[Piece], first: Piece
) -> AsyncIterator[bytes]:
    """The completion's text as ``text_completion`` events; closing the iterator early cancels the turn."""
    base = _base(turn, model_id)

    def chunk(text: str, finish: str | None = None) -> bytes:
        return sse({**base, "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]})

    def end(ended: Turn) -> list[bytes]:
        if ended.status in ENDED_STATUSES:
            error = {"message": ended.error or f"The reply was {ended.status}.", "type": "server_error", "param": None,
                     "code": ended.status}  # fmt: skip
            return [sse({"error": error}), sse("[DONE]")]
        usage = [sse({**base, "choices": [], "usage": usage_of(ended)})] if include_usage else []
        return [chunk("", finish_reason_of(ended)), *usage, sse("[DONE]")]

    return text_stream(listener, first, pieces, chunk, end)
