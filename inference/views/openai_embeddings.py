"""``POST /v1/embeddings``: one request is one turn (``inference.turns.api.api_embeddings_submit``): it waits in the
fair queue and counts in quotas, the board and usage; the worker sends the body to the rig serving the model as the
client sent it (inference/worker/embed.py), and the rig's answer, or its refusal with its status and words (a
llama-server started without ``--embeddings`` answers 501), comes back.

https://platform.openai.com/docs/api-reference/embeddings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from inference.live import answers
from inference.models import Turn
from inference.turns.api import api_embeddings_submit
from inference.views.openai import CatalogueEntry, model_catalogue, model_resolve
from inference.views.openai import openai_error as error
from inference.views.openai_chat import ended_error, key_checked, submitted_or_refused, wait_for_end
from inference.views.openai_request import BadRequest, body_read
from inference.views.turn_listener import on_db_thread

Asked = tuple[Turn, str]  # the request's turn and the model id the client named


def embeddings_submit(request: HttpRequest, entry: CatalogueEntry, body: dict[str, Any]) -> Asked | HttpResponse:
    """Submit a checked embeddings body for the model ``entry`` as a turn of the key's owner (a quota's refusal is
    answered in OpenAI's shape)."""
    turn = submitted_or_refused(
        request, lambda key, client: api_embeddings_submit(
            key=key, rig=entry.rig, model=entry.model, body={**body, "model": entry.model}, placed=entry.placed,
            client=client,
        ),
    )  # fmt: skip
    return turn if isinstance(turn, HttpResponse) else (turn, entry.id)


def _submit(request: HttpRequest) -> Asked | HttpResponse:
    """Check the body (``model``, a non-empty ``input``) and the model, then submit it."""
    try:
        body = body_read(request.body)
    except BadRequest as exc:
        return error(exc.status, exc.message, param=exc.param)
    model, text = body.get("model"), body.get("input")
    if not isinstance(model, str) or not model:
        return error(400, "model must be a non-empty string", param="model")
    if not isinstance(text, str | list) or not text:
        return error(400, "input must be a string or a non-empty array", param="input")
    entry = model_resolve(model, model_catalogue())
    if entry is None:
        return error(404, f"The model '{model}' does not exist", code="model_not_found", param="model")
    return embeddings_submit(request, entry, body)


async def embeddings_answer(turn: Turn) -> dict[str, Any] | HttpResponse:
    """The rig's answer once the turn has ended, or the answer to its failure (OpenAI's shape)."""
    ended = await wait_for_end(turn)
    if (refused := ended_error(ended)) is not None:
        return refused
    answer = await on_db_thread(answers.answer_take)(ended.pk)
    if answer is None:
        return error(502, "The rig's answer was lost before it could be sent.", code="answer_lost", kind="server_error")
    return answer


async def whole_answer(
    request: HttpRequest,
    submit: Callable[[HttpRequest], Asked | HttpResponse],
    shape: Callable[[HttpResponse], HttpResponse],
) -> tuple[dict[str, Any], str] | HttpResponse:
    """A request answered whole (embeddings, a rerank): ``submit`` on a database thread (its refusals in its API's
    shape), then the rig's answer and the model id the client named once the turn has ended; a failure as ``shape``
    words it."""
    submitted = await on_db_thread(submit)(request)
    if isinstance(submitted, HttpResponse):
        return submitted
    turn, model_id = submitted
    answer = await embeddings_answer(turn)
    return shape(answer) if isinstance(answer, HttpResponse) else (answer, model_id)


async def embeddings(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return error(405, "Use POST.", code="method_not_allowed")
    answered = await whole_answer(request, lambda asked: key_checked(asked, _submit), lambda failed: failed)
    if isinstance(answered, HttpResponse):
        return answered
    answer, model_id = answered
    return JsonResponse({**answer, "model": model_id})


embeddings.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie
