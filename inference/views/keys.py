"""The API keys page: a user creates, lists and revokes their own keys; staff also see and revoke everyone's."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from inference.board import apikeys
from inference.errors import InvalidInput
from inference.forms import ApiKeyForm
from inference.models import ApiKey
from inference.views.http import or_404
from rigdash.access import is_staff


def _page(request: HttpRequest, form: ApiKeyForm, *, new_key: apikeys.NewKey | None = None, status: int = 200,
          error: str = "") -> HttpResponse:  # fmt: skip
    now = timezone.now()
    mine = list(apikeys.api_key_list_for(request.user))  # type: ignore[arg-type]
    usage = apikeys.api_key_usage(mine)
    keys = [(key, key.state(now), usage.get(key.pk)) for key in mine]
    context: dict[str, Any] = {"form": form, "keys": keys, "new_key": new_key, "error": error,
                               "usage_days": apikeys.USAGE_DAYS, "storage_choices": ApiKey.Storage.choices}  # fmt: skip
    if is_staff(request.user):
        others = apikeys.api_key_list_all().exclude(owner_id=request.user.pk).filter(revoked_at__isnull=True)
        context["all_keys"] = [(key, key.state(now)) for key in others[:500]]
    return render(request, "inference/api_keys.html", context, status=status)


@never_cache  # the page that shows a new key must not be kept by a browser or proxy cache
@login_required
@require_http_methods(["GET", "POST"])
def api_keys_page(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _page(request, ApiKeyForm())
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    try:
        new_key = apikeys.api_key_create(
            owner=request.user,  # type: ignore[arg-type]
            name=form.cleaned_data["name"],
            expires_in_days=form.cleaned_data["expires_in_days"],
            storage=form.cleaned_data["storage"],
        )
    except InvalidInput as exc:
        return _page(request, form, status=400, error=exc.message)
    return _page(request, ApiKeyForm(), new_key=new_key, status=201)


@login_required
@require_POST
def api_key_storage(request: HttpRequest, key_id: int) -> HttpResponse:
    try:
        or_404(apikeys.api_key_storage_set, key_id=key_id, storage=request.POST.get("storage", ""), actor=request.user)
    except InvalidInput as exc:
        return _page(request, ApiKeyForm(), status=400, error=exc.message)
    return redirect("inference:api_keys")


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    try:
        or_404(apikeys.api_key_revoke, key_id=key_id, actor=request.user)
    except InvalidInput as exc:
        return _page(request, ApiKeyForm(), status=403, error=exc.message)
    return redirect("inference:api_keys")
