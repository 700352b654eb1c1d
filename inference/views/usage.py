"""Usage pages: admins see everyone's (or one user's with ``?user=<id>``); a user sees only their own, and asking
for anyone else's is a 404."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from inference.errors import InvalidInput
from inference.turns import usage
from inference.views.http import json_error
from rigdash.access import is_staff


def _usage_scope(request: HttpRequest) -> tuple[int | None, int, User | None]:
    """(user id or None for everyone, days, the user shown); a non-admin asking for another user gets 404."""
    try:
        days = int(request.GET.get("days", 30))
    except ValueError:
        raise InvalidInput("bad_days", "days must be a whole number.") from None
    if not 1 <= days <= usage.MAX_DAYS:
        raise InvalidInput("bad_days", f"days must be between 1 and {usage.MAX_DAYS}.")
    raw_user = request.GET.get("user", "")
    is_admin = is_staff(request.user)
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
    except InvalidInput as exc:
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
            "users": User.objects.order_by("username") if is_staff(request.user) else [],
            "figures": figures,
        },
    )


@login_required
@require_GET
def usage_csv(request: HttpRequest) -> HttpResponse:
    try:
        user_id, days, _ = _usage_scope(request)
    except InvalidInput as exc:
        return json_error(exc.code, exc.message, 400)
    rows = usage.aggregate_usage(usage.usage_records(days=days, user_id=user_id))
    response = HttpResponse(usage.usage_csv(rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="rigdash-usage-{days}d.csv"'
    return response
