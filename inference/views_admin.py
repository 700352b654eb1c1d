"""Admin pages (board, users, quotas, audit log; staff only, 404 for everyone else) and usage pages.

Usage: admins see everyone's (or one user's with ``?user=<id>``); a user sees only their own, and
asking for anyone else's is a 404.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group, User
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from inference import board, quotas, services, services_admin, usage
from inference.audit import audit_recent
from inference.forms import QuotaForm, UserCreateForm, UserGroupsForm
from inference.models import Quota

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    """Logged-in staff only: anonymous people go to the login page, everyone else gets a 404."""

    @login_required
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not (request.user.is_active and request.user.is_staff):
            raise Http404("No such page")
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


def _json_error(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


# The board -------------------------------------------------------------------------------------------


@staff_required
@require_GET
def board_page(request: HttpRequest) -> HttpResponse:
    return render(request, "inference/board.html", {"page_config": {"ws": "/ws/board/"}})


@staff_required
@require_GET
def api_board_turns(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"turns": board.board_rows(), "rigs": board.rigs_summary()})


@staff_required
@require_POST
def api_board_cancel(request: HttpRequest, turn_id: int) -> HttpResponse:
    try:
        turn = services_admin.admin_turn_cancel(actor=request.user, turn_id=turn_id)
    except services_admin.NotFound as exc:
        return _json_error(exc.code, exc.message, 404)
    except services.InvalidInput as exc:
        return _json_error(exc.code, exc.message, 409 if exc.code == "turn_finished" else 400)
    return JsonResponse({"turn": board.board_row_for(turn.pk)}, status=202)


# Users -----------------------------------------------------------------------------------------------


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
        services_admin.user_create(
            actor=request.user,
            username=form.cleaned_data["username"],
            password=form.cleaned_data["password"],
            is_staff=form.cleaned_data["is_staff"],
            groups=form.cleaned_data["groups"],
        )
    except services.InvalidInput as exc:
        return _users_page(request, form=form, error=exc.message, status=400)
    return redirect("board:users")


USER_ACTIONS = {
    "deactivate": lambda actor, user: services_admin.user_set_active(actor=actor, user=user, active=False),
    "activate": lambda actor, user: services_admin.user_set_active(actor=actor, user=user, active=True),
    "promote": lambda actor, user: services_admin.user_set_staff(actor=actor, user=user, staff=True),
    "demote": lambda actor, user: services_admin.user_set_staff(actor=actor, user=user, staff=False),
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
                raise services.InvalidInput("bad_groups", "Pick existing groups.")
            services_admin.user_set_groups(actor=request.user, user=user, groups=form.cleaned_data["groups"])
        elif action in USER_ACTIONS:
            USER_ACTIONS[action](request.user, user)
        else:
            raise services.InvalidInput("bad_action", f"Unknown action {action!r}.")
    except services.InvalidInput as exc:
        return _users_page(request, error=exc.message, status=400)
    return redirect("board:users")


# Quotas ----------------------------------------------------------------------------------------------


def _quotas_page(
    request: HttpRequest, form: QuotaForm, *, editing: Quota | None = None, status: int = 200
) -> HttpResponse:
    listing = Quota.objects.select_related("user", "group").order_by("group__name", "user__username", "id")
    return render(
        request,
        "inference/board_quotas.html",
        {"quotas": listing, "form": form, "editing": editing, "limit_names": quotas.LIMIT_NAMES},
        status=status,
    )


@staff_required
@require_http_methods(["GET", "POST"])
def quotas_page(request: HttpRequest, quota_id: int | None = None) -> HttpResponse:
    quota = get_object_or_404(Quota, pk=quota_id) if quota_id is not None else None
    before = services_admin.quota_values(quota) if quota else None
    if request.method == "GET":
        return _quotas_page(request, QuotaForm(instance=quota), editing=quota)
    form = QuotaForm(request.POST, instance=quota)
    if not form.is_valid():
        return _quotas_page(request, form, editing=quota, status=400)
    try:
        services_admin.quota_save(actor=request.user, quota=form.instance, before=before)
    except services.InvalidInput as exc:
        form.add_error(None, exc.message)
        return _quotas_page(request, form, editing=quota, status=400)
    return redirect("board:quotas")


@staff_required
@require_POST
def quota_delete(request: HttpRequest, quota_id: int) -> HttpResponse:
    services_admin.quota_delete(actor=request.user, quota=get_object_or_404(Quota, pk=quota_id))
    return redirect("board:quotas")


# Audit log -------------------------------------------------------------------------------------------


@staff_required
@require_GET
def audit_page(request: HttpRequest) -> HttpResponse:
    action = request.GET.get("action", "")[:64]
    return render(request, "inference/board_audit.html", {"entries": audit_recent(action=action), "action": action})


# Usage -----------------------------------------------------------------------------------------------


def _usage_scope(request: HttpRequest) -> tuple[int | None, int, User | None]:
    """(user id or None for everyone, days, the user shown); a non-admin asking for another user gets 404."""
    try:
        days = int(request.GET.get("days", 30))
    except ValueError:
        raise services.InvalidInput("bad_days", "days must be a whole number.") from None
    if not 1 <= days <= usage.MAX_DAYS:
        raise services.InvalidInput("bad_days", f"days must be between 1 and {usage.MAX_DAYS}.")
    raw_user = request.GET.get("user", "")
    is_admin = request.user.is_staff
    if not raw_user:
        return (None if is_admin else request.user.pk), days, (None if is_admin else request.user)  # type: ignore[return-value]
    if not raw_user.isdigit() or (not is_admin and int(raw_user) != request.user.pk):
        raise Http404("No such user")
    return int(raw_user), days, get_object_or_404(User, pk=int(raw_user))


@login_required
@require_GET
def usage_page(request: HttpRequest) -> HttpResponse:
    try:
        user_id, days, shown = _usage_scope(request)
    except services.InvalidInput as exc:
        return render(request, "inference/usage.html", {"error": exc.message}, status=400)
    rows = usage.aggregate_usage(usage.usage_records(days=days, user_id=user_id))
    day_list = usage.day_range(days, today=timezone.now().date())
    figures = usage.usage_figures(rows, days=day_list, per_user=user_id is None)
    return render(
        request,
        "inference/usage.html",
        {
            "rows": rows,
            "totals": usage.usage_totals(rows),
            "days": days,
            "shown": shown,
            "everyone": user_id is None,
            "users": User.objects.order_by("username") if request.user.is_staff else [],
            "figures": figures,
        },
    )


@login_required
@require_GET
def usage_csv(request: HttpRequest) -> HttpResponse:
    try:
        user_id, days, _ = _usage_scope(request)
    except services.InvalidInput as exc:
        return _json_error(exc.code, exc.message, 400)
    rows = usage.aggregate_usage(usage.usage_records(days=days, user_id=user_id))
    response = HttpResponse(usage.usage_csv(rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="rigdash-usage-{days}d.csv"'
    return response
