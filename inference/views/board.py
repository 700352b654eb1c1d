"""Admin pages (board, users, quotas, audit log): staff only, 404 for everyone else."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from inference.board import actions, audit_pages
from inference.errors import InvalidInput, NotFound
from inference.forms import QuotaForm, UserCreateForm, UserGroupsForm
from inference.models import Quota
from inference.queue import quotas, ratelimits
from inference.turns import board_rows
from inference.views.http import json_error, staff_required


def _status(exc: InvalidInput) -> int:
    """A refusal by role is 403; any other bad input 400."""
    return 403 if exc.code == "forbidden" else 400


@staff_required
@require_GET
def board_page(request: HttpRequest) -> HttpResponse:
    return render(request, "inference/board.html", {"page_config": {"ws": "/ws/board/"}})


@staff_required
@require_GET
def api_board_turns(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"turns": board_rows.board_rows(), "rigs": board_rows.rigs_summary()})


@staff_required
@require_POST
def api_board_cancel(request: HttpRequest, turn_id: int) -> HttpResponse:
    try:
        turn = actions.admin_turn_cancel(actor=request.user, turn_id=turn_id)
    except NotFound as exc:
        return json_error(exc.code, exc.message, 404)
    except InvalidInput as exc:
        return json_error(exc.code, exc.message, {"turn_finished": 409, "forbidden": 403}.get(exc.code, 400))
    return JsonResponse({"turn": board_rows.board_row_for(turn.pk)}, status=202)


def _users_page(
    request: HttpRequest, *, form: UserCreateForm | None = None, error: str = "", status: int = 200
) -> HttpResponse:
    users = User.objects.order_by("username").prefetch_related("groups")
    return render(
        request,
        "inference/board_users.html",
        {
            "users": users,
            "groups": Group.objects.order_by("name"),
            "form": form or UserCreateForm(),
            "error": error,
        },
        status=status,
    )


@staff_required
@require_http_methods(["GET", "POST"])
def users_page(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _users_page(request)
    form = UserCreateForm(request.POST)
    if not form.is_valid():
        return _users_page(request, form=form, status=400)
    try:
        actions.user_create(
            actor=request.user,
            username=form.cleaned_data["username"],
            password=form.cleaned_data["password"],
            is_staff=form.cleaned_data["is_staff"],
            groups=form.cleaned_data["groups"],
        )
    except InvalidInput as exc:
        return _users_page(request, form=form, error=exc.message, status=_status(exc))
    return redirect("board:users")


USER_ACTIONS = {
    "deactivate": lambda actor, user: actions.user_set_active(actor=actor, user=user, active=False),
    "activate": lambda actor, user: actions.user_set_active(actor=actor, user=user, active=True),
    "promote": lambda actor, user: actions.user_set_staff(actor=actor, user=user, staff=True),
    "demote": lambda actor, user: actions.user_set_staff(actor=actor, user=user, staff=False),
}


@staff_required
@require_POST
def user_action(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(User, pk=user_id)
    action = request.POST.get("action", "")
    try:
        if action == "groups":
            form = UserGroupsForm(request.POST)
            if not form.is_valid():
                raise InvalidInput("bad_groups", "Pick existing groups.")
            actions.user_set_groups(actor=request.user, user=user, groups=form.cleaned_data["groups"])
        elif action in USER_ACTIONS:
            USER_ACTIONS[action](request.user, user)
        else:
            raise InvalidInput("bad_action", f"Unknown action {action!r}.")
    except InvalidInput as exc:
        return _users_page(request, error=exc.message, status=_status(exc))
    return redirect("board:users")


def _quotas_page(
    request: HttpRequest, form: QuotaForm, *, editing: Quota | None = None, error: str = "", status: int = 200
) -> HttpResponse:
    listing = list(Quota.objects.select_related("user", "group").order_by("group__name", "user__username", "id"))
    rate = ratelimits.board_rate_view(listing)
    return render(
        request,
        "inference/board_quotas.html",
        {"quotas": listing, "form": form, "editing": editing, "limit_names": quotas.LIMIT_NAMES, "error": error,
         "rate_names": ratelimits.LIMIT_WORDS, "rate_refusals": rate},
        status=status,
    )  # fmt: skip


@staff_required
@require_http_methods(["GET", "POST"])
def quotas_page(request: HttpRequest, quota_id: int | None = None) -> HttpResponse:
    quota = get_object_or_404(Quota, pk=quota_id) if quota_id is not None else None
    before = actions.quota_values(quota) if quota else None
    if request.method == "GET":
        return _quotas_page(request, QuotaForm(instance=quota), editing=quota)
    form = QuotaForm(request.POST, instance=quota)
    if not form.is_valid():
        return _quotas_page(request, form, editing=quota, status=400)
    try:
        actions.quota_save(actor=request.user, quota=form.instance, before=before)
    except InvalidInput as exc:
        form.add_error(None, exc.message)
        return _quotas_page(request, form, editing=quota, status=_status(exc))
    return redirect("board:quotas")


@staff_required
@require_POST
def quota_delete(request: HttpRequest, quota_id: int) -> HttpResponse:
    try:
        actions.quota_delete(actor=request.user, quota=get_object_or_404(Quota, pk=quota_id))
    except InvalidInput as exc:
        return _quotas_page(request, QuotaForm(), error=exc.message, status=_status(exc))
    return redirect("board:quotas")


@staff_required
@require_GET
def audit_page(request: HttpRequest) -> HttpResponse:
    action = request.GET.get("action", "")[:64]
    page = audit_pages.audit_page(action=action, before=request.GET.get("before", "")[:20])
    return render(request, "inference/board_audit.html", {**page, "action": action})
