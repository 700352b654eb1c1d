"""A rig's model-management page and its JSON API, for staff only: everyone else gets 404.

Errors are ``{"error": {"code", "message"}}``: 400 bad input or an action the rig's kind cannot do,
404 unknown model, 409 model in use, 502 the backend failed or is unreachable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from inference.backends.base import BackendError, BackendNotSupported, ModelNotFound
from inference.board import model_admin
from inference.errors import NotFound
from inference.models import Rig
from inference.views.http import api_view, json_body, json_error, or_404, staff_required

STATUS_BY_CODE = {"model_in_use": 409, "not_supported": 400}


def _model_from_body(request: HttpRequest) -> Any:
    return json_body(request).get("model")


def admin_api(view: Callable[[HttpRequest, Rig], HttpResponse]) -> Callable[..., HttpResponse]:
    """Staff only (``api_view``), the rig looked up (404 when unknown), and the backend's errors as JSON."""

    @api_view(staff=True, statuses=STATUS_BY_CODE)
    def wrapped(request: HttpRequest, rig_id: int) -> HttpResponse:
        try:
            rig = model_admin.rig_get_for_admin(request.user, rig_id)
        except NotFound:
            return json_error("not_found", "Not found.", 404)
        try:
            return view(request, rig)
        except ModelNotFound as exc:
            return json_error(exc.code, str(exc), 404)
        except BackendNotSupported as exc:
            return json_error(exc.code, str(exc), 400)
        except BackendError as exc:
            return json_error(exc.code, str(exc), 502)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


@staff_required
@require_GET
def rig_models_page(request: HttpRequest, rig_id: int) -> HttpResponse:
    rig = or_404(model_admin.rig_get_for_admin, request.user, rig_id)
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
def api_rig_models_load(request: HttpRequest, rig: Rig) -> HttpResponse:
    return JsonResponse(
        {"loaded": model_admin.model_load(actor=request.user, rig=rig, model=_model_from_body(request))}
    )


@admin_api
@require_POST
def api_rig_models_unload(request: HttpRequest, rig: Rig) -> HttpResponse:
    return JsonResponse(
        {"unloaded": model_admin.model_unload(actor=request.user, rig=rig, model=_model_from_body(request))}
    )
