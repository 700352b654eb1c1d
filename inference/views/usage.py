"""Usage pages: admins see everyone's (or one user's with ``?user=<id>``); a user sees only their own, and asking
for anyone else's is a 404."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from inference.errors import InvalidInput
from inference.turns import usage, usage_report
from inference.turns import usage_csv as csv_report
from inference.views.http import json_error
from rigdash import numbers
from rigdash.access import is_staff


def _usage_scope(request: HttpRequest) -> tuple[int | None, int, User | None]:
    """(user id or None for everyone, days, the user shown); a non-admin asking for another user gets 404."""
    try:
        days = numbers.optional_int(request.GET.get("days"), name="days", default=30, low=1, high=usage.MAX_DAYS)
    except numbers.BadNumber as exc:
        raise InvalidInput("bad_days", exc.message) from None
    raw_user = request.GET.get("user", "")
    is_admin = is_staff(request.user)
    if not raw_user:
        return (None if is_admin else request.user.pk), days, (None if is_admin else request.user)  # type: ignore[return-value]
    try:
        user_id = numbers.parse_int(raw_user, name="user", low=1, high=2**31 - 1)
    except numbers.BadNumber:
        raise Http404("No such user") from None
    if not is_admin and user_id != request.user.pk:
        raise Http404("No such user")
    return user_id, days, get_object_or_404(User, pk=user_id)


def _page_number(request: HttpRequest) -> int:
    try:
        return numbers.optional_int(request.GET.get("page"), name="page", default=1, low=1, high=10**6)
    except numbers.BadNumber as exc:
        raise InvalidInput("bad_page", exc.message) from None


@login_required
@require_GET
def usage_page(request: HttpRequest) -> HttpResponse:
    try:
        user_id, days, shown = _usage_scope(request)
        page = _page_number(request)
    except InvalidInput as exc:
        return render(request, "inference/usage.html", {"error": exc.message}, status=400)
    report = usage_report.page_context(days=days, user_id=user_id, page=page)
    return render(
        request,
        "inference/usage.html",
        {
            **report,
            "days": days,
            "shown": shown,
            "everyone": user_id is None,
            "users": User.objects.order_by("username").values("pk", "username") if is_staff(request.user) else [],
        },
    )


@login_required
@require_GET
def usage_csv(request: HttpRequest) -> HttpResponseBase:
    """The CSV, streamed a month of rows at a time: under ASGI through an async iterator (Django reads a sync one
    whole before sending it), under WSGI through a generator."""
    try:
        user_id, days, _ = _usage_scope(request)
    except InvalidInput as exc:
        return json_error(exc.code, exc.message, 400)
    chunks = csv_report.csv_chunks(usage_report.first_day(days), user_id)
    content: Any = _async_chunks(chunks) if isinstance(request, ASGIRequest) else (make() for make in chunks)
    response = StreamingHttpResponse(content, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="rigdash-usage-{days}d.csv"'
    return response


async def _async_chunks(chunks: Iterator[Callable[[], str]]) -> AsyncIterator[str]:
    while (text := await sync_to_async(csv_report.next_chunk)(chunks)) is not None:
        yield text
