"""A rig's model-management page and its JSON API, for staff only: everyone else gets 404.

Errors are ``{"error": {"code", "message"}}``: 400 bad input or an action the rig's kind cannot do,
404 unknown model, 409 model in use, 502 the backend failed or is unreachable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from inference import model_admin
from inference.backends.base import BackendError, BackendNotSupported, ModelNotFound
from inference.models import Rig
from inference.services import InvalidInput

STATUS_BY_CODE = {"model_in_use": 409, "not_supported": 400}


def _json_error(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _model_from_body(request: HttpRequest) -> Any:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        raise InvalidInput("bad_json", "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise InvalidInput("bad_json", "The request body must be a JSON object with a model.")
    return body.get("model")


def admin_api(view: Callable[[HttpRequest, Rig], HttpResponse]) -> Callable[..., HttpResponse]:
    """401 for anonymous, 404 for non-staff or an unknown rig, then map the services' errors to JSON."""

    def wrapped(request: HttpRequest, rig_id: int) -> HttpResponse:
        if not request.user.is_authenticated:
            return _json_error("not_authenticated", "Log in first.", 401)
        try:
            rig = model_admin.rig_get_for_admin(request.user, rig_id)
        except Http404:
            return _json_error("not_found", "Not found.", 404)
        try:
            return view(request, rig)
        except InvalidInput as exc:
            return _json_error(exc.code, exc.message, STATUS_BY_CODE.get(exc.code, 400))
        except ModelNotFound as exc:
            return _json_error(exc.code, str(exc), 404)
        except BackendNotSupported as exc:
            return _json_error(exc.code, str(exc), 400)
        except BackendError as exc:
            return _json_error(exc.code, str(exc), 502)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


@login_required
@require_GET
def rig_models_page(request: HttpRequest, rig_id: int) -> HttpResponse:
    rig = model_admin.rig_get_for_admin(request.user, rig_id)
    overview = model_admin.models_overview(rig)
    api = reverse("inference:api_rig_models_state", args=[rig.pk]).rsplit("/", 1)[0]
    return render(
        request,
        "inference/rig_models.html",
        {
            "rig": rig,
            "overview": overview,
            "page_config": {"rig": rig.pk, "api": api, "csrfToken": get_token(request), "overview": overview},
        },
    )


@admin_api
@require_GET
def api_rig_models_state(request: HttpRequest, rig: Rig) -> HttpResponse:
    return JsonResponse(model_admin.models_overview(rig))


@admin_api
@require_POST
def api_rig_models_pull(request: HttpRequest, rig: Rig) -> HttpResponse:
    model = model_admin.model_name_validate(_model_from_body(request))
    pull_id = model_admin.model_pull(actor=request.user, rig=rig, model=model)
    return JsonResponse({"pull": {"id": pull_id, "model": model}}, status=202)


@admin_api
@require_POST
def api_rig_models_delete(request: HttpRequest, rig: Rig) -> HttpResponse:
    return JsonResponse(
        {"deleted": model_admin.model_delete(actor=request.user, rig=rig, model=_model_from_body(request))}
    )


@admin_api
@require_POST
def api_rig_models_unload(request: HttpRequest, rig: Rig) -> HttpResponse:
    return JsonResponse(
        {"unloaded": model_admin.model_unload(actor=request.user, rig=rig, model=_model_from_body(request))}
    )
