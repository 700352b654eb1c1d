"""Decode sweeps' pages (staff only; 404 for everyone else): the list with the start form, and one sweep's live
progress and points plotted against the calculator's prediction for the rig. Starting and cancelling are
inference's (inference/views/sweeps.py); the page's socket is ``SweepConsumer``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from inference.models import Sweep
from inference.turns import sweep_rows
from monitoring.calculator import forms, plots
from monitoring.calculator import model as calc
from monitoring.calculator import selectors as calculator_selectors
from monitoring.calculator.selectors import TurnPoint
from monitoring.calculator.views import compute
from rigdash.access import is_staff

SWEEP_TRACE = "sweep points (tokens/s per session)"


def _staff(request: HttpRequest) -> None:
    if not is_staff(request.user):
        raise Http404("No such page")


@login_required
@require_GET
def sweeps_page(request: HttpRequest) -> HttpResponse:
    _staff(request)
    rigs = calculator_selectors.enabled_rigs()
    config = {
        "start": reverse("board:api_sweep_start"),
        "rigs": [{"id": rig.pk, "name": rig.name, "slots": rig.capacity} for rig in rigs],
        "models": reverse("inference:api_rig_models", args=[0]).replace("/0/", "/{rig}/"),
    }
    context = {"rigs": rigs, "sweeps": sweep_rows.sweeps_recent(), "page_config": config}
    return render(request, "monitoring/sweeps.html", context)


def _points(sweep: Sweep) -> list[TurnPoint]:
    return [
        TurnPoint(p.turn_id or 0, p.decode_tps, p.context_mean, p.decoding_together or p.sessions, sweep.model_name)
        for p in sweep.points.filter(warmup=False).exclude(status="").order_by("step", "id")
        if p.decode_tps is not None and p.context_mean is not None
    ]


def prediction_query(sweep: Sweep, overrides: Any) -> dict[str, Any]:
    """The calculator's inputs for the sweep: the rig's own model and hardware, at the sweep's longest prompt and
    most sessions; the page's query string may change any of them (another hardware preset, a bandwidth)."""
    query: dict[str, Any] = {
        "rig": sweep.rig_id,
        "model": "rig",
        "hw": "rig",
        "context": max(sweep.contexts),
        "sessions": max(sweep.sessions),
        "prompt": max(sweep.contexts),
    }
    query.update({key: overrides.get(key) for key in overrides})
    return query


def step_predictions(sweep: Sweep, form: forms.CalculatorForm) -> list[float | None]:
    """The predicted tokens/s per session of each step as planned (its sessions, its prompt plus half the reply in
    use, the form's context allocated), for the page's measured-over-predicted column; None where it does not fit."""
    model, hw, work, _ = forms.inputs(form)
    sizer = calc.kv_sizer(model.arch, work.kv_type)
    predicted: list[float | None] = []
    for context, sessions in sweep.steps:
        in_use = context + sweep.max_tokens // 2
        rate = calc.decode_rate(
            weight_bytes=model.weight_bytes,
            kv=sizer,
            hw=hw,
            context_tokens=max(work.context_tokens, in_use),
            sessions=sessions,
            context_in_use=in_use,
            params=model.params,
        )
        predicted.append(None if rate is None else round(rate.per_session_tps, 3))
    return predicted


@login_required
@require_GET
def sweep_page(request: HttpRequest, sweep_id: int) -> HttpResponse:
    _staff(request)
    sweep = sweep_rows.sweep_get(sweep_id)
    if sweep is None:
        raise Http404("No such sweep")
    query = prediction_query(sweep, request.GET)
    form, answer = compute(query, points=_points(sweep), measured_name=SWEEP_TRACE)
    if answer is not None:
        for figure in answer["figures"].values():
            plots.with_measured(figure, SWEEP_TRACE)
    errors = [f"{name}: {' '.join(str(m) for m in messages)}" for name, messages in form.errors.items()]
    config = {
        "ws": f"/ws/monitoring/sweeps/{sweep.pk}/",
        "cancel": reverse("board:api_sweep_cancel", args=[sweep.pk]),
        "figures": answer["figures"] if answer else None,
        "predicted": step_predictions(sweep, form) if answer else None,
        "trace": SWEEP_TRACE,
    }
    context = {
        "sweep": sweep,
        "snapshot": sweep_rows.sweep_snapshot(sweep),
        "page_config": config,
        "prediction_errors": errors,
        "calculator_url": answer["url"] if answer else reverse("monitoring:calculator") + f"?rig={sweep.rig_id}",
        "csv_url": reverse("board:sweep_csv", args=[sweep.pk]),
    }
    return render(request, "monitoring/sweep.html", context)
