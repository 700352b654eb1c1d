"""``POST /v1/embeddings``: the body goes to the rig serving the model, as the client sent it; the rig's answer, or
its refusal with its status and words (a llama-server started without ``--embeddings`` answers 501), comes back.

https://platform.openai.com/docs/api-reference/embeddings. An embedding is not a turn (nothing is decoded, nothing
queues behind a slot): it is not on the board or in usage.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from inference.backends import backend_for
from inference.backends.base import BackendError, BackendRefused, user_message
from inference.board import apikeys
from inference.models import Rig
from inference.views.openai import model_catalogue, model_resolve
from inference.views.openai import openai_error as error
from inference.views.openai_request import BadRequest, body_read
from inference.views.turn_listener import on_db_thread


def _resolve(request: HttpRequest) -> tuple[Rig, dict[str, Any], str] | HttpResponse:
    """The rig, the body for its backend and the model id the client named; or the error that refused it."""
    try:
        apikeys.api_key_authenticate(request.headers.get("Authorization", ""))
    except apikeys.KeyRejected as exc:
        response = error(401, exc.message, code="invalid_api_key")
        response["WWW-Authenticate"] = 'Bearer realm="rigdash-api"'
        return response
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
    return entry.rig, {**body, "model": entry.model}, model


async def embeddings(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return error(405, "Use POST.", code="method_not_allowed")
    resolved = await on_db_thread(_resolve)(request)
    if isinstance(resolved, HttpResponse):
        return resolved
    rig, body, model_id = resolved
    backend = backend_for(rig, timeout_s=settings.RIGDASH.first_token_timeout_s)
    try:
        answer = await backend.embeddings(body)
    except BackendRefused as exc:
        return error(exc.status, exc.words, code="backend_refused")
    except BackendError as exc:
        return error(502, user_message(rig.name, exc), code=exc.code, kind="server_error")
    return JsonResponse({**answer, "model": model_id})


embeddings.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie
