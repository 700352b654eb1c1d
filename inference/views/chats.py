"""The chat pages and chat management: list and search, the chat page with its settings and presets, rename,
delete, export and import. Every chat and preset is looked up through the user's own rows (404 otherwise), and
every change is a POST (CSRF-checked by Django's middleware)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from inference.backends import capabilities
from inference.errors import InvalidInput
from inference.models import ChatPreset, ChatSession
from inference.turns import branch as chat_branch
from inference.turns import chats as chat_manage
from inference.turns import compare as chat_compare
from inference.turns import params as chat_settings
from inference.turns import search as chat_search
from inference.turns import selectors
from inference.turns import transfer as chat_transfer
from inference.views.chat import _rig_choices, new_chat_choices
from inference.views.http import api_view, json_body, or_404
from rigdash import numbers

SETTING_FIELDS = [
    # name, label, step, hint
    ("temperature", "Temperature", "0.05", "0-2"),
    ("top_p", "Top p", "0.01", "0-1"),
    ("top_k", "Top k", "1", "0-1000, 0 off"),
    ("min_p", "Min p", "0.01", "0-1, 0 off"),
    ("repeat_penalty", "Repeat penalty", "0.01", "0-2, 1 off"),
    ("max_tokens", "Max tokens", "1", ""),
    ("seed", "Seed", "1", "0-2147483647"),
    # Rigs whose backend takes it per request (chat_settings.SERVER_SETTINGS): Ollama reloads the model with it.
    ("num_ctx", "Context window (num_ctx)", "1", "tokens, 256-1048576; a change reloads the model"),
]


def _preset_for(user: Any, preset_id: Any) -> ChatPreset:
    try:
        return ChatPreset.objects.get(owner_id=user.pk, pk=numbers.parse_int(preset_id, name="preset", low=1))
    except (ChatPreset.DoesNotExist, numbers.BadNumber):
        raise Http404("No such preset") from None


def _form_initial(values: dict[str, Any]) -> dict[str, str]:
    initial = {name: "" if values.get(name) is None else f"{values[name]:g}" for name in chat_settings.NUMBER_RULES}
    initial["system"] = values.get("system", "")
    initial["stop"] = "\n".join(values.get("stop", []))
    return initial


def _chat_page(
    request: HttpRequest,
    session: ChatSession,
    *,
    form: dict[str, str] | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    values = session.settings or {}
    initial = form if form is not None else _form_initial(values)
    limit = settings.RIGDASH.max_reply_tokens
    fields = []
    accepted = capabilities(session.rig.kind).request_settings
    for name, label, step, hint in SETTING_FIELDS:
        if name in chat_settings.SERVER_SETTINGS and name not in accepted:
            continue
        _kind, low, high = chat_settings.NUMBER_RULES[name]
        high = min(high, limit) if name == "max_tokens" else high
        value = initial.get(name, "")
        fields.append({"name": name, "label": label, "step": step, "hint": hint or f"1-{limit}", "value": value,
                       "min": f"{low:g}", "max": f"{high:g}"})  # fmt: skip
    context = {
        "session": session,
        "sessions": selectors.session_list_for(request.user)[:50],
        "page_config": {
            "session": session.pk,
            "maxChars": settings.RIGDASH.max_message_chars,
            "versions": chat_branch.versions_for(session),
            # The rig's server takes a reasoning effort level (Ollama's think, llama-server's reasoning_effort).
            "thinkLevels": capabilities(session.rig.kind).reasoning_levels,
        },
        "summary": chat_settings.settings_summary(values),
        "fields": fields,
        "system": initial.get("system", ""),
        "stop": initial.get("stop", ""),
        "presets": ChatPreset.objects.filter(owner_id=request.user.pk),
        "settings_error": error,
        "limits": {"system": chat_settings.SYSTEM_MAX_CHARS, "stop": chat_settings.STOP_MAX_STRINGS},
    }
    return render(request, "inference/chat.html", context, status=status)


@login_required
@require_GET
def session_list(request: HttpRequest) -> HttpResponse:
    try:
        query = chat_search.query_validate(request.GET.get("q", ""))
        hits = chat_search.session_search(request.user, query)
    except InvalidInput as exc:
        query, hits = "", []
        messages.error(request, exc.message)
    before = request.GET.get("before", "")
    try:
        page = selectors.session_page_for(request.user, before=before)
    except InvalidInput as exc:
        before, page = "", selectors.session_page_for(request.user)
        messages.error(request, exc.message)
    return render(
        request,
        "inference/session_list.html",
        {
            "sessions": page.sessions,
            "older": page.older,
            "paged": bool(before),
            **new_chat_choices(request),
            "query": query,
            "hits": hits,
        },
    )


@login_required
@require_GET
def session_detail(request: HttpRequest, session_id: int) -> HttpResponse:
    return _chat_page(request, or_404(selectors.session_get_for, request.user, session_id))


@login_required
@require_POST
def session_settings(request: HttpRequest, session_id: int) -> HttpResponse:
    """Save the form's settings on the chat; with a preset name, store them as that preset too."""
    session = or_404(selectors.session_get_for, request.user, session_id)
    try:
        values = chat_settings.form_values(request.POST)
        with transaction.atomic():  # the preset and the chat's settings together, or neither
            if request.POST.get("action") == "preset":
                chat_manage.preset_save(owner=request.user, name=request.POST.get("preset_name"), values=values)
            chat_manage.session_settings_save(session=session, values=values)
    except InvalidInput as exc:
        form = {key: request.POST.get(key, "") for key in (*chat_settings.NUMBER_RULES, "system", "stop")}
        return _chat_page(request, session, form=form, error=exc.message, status=400)
    messages.success(request, "Settings saved: new replies use them.")
    return redirect("inference:session_detail", session_id=session.pk)


