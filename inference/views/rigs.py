"""Rigs in RigDash's own pages (staff only, 404 for everyone else): list with each rig's agent, create, edit,
disable, delete, issue an agent key. Each change is audited (inference/board/rigs.py)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from inference.board import rigs
from inference.errors import InvalidInput
from inference.forms import RigForm
from inference.live import agents
from inference.models import Rig
from inference.views.http import staff_required


def _rigs_page(request: HttpRequest, *, error: str = "", new_key: tuple[Rig, str] | None = None) -> HttpResponse:
    listing = list(Rig.objects.order_by("name"))
    states = {rig.pk: agents.agent_state(rig.pk, rig.agent_key) for rig in listing}
    context = {"rows": rigs.rig_rows(listing, states), "error": error, "new_key": new_key}
    return render(request, "inference/board_rigs.html", context, status=400 if error else 200)


@staff_required
@require_http_methods(["GET"])
def rigs_page(request: HttpRequest) -> HttpResponse:
    return _rigs_page(request)


@staff_required
@require_http_methods(["GET", "POST"])
def rig_edit(request: HttpRequest, rig_id: int | None = None) -> HttpResponse:
    rig = get_object_or_404(Rig, pk=rig_id) if rig_id is not None else None
    form = RigForm(request.POST or None, instance=rig)
    status = 400 if request.method == "POST" else 200
    if request.method == "POST" and form.is_valid():
        try:
            rigs.rig_save(actor=request.user, rig=form.save(commit=False))
        except InvalidInput as exc:
            form.add_error(None, exc.message)
            status = 403 if exc.code == "forbidden" else 400
        else:
            return redirect("board:rigs")
    return render(request, "inference/board_rig_form.html", {"form": form, "rig": rig}, status=status)


@staff_required
@require_POST
def rig_delete(request: HttpRequest, rig_id: int) -> HttpResponse:
    try:
        rigs.rig_delete(actor=request.user, rig=get_object_or_404(Rig, pk=rig_id))
    except InvalidInput as exc:
        return _rigs_page(request, error=exc.message)
    return redirect("board:rigs")


@staff_required
@require_POST
def rig_agent_key(request: HttpRequest, rig_id: int) -> HttpResponse:
    rig = get_object_or_404(Rig, pk=rig_id)
    key = rigs.rig_issue_agent_key(actor=request.user, rig=rig)
    return _rigs_page(request, new_key=(rig, key))
