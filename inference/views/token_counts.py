"""A request's prompt counted by the rig that would serve it, without running it: Anthropic's
``/v1/messages/count_tokens`` and OpenAI's ``/v1/responses/input_tokens`` (inference/turns/counting.py). The key, the
body and the model are checked and the count admitted on a database thread; the rig's server is asked on the loop, so
an unreachable rig delays only this request. Each API answers a refusal (``CountRefused``) in its own shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from inference.backends.base import BackendError, BackendNotSupported, BackendRefused, user_message
from inference.errors import InvalidInput
from inference.models import Rig
from inference.queue.ratelimits import RateLimited
from inference.turns.counting import api_count_admit, api_input_tokens
from inference.views.openai import model_catalogue, model_resolve
from inference.views.openai_request import BadRequest, body_read, chat_request_parse
from inference.views.turn_listener import on_db_thread

# What a count sends of the translated request: what makes the prompt (llama-server's input_tokens reads the rest
# as a chat completion would, and ignores it).
COUNTED = ("model", "messages", "tools", "tool_choice", "chat_template_kwargs")


class CountRefused(Exception):
    """Why a count is not answered: its HTTP status, words and code (OpenAI's ``code``), the field at fault, and
    when to try again (a rate limit's ``Retry-After``)."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 retry_after_s: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s


Checked = tuple[Rig, str, dict[str, Any], set[str] | None] | HttpResponse | CountRefused


async def count_answer(
    request: HttpRequest,
    *,
    authenticate: Callable[[HttpRequest], HttpResponse | None],
    translate: Callable[[dict[str, Any]], dict[str, Any]],
    refused: Callable[[CountRefused], HttpResponse],
    answer: Callable[[int], dict[str, Any]],
) -> HttpResponse:
    """``answer(n)`` for the request's prompt of ``n`` tokens. ``authenticate``: sets ``request.api_key`` (read from
    its row) or answers the refusal; ``translate``: the API's body as a chat completion's (BadRequest)."""
    if request.method != "POST":
        return refused(CountRefused(405, "Use POST.", code="method_not_allowed"))
    checked = await on_db_thread(_checked)(request, authenticate, translate)
    if isinstance(checked, CountRefused):
        return refused(checked)
    if isinstance(checked, HttpResponse):
        return checked
    rig, model, body, kept = checked
    try:
        count = await api_input_tokens(rig=rig, model=model, body=body, kept=kept)
    except InvalidInput as exc:  # the server does not hold the model now
        return refused(CountRefused(409, exc.message, code=exc.code, param="model"))
    except BackendRefused as exc:  # the request was the client's: the server's status and words
        return refused(CountRefused(exc.status, exc.words, code="backend_refused"))
    except BackendNotSupported:
        return refused(CountRefused(501, f"Rig {rig.name}'s server ({rig.kind}) cannot count tokens.",
                                    code="not_supported"))  # fmt: skip
    except BackendError as exc:
        return refused(CountRefused(503, user_message(rig.name, exc), code="backend_unavailable"))
    return JsonResponse(answer(count))


def _checked(
    request: HttpRequest,
    authenticate: Callable[[HttpRequest], HttpResponse | None],
    translate: Callable[[dict[str, Any]], dict[str, Any]],
) -> Checked:
    if (rejected := authenticate(request)) is not None:
        return rejected
    try:
        fields = translate(body_read(request.body))
        chat_request_parse(json.dumps({**fields, "stream": False}, ensure_ascii=False).encode())  # sizes, roles
    except BadRequest as exc:
        return CountRefused(exc.status, exc.message, code=exc.error_code or "invalid_request_error", param=exc.param)
    entry = model_resolve(fields["model"], model_catalogue())
    if entry is None:
        return CountRefused(404, f"The model '{fields['model']}' does not exist", code="model_not_found", param="model")
    try:
        kept = api_count_admit(key=request.api_key, rig=entry.rig, model=entry.model)  # type: ignore[attr-defined]
    except RateLimited as exc:
        return CountRefused(429, exc.message, code="rate_limit_exceeded", retry_after_s=exc.retry_after_s)
    except InvalidInput as exc:
        return CountRefused(409, exc.message, code=exc.code, param="model")
    return entry.rig, entry.model, {**{k: v for k, v in fields.items() if k in COUNTED}, "model": entry.model}, kept
