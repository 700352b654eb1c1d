"""``GET /v1/models`` and ``GET /v1/models/<id>``, which OpenAI's and Anthropic's APIs both name: a request that says
``anthropic-version`` (every Anthropic SDK sends it) gets Anthropic's Models API, its key from ``x-api-key`` or a
bearer token and its errors in Anthropic's shape; any other gets OpenAI's (inference/views/openai.py).

https://docs.anthropic.com/en/api/models-list: ``{"data": [model], "has_more", "first_id", "last_id"}``, a page of at
most ``limit`` models (1-1000, default 20) after ``after_id`` or before ``before_id``; a model is
``{"type": "model", "id", "display_name", "created_at", "max_input_tokens"}`` (the context a request gets, as
``/v1/models``' ``context_length``; null where unknown). The ids are the OpenAI API's (``model_catalogue``), in
its order.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from inference.views import openai
from inference.views.anthropic_messages import anthropic_authenticated, anthropic_error
from inference.views.openai import CatalogueEntry, model_catalogue, model_resolve

DEFAULT_LIMIT, MAX_LIMIT = 20, 1000


def _anthropic(request: HttpRequest) -> bool:
    return "anthropic-version" in request.headers


def _model(entry: CatalogueEntry) -> dict[str, Any]:
    created = entry.rig.created_at.isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": entry.id, "display_name": entry.id, "created_at": created,
            "max_input_tokens": entry.context_length}  # fmt: skip


@csrf_exempt
def models_list(request: HttpRequest) -> HttpResponse:
    if not _anthropic(request):
        return openai.models_list(request)
    if request.method != "GET":
        return anthropic_error(405, "Use GET.")
    if (refused := anthropic_authenticated(request)) is not None:
        return refused
    raw_limit = request.GET.get("limit", str(DEFAULT_LIMIT))
    if not (raw_limit.isascii() and raw_limit.isdigit() and 1 <= int(raw_limit) <= MAX_LIMIT):
        return anthropic_error(400, f"limit: an integer from 1 to {MAX_LIMIT} is required")
    limit = int(raw_limit)
    after, before = request.GET.get("after_id"), request.GET.get("before_id")
    if after is not None and before is not None:
        return anthropic_error(400, "Give after_id or before_id, not both.")
    catalogue = model_catalogue()
    ids = [entry.id for entry in catalogue]
    cursor = after if after is not None else before
    if cursor is not None and cursor not in ids:
        return anthropic_error(400, f"{'after_id' if after is not None else 'before_id'}: no model '{cursor}'")
    if before is not None:
        end = ids.index(before)
        start = max(0, end - limit)
        page, has_more = catalogue[start:end], start > 0
    else:
        start = 0 if after is None else ids.index(after) + 1
        page, has_more = catalogue[start : start + limit], start + limit < len(ids)
    return JsonResponse({
        "data": [_model(entry) for entry in page], "has_more": has_more,
        "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
    })  # fmt: skip


@csrf_exempt
def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    if not _anthropic(request):
        return openai.model_detail(request, model_id)
    if request.method != "GET":
        return anthropic_error(405, "Use GET.")
    if (refused := anthropic_authenticated(request)) is not None:
        return refused
    entry = model_resolve(model_id, model_catalogue())
    if entry is None:
        return anthropic_error(404, f"model: {model_id}")
    return JsonResponse(_model(entry))
