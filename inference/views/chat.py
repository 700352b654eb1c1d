"""Chat pages and the JSON API. Every object is looked up through the user's own sessions (404 otherwise)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from inference.backends.base import BackendError, user_message
from inference.errors import InvalidInput
from inference.models import Rig
from inference.turns import lifecycle, selectors, sessions, submit
from inference.views.http import api_view, json_body, json_error
from rigdash import numbers
from rigdash.access import is_staff


def _backend_error(request: HttpRequest, rig: Rig, exc: BackendError) -> str:
    """Staff read the backend's detail; everyone else the rig's name and a plain reason."""
    return str(exc) if is_staff(request.user) else user_message(rig.name, exc)


def _rig_choices(request: HttpRequest) -> list[dict[str, Any]]:
    """Each enabled rig with the models it serves, or why it cannot say. The lists the sampler keeps are read in one
    round trip; only a rig with none kept is asked (those in parallel), so a view does not fan out to the backends."""
    rigs = list(selectors.rig_list_enabled())
    kept = sessions.rigs_models(rigs)

    def describe(rig: Rig) -> dict[str, Any]:
        try:
            models = kept.get(rig.pk)
            return {
                "rig": rig,
                "models": [m.name for m in (sessions.rig_models(rig) if models is None else models)],
                "error": "",
            }
        except BackendError as exc:
            return {"rig": rig, "models": [], "error": _backend_error(request, rig, exc)}

    missing = [rig for rig in rigs if kept.get(rig.pk) is None]
    if len(missing) <= 1:
        return [describe(rig) for rig in rigs]
    with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
        return list(pool.map(describe, rigs))


def new_chat_choices(request: HttpRequest) -> dict[str, Any]:
    """The new-chat form's choices: each rig with its models, and the models several rigs serve, which a chat can
    target instead of one rig (each turn then goes to whichever of them has a free slot)."""
    rigs = _rig_choices(request)
    serving: dict[str, list[str]] = {}
    for choice in rigs:
        for model in choice["models"]:
            serving.setdefault(model, []).append(choice["rig"].name)
    placed = [{"model": model, "rigs": names} for model, names in sorted(serving.items()) if len(names) > 1]
    return {"rigs": rigs, "placed": placed}


def _rig_id(raw: str | None) -> int:
    """The form's rig id; 0 (no rig: a 404) for anything but a whole number."""
    try:
        return numbers.optional_int(raw, name="rig", default=0, low=1, high=2**31 - 1)
    except numbers.BadNumber:
        return 0


@login_required
@require_POST
def session_create(request: HttpRequest) -> HttpResponse:
    try:
        if request.POST.get("placement") == "model":  # any rig serving the model (inference/queue/placement.py)
            session = sessions.session_create_placed(
                owner=request.user,  # type: ignore[arg-type]
                model_name=request.POST.get("model", ""),
            )
        else:
            session = sessions.session_create(
                owner=request.user,  # type: ignore[arg-type]
                rig=get_object_or_404(selectors.rig_list_enabled(), pk=_rig_id(request.POST.get("rig"))),
                model_name=request.POST.get("model", ""),
            )
    except InvalidInput as exc:
        return render(
            request,
            "inference/session_list.html",
            {
                "sessions": (page := selectors.session_page_for(request.user)).sessions,
                "older": page.older,
                **new_chat_choices(request),
                "error": exc.message,
            },
            status=400,
        )
    return redirect("inference:session_detail", session_id=session.pk)


@api_view()
def api_session_turns(request: HttpRequest, session_id: int) -> HttpResponse:
    session = selectors.session_get_for(request.user, session_id)
    if request.method == "GET":
        return JsonResponse({"session": session.pk, "turns": selectors.session_history(session)})
    if request.method == "POST":
        body = json_body(request)
        turn = submit.turn_submit(session=session, text=body.get("text"), params=body.get("params"))
        return JsonResponse({"turn": selectors.turn_snapshot(turn)}, status=201)
    return json_error("method_not_allowed", "Use GET or POST.", 405)


@api_view()
@require_GET
def api_turn_detail(request: HttpRequest, turn_id: int) -> HttpResponse:
    return JsonResponse({"turn": selectors.turn_snapshot(selectors.turn_get_for(request.user, turn_id))})


@api_view()
@require_POST
def api_turn_cancel(request: HttpRequest, turn_id: int) -> HttpResponse:
    turn = lifecycle.turn_cancel(turn=selectors.turn_get_for(request.user, turn_id))
    return JsonResponse({"turn": selectors.turn_snapshot(turn)}, status=202)


@api_view()
@require_GET
def api_rig_models(request: HttpRequest, rig_id: int) -> HttpResponse:
    rig = get_object_or_404(selectors.rig_list_enabled(), pk=rig_id)
    try:
        models = sessions.rig_models(rig)
    except BackendError as exc:
        return json_error(exc.code, _backend_error(request, rig, exc), 502)
    return JsonResponse(
        {"rig": rig.pk, "models": [{"name": m.name, "context_length": m.context_length} for m in models]}
    )
