"""The decode calculator's page (/monitoring/calculator/) and JSON feed (/api/calculator): thin over
``forms`` (inputs), ``model`` (arithmetic), ``plots`` and ``selectors``."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from inference.models import Rig
from monitoring.calculator import forms, plots, presets, selectors
from monitoring.calculator import model as calc
from rigdash import numbers

GROUPS = [
    (
        "Model",
        "model layers heads kv_heads embd head_dim sliding_layers window recurrent_layers state_mib params_b quant "
        "weight_gib kv_type",
    ),
    ("Workload", "context sessions prompt"),
    ("Hardware", "hw vram_gib vram_gbs reserved_gib tflops host ram_gib ram_gbs link link_gbs spill"),
    ("Power and price", "watts price"),
]


def _rig(query: Any) -> tuple[Rig | None, str]:
    raw = str(query.get("rig", "")).strip()
    if not raw:
        return None, ""
    try:
        rig_id = numbers.parse_int(raw, name="rig", low=1, high=2**31 - 1)  # the primary key's range
    except numbers.BadNumber:
        return None, f"no enabled rig with id {raw[:20]!r}"
    rig = Rig.objects.filter(pk=rig_id, enabled=True).first()
    return rig, "" if rig else f"no enabled rig with id {raw!r}"


def _result(prediction: calc.Prediction) -> dict[str, Any]:
    out = dataclasses.asdict(prediction)
    out["placement"]["spill_fraction"] = prediction.placement.spill_fraction
    out["reading_tps"] = calc.READING_TPS
    return out


def compute(
    query: Any, *, points: list[selectors.TurnPoint] | None = None, measured_name: str = plots.MEASURED_NAME
) -> tuple[forms.CalculatorForm, dict[str, Any] | None]:
    """The bound form and, when it is valid, the whole answer: result, figures, the query that restores it.
    ``points``: the measured points to draw (by default the rig's latest finished turns)."""
    rig, rig_error = _rig(query)
    facts = selectors.rig_facts(rig) if rig else None
    form = forms.bind(query, facts)
    if rig_error:
        form.add_error("rig", rig_error)
    if not form.is_valid():
        return form, None
    model, hw, work, price = forms.inputs(form)
    try:
        prediction = calc.predict(model, hw, work, price_per_kwh=price)
    except ValueError as exc:  # what the form's own checks let through
        form.add_error(None, str(exc))
        return form, None
    if points is None:
        points = selectors.turn_points(rig) if rig else []
    query_string = urlencode(forms.query_of(form))
    return form, {
        "inputs": forms.query_of(form),
        "query": query_string,
        "url": f"{reverse('monitoring:calculator')}?{query_string}",
        "result": _result(prediction),
        "figures": {
            "context": plots.context_figure(model, hw, work, prediction, points, measured_name=measured_name),
            "sessions": plots.sessions_figure(model, hw, work, prediction, points, measured_name=measured_name),
        },
        "measured": {"rig": rig.pk if rig else None, "points": len(points)},
    }


def _errors(form: forms.CalculatorForm) -> dict[str, list[str]]:
    return {field: [str(message) for message in messages] for field, messages in form.errors.items()}


@require_GET
def api_calculator(request: HttpRequest) -> JsonResponse:
    """Every output for the inputs in the query string; 400 naming each bad field (nothing computed)."""
    if not request.user.is_authenticated:
        return JsonResponse({"error": {"code": "not_authenticated", "message": "Log in first."}}, status=401)
    form, payload = compute(request.GET)
    if payload is None:
        errors = _errors(form)
        message = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in errors.items())
        return JsonResponse({"error": {"code": "invalid_input", "message": message, "fields": errors}}, status=400)
    return JsonResponse(payload)


@login_required
@require_GET
def calculator_page(request: HttpRequest) -> HttpResponse:
    form, payload = compute(request.GET)
    rigs = [selectors.rig_facts(rig).as_json() for rig in selectors.enabled_rigs()]
    config = {
        "api": reverse("api_calculator"),
        "presets": presets.as_json(),
        "rigs": rigs,
        "answer": payload,
        "errors": None if payload else _errors(form),
    }
    groups = [(legend, [form[name] for name in names.split()]) for legend, names in GROUPS]
    selected = str(form.data.get("rig") or "")
    context = {
        "form": form,
        "rigs": rigs,
        "groups": groups,
        "page_config": config,
        "selected_rig": numbers.optional_int(selected, name="rig", default=0) if _rig(form.data)[0] else None,
    }
    return render(
        request,
        "monitoring/calculator.html",
        context,
        status=200 if payload else 400,
    )
