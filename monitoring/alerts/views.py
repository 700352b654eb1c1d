"""The alerts page (firing, history, rules, channels, silences, deliveries) and its staff forms: staff only."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.forms import ModelForm
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from inference.audit import audit_record
from inference.errors import InvalidInput, NotFound
from monitoring.alerts import selectors, services
from monitoring.alerts.forms import AlertChannelForm, AlertRuleForm, SilenceForm
from monitoring.alerts.models import AlertChannel, AlertRule
from rigdash.access import is_staff, staff_now

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    """Logged-in staff, read again from the database: anonymous people go to the login page, others get a 404."""

    @login_required
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_staff(request.user) or staff_now(request.user) is None:
            raise Http404("No such page")
        return view(request, *args, **kwargs)

    return wrapped


@staff_required
@require_GET
def alerts_page(request: HttpRequest) -> HttpResponse:
    context = selectors.page_context(timezone.now())
    context |= {"rule_form": AlertRuleForm(), "channel_form": AlertChannelForm(), "silence_form": SilenceForm()}
    return render(request, "alerts/alerts.html", context)


def _edit(request: HttpRequest, form_class: type[ModelForm], instance: Any, what: str) -> HttpResponse:  # type: ignore[type-arg]
    form = form_class(request.POST or None, instance=instance)
    if request.method == "POST":
        if form.is_valid():
            saved = form.save()
            audit_record(actor=request.user, action=f"alert.{what}.save", target=f"{what}:{saved.pk}")
            return redirect("alerts:page")
        return render(request, "alerts/edit.html", {"form": form, "what": what}, status=400)
    return render(request, "alerts/edit.html", {"form": form, "what": what})


@staff_required
@require_http_methods(["GET", "POST"])
def rule_edit(request: HttpRequest, rule_id: int | None = None) -> HttpResponse:
    rule = get_object_or_404(AlertRule, pk=rule_id) if rule_id is not None else None
    return _edit(request, AlertRuleForm, rule, "rule")


@staff_required
@require_http_methods(["GET", "POST"])
def channel_edit(request: HttpRequest, channel_id: int | None = None) -> HttpResponse:
    channel = get_object_or_404(AlertChannel, pk=channel_id) if channel_id is not None else None
    return _edit(request, AlertChannelForm, channel, "channel")


@staff_required
@require_POST
def rule_delete(request: HttpRequest, rule_id: int) -> HttpResponse:
    get_object_or_404(AlertRule, pk=rule_id).delete()
    audit_record(actor=request.user, action="alert.rule.delete", target=f"rule:{rule_id}")
    return redirect("alerts:page")


@staff_required
@require_POST
def channel_delete(request: HttpRequest, channel_id: int) -> HttpResponse:
    get_object_or_404(AlertChannel, pk=channel_id).delete()
    audit_record(actor=request.user, action="alert.channel.delete", target=f"channel:{channel_id}")
    return redirect("alerts:page")


@staff_required
@require_POST
def alert_acknowledge(request: HttpRequest, alert_id: int) -> HttpResponse:
    try:
        services.alert_acknowledge(actor=request.user, alert_id=alert_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    return redirect("alerts:page")


@staff_required
@require_POST
def silence_new(request: HttpRequest) -> HttpResponse:
    form = SilenceForm(request.POST)
    if not form.is_valid():
        return render(request, "alerts/edit.html", {"form": form, "what": "silence"}, status=400)
    data = form.cleaned_data
    try:
        services.silence_create(actor=request.user, rule_id=data["rule"].pk if data["rule"] else None,
                                rig_id=data["rig"].pk if data["rig"] else None, minutes=data["minutes"],
                                reason=data["reason"])  # fmt: skip
    except InvalidInput as exc:
        return HttpResponse(exc.message, status=400, content_type="text/plain")
    return redirect("alerts:page")


@staff_required
@require_POST
def silence_end(request: HttpRequest, silence_id: int) -> HttpResponse:
    try:
        services.silence_end(actor=request.user, silence_id=silence_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    return redirect("alerts:page")
