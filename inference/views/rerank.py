"""``POST /v1/rerank`` (and ``/v1/reranking``, ``/rerank``, ``/reranking``, as llama-server names it): documents scored
against a query by the rig's reranker, a llama-server started with ``--reranking``
(tools/server/server-context.cpp ``post_rerank``).

Two shapes, as llama-server reads them: Jina's (``query``, ``documents``, ``top_n``; Open WebUI's external reranker,
the Jina clients of LangChain and LlamaIndex) answered ``{"model", "object", "usage", "results": [{"index",
"relevance_score"}]}``, and TEI's (``texts``, ``return_text``) answered as a list of ``{"index", "score"}``. One
request is one turn answered whole, as an embeddings request is (``api_rerank_submit``; inference/worker/embed.py):
queued, counted in quotas, the board and usage, its texts never kept. RigDash checks what it needs (the model, a
query, the documents, ``top_n``); every other field goes to the server. Errors are llama-server's shape
(``native_error``), the server's refusal (a server without ``--reranking``: 501) with its status and words.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from inference.backends import backend_supports
from inference.models import Turn
from inference.turns.api import api_rerank_submit
from inference.views.llamacpp_native import model_entry, native_authenticated, native_error, native_shape
from inference.views.openai_chat import submitted_or_refused
from inference.views.openai_embeddings import whole_answer
from inference.views.openai_request import BadRequest, body_read


def _checked(body: dict[str, Any]) -> None:
    if not isinstance(body.get("query"), str):
        raise BadRequest('"query" must be provided, as a string')
    documents = body.get("documents", body.get("texts"))
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents):
        raise BadRequest('"documents" must be a non-empty string array')
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise BadRequest('"top_n" must be a whole number from 1')


def _submit(request: HttpRequest) -> tuple[Turn, str] | HttpResponse:
    if (refused := native_authenticated(request)) is not None:
        return refused
    try:
        body = body_read(request.body)
        _checked(body)
        entry = model_entry(body)
    except BadRequest as exc:
        return native_error(exc.status, exc.message)
    if not backend_supports(entry.rig.kind, "rerank"):
        return native_error(501, f"Rig {entry.rig.name}'s server ({entry.rig.kind}) does not rerank documents.")
    turn = submitted_or_refused(
        request, lambda key, client: api_rerank_submit(
            key=key, rig=entry.rig, model=entry.model, body={**body, "model": entry.model}, placed=entry.placed,
            client=client,
        ),
    )  # fmt: skip
    return native_shape(turn) if isinstance(turn, HttpResponse) else (turn, entry.id)


async def rerank(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return native_error(405, "Use POST.")
    answered = await whole_answer(request, _submit, native_shape)
    if isinstance(answered, HttpResponse):
        return answered
    answer, model_id = answered
    if "tei" in answer:  # TEI's shape is a bare list
        return JsonResponse(answer["tei"], safe=False)
    return JsonResponse({**answer, "model": model_id})


rerank.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie
