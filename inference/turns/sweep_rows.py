"""Reads of decode sweeps (inference/board/sweeps.py runs them): a sweep's state and its measured points, as the
sweep page, its socket, the board and the CSV export show them."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

from inference.models import Sweep, SweepPoint

CSV_COLUMNS = (
    "sweep",
    "step",
    "context_target",
    "sessions",
    "turn",
    "status",
    "prompt_tokens",
    "output_tokens",
    "context_mean",
    "decoding_together",
    "decode_tps",
)


def point_row(point: SweepPoint) -> dict[str, Any]:
    return {
        "step": point.step,
        "context_target": point.context_target,
        "sessions": point.sessions,
        "turn": point.turn_id,
        "status": point.status,
        "prompt_tokens": point.prompt_tokens,
        "output_tokens": point.output_tokens,
        "context_mean": point.context_mean,
        "decoding_together": point.decoding_together,
        "decode_tps": point.decode_tps,
    }


def sweep_snapshot(sweep: Sweep, *, points: bool = True) -> dict[str, Any]:
    """A sweep's state for a browser; ``points``: with every measured point (the steps that ended)."""
    steps = sweep.steps
    running = steps[sweep.step] if sweep.status == Sweep.Status.RUNNING and sweep.step < len(steps) else None
    snapshot: dict[str, Any] = {
        "id": sweep.pk,
        "rig": sweep.rig_id,
        "rig_name": sweep.rig.name,
        "owner": sweep.owner.get_username(),
        "model": sweep.model_name,
        "status": sweep.status,
        "step": sweep.step,
        "steps": len(steps),
        "running_step": {"context": running[0], "sessions": running[1]} if running else None,
        "contexts": sweep.contexts,
        "sessions": sweep.sessions,
        "max_tokens": sweep.max_tokens,
        "forced": sweep.forced,
        "error": sweep.error,
        "created_at": sweep.created_at.isoformat() if sweep.created_at else None,
        "finished_at": sweep.finished_at.isoformat() if sweep.finished_at else None,
    }
    if points:
        measured = sweep.points.filter(warmup=False).exclude(status="").order_by("step", "id")
        snapshot["points"] = [point_row(point) for point in measured]
    return snapshot


def sweep_get(sweep_id: Any) -> Sweep | None:
    if isinstance(sweep_id, bool) or not isinstance(sweep_id, int) or not 0 < sweep_id < 2**63:
        return None
    return Sweep.objects.select_related("rig", "owner").filter(pk=sweep_id).first()


def sweeps_recent(*, limit: int = 20) -> list[Sweep]:
    return list(Sweep.objects.select_related("rig", "owner").order_by("-created_at", "-id")[:limit])


def sweeps_running() -> list[dict[str, Any]]:
    """The running sweeps, for the board's snapshot."""
    running = Sweep.objects.select_related("rig", "owner").filter(status=Sweep.Status.RUNNING)
    return [sweep_snapshot(sweep, points=False) for sweep in running]


def sweep_csv_chunks(sweep: Sweep, *, rows: int = 500) -> Iterator[str]:
    """The sweep's CSV: the header, then its measured points (ended or not) ``rows`` at a time, each chunk one query.
    Points are stored step by step, so their ids run in step order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    yield out.getvalue()
    after = 0
    while True:
        chunk = list(sweep.points.filter(warmup=False, pk__gt=after).order_by("pk")[:rows])
        if not chunk:
            return
        after = chunk[-1].pk
        out.seek(0)
        out.truncate()
        for point in chunk:
            row = point_row(point)
            writer.writerow((sweep.pk, *("" if row[name] is None else row[name] for name in CSV_COLUMNS[1:])))
        yield out.getvalue()