@login_required
@require_POST
def session_preset(request: HttpRequest, session_id: int) -> HttpResponse:
    """Apply the chosen preset to the chat, or delete the preset."""
    session = or_404(selectors.session_get_for, request.user, session_id)
    preset = _preset_for(request.user, request.POST.get("preset"))
    if request.POST.get("action") == "delete":
        chat_manage.preset_delete(preset=preset)
        messages.success(request, f"Preset {preset.name} deleted.")
    else:
        chat_manage.preset_apply(session=session, preset=preset)
        messages.success(request, f"Preset {preset.name} applied.")
    return redirect("inference:session_detail", session_id=session.pk)


@login_required
@require_POST
def session_rename(request: HttpRequest, session_id: int) -> HttpResponse:
    session = or_404(selectors.session_get_for, request.user, session_id)
    try:
        chat_manage.session_rename(session=session, title=request.POST.get("title"))
    except InvalidInput as exc:
        messages.error(request, exc.message)
    return redirect("inference:session_detail", session_id=session.pk)


@login_required
@require_http_methods(["GET", "POST"])
def session_delete(request: HttpRequest, session_id: int) -> HttpResponse:
    """GET asks for confirmation; POST deletes the chat with its turns."""
    session = or_404(selectors.session_get_for, request.user, session_id)
    if request.method == "GET":
        return render(request, "inference/session_delete.html", {"session": session, "turns": session.turns.count()})
    title = str(session)
    chat_manage.session_delete(session=session)
    messages.success(request, f"Deleted the chat {title}.")
    return redirect("inference:session_list")


@login_required
@require_GET
def session_export(request: HttpRequest, session_id: int, kind: str) -> HttpResponse:
    session = or_404(selectors.session_get_for, request.user, session_id)
    if kind not in ("json", "md"):
        raise Http404("Export as .json or .md")
    name = slugify(str(session))[:60] or f"chat-{session.pk}"
    if kind == "json":
        body = json.dumps(chat_transfer.session_export(session), ensure_ascii=False, indent=1)
        response = HttpResponse(body, content_type="application/json; charset=utf-8")
    else:
        response = HttpResponse(chat_transfer.session_markdown(session), content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.{kind}"'
    return response


@login_required
@require_POST
def session_import(request: HttpRequest) -> HttpResponse:
    upload = request.FILES.get("file")
    try:
        if upload is None:
            raise InvalidInput("bad_import", "Choose a JSON file exported from RigDash.")
        if upload.size is not None and upload.size > chat_transfer.IMPORT_MAX_BYTES:
            raise InvalidInput("bad_import", "The file is too large to be a chat export.")
        session = chat_transfer.session_import(owner=request.user, raw=upload.read())
    except InvalidInput as exc:
        messages.error(request, f"Not imported: {exc.message}")
        return redirect("inference:session_list")
    messages.success(request, "Chat imported.")
    return redirect("inference:session_detail", session_id=session.pk)


@api_view()
@require_http_methods(["GET", "POST"])
def api_session_settings(request: HttpRequest, session_id: int) -> HttpResponse:
    """GET the chat's settings; POST ``{"settings": {...}}`` replaces them (checked whole; 400 stores nothing)."""
    session = selectors.session_get_for(request.user, session_id)
    if request.method == "POST":
        chat_manage.session_settings_save(session=session, values=json_body(request).get("settings"))
    values = session.settings or {}
    return JsonResponse({"session": session.pk, "settings": values, "summary": chat_settings.settings_summary(values)})


@api_view()
@require_POST
def api_session_import(request: HttpRequest) -> HttpResponse:
    session = chat_transfer.session_import(owner=request.user, raw=request.body)
    return JsonResponse({"session": session.pk, "title": str(session)}, status=201)


@api_view()
@require_POST
def api_turn_branch(request: HttpRequest, turn_id: int) -> HttpResponse:
    """In a new branch: regenerate a turn's reply (``{}``), send an edited message (``{"text": ...}``) or continue
    the reply (``{"continue": true}``)."""
    turn = selectors.turn_get_for(request.user, turn_id)
    body = json_body(request)
    branch = chat_branch.turn_branch(turn=turn, text=body.get("text"), continue_reply=body.get("continue") is True)
    url = reverse("inference:session_detail", kwargs={"session_id": branch.pk})
    return JsonResponse({"session": branch.pk, "title": str(branch), "url": url}, status=201)


@login_required
@require_http_methods(["GET", "POST"])
def compare_new(request: HttpRequest) -> HttpResponse:
    """GET: pick two models and write a message; POST: start both chats and show them side by side."""
    error = ""
    if request.method == "POST":
        try:
            left, right = chat_compare.compare_start(
                owner=request.user,  # type: ignore[arg-type]
                picks=[request.POST.get("left"), request.POST.get("right")],
                text=request.POST.get("text"),
            )
        except InvalidInput as exc:
            error = exc.message
        else:
            return redirect("inference:compare", left_id=left.pk, right_id=right.pk)
    choices = [
        {"value": f"{choice['rig'].pk}:{model}", "label": f"{model} on {choice['rig'].name}"}
        for choice in _rig_choices(request)
        for model in choice["models"]
    ]
    context = {"choices": choices, "error": error, "text": request.POST.get("text", "")}
    return render(request, "inference/compare_new.html", context, status=400 if error else 200)


@login_required
@require_GET
def compare(request: HttpRequest, left_id: int, right_id: int) -> HttpResponse:
    sides = [
        or_404(selectors.session_get_for, request.user, left_id),
        or_404(selectors.session_get_for, request.user, right_id),
    ]
    config = {"sessions": [side.pk for side in sides], "maxChars": settings.RIGDASH.max_message_chars}
    return render(request, "inference/compare.html", {"sides": sides, "page_config": config})
