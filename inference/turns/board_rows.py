"""The admin board's rows: one per turn across users and rigs (who, where, state, queue position) and, for a running
turn, the progress its worker last stored (inference/live/progress.py). The lifecycle publishes a turn's row when it
is queued, starts or ends."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django.utils import timezone

from inference import events
from inference.live import progress as live_progress
from inference.models import ChatSession, Rig, Turn
from inference.queue import dispatch, placement

ENDED_ROWS = 50
ENDED_WINDOW = timedelta(hours=6)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def board_row(
    turn: Turn, *, position: int | None, progress: Mapping[str, Any] | None, waiting_reason: str = ""
) -> dict[str, Any]:
    """A turn as the board shows it; ``turn`` needs session, its owner and rig loaded. ``waiting_reason``: what its
    chat page says about why it waits (``dispatch.turns_waiting_reasons``)."""
    stats = turn.stats or {}
    progress = progress or {}
    placed = turn.session.placement == ChatSession.Placement.MODEL
    if turn.is_active:
        tokens = progress.get("tokens", 0)
        decode_tps = progress.get("decode_tps")
        prompt_tokens = progress.get("prompt_tokens")
        n_ctx = progress.get("n_ctx")
    else:
        tokens = turn.output_tokens if turn.output_tokens is not None else stats.get("output_events", 0)
        decode_tps = stats.get("decode_tps")
        prompt_tokens = turn.prompt_tokens
        n_ctx = stats.get("context_limit")
    return {
        "id": turn.pk,
        "session": turn.session_id,
        "user": turn.session.owner.get_username(),
        "user_id": turn.session.owner_id,
        "via_api": turn.session.api_key_id is not None,  # a request of the OpenAI-compatible API
        "api_client": (turn.params or {}).get("client"),  # its key's name and user agent
        # The rig that runs or ran it; a placed chat's turn that waits for one may go to any rig serving its model.
        "rig": turn.rig.name if turn.rig is not None else "any rig" if placed else turn.session.rig.name,
        "rig_id": turn.rig_id if turn.rig_id is not None or placed else turn.session.rig_id,
        "placed": placed,
        "model": turn.session.model_name,
        "status": turn.status,
        "finish_reason": turn.finish_reason,
        "queue_position": position,
        "waiting_reason": waiting_reason,
        "tokens": tokens,
        "decode_tps": decode_tps,
        "prompt_tokens": prompt_tokens,
        **live_progress.context_fill(prompt_tokens, tokens, n_ctx),
        "history_truncated": stats.get("history_truncated"),  # the backend read less of the prompt than was sent
        "created_at": _iso(turn.created_at),
        "started_at": _iso(turn.started_at),
        "finished_at": _iso(turn.finished_at),
    }


def _rows(turns: Iterable[Turn]) -> list[dict[str, Any]]:
    turns = list(turns)
    positions: dict[int, int] = {}
    orders: dict[int, dict[int, int]] = {}  # each rig's waiting turns' places, read once per rig
    serving: dict[str, list[Rig]] = {}  # the rigs serving a placed chat's model, read once per model

    def places(rig: Rig) -> dict[int, int]:
        if rig.pk not in orders:
            orders[rig.pk] = dispatch.places_on(rig)
        return orders[rig.pk]

    def rigs_serving(model: str) -> list[Rig]:
        if model not in serving:
            serving[model] = placement.rigs_serving(model)
        return serving[model]

    for turn in turns:
        if turn.status == Turn.Status.QUEUED and turn.dispatched_at is None:
            rigs = dispatch.waiting_places(turn, serving=rigs_serving)
            if (found := dispatch.best_place(turn.pk, rigs, places)) is not None:
                positions[turn.pk] = found
    for turn in turns:
        if turn.status == Turn.Status.QUEUED and turn.dispatched_at is not None:
            positions[turn.pk] = 0
    reasons = dispatch.turns_waiting_reasons(turns, serving=rigs_serving)  # the queued turns'
    progress = live_progress.read_many([t.pk for t in turns if t.status in Turn.RUNNING])
    return [
        board_row(t, position=positions.get(t.pk), progress=progress.get(t.pk), waiting_reason=reasons.get(t.pk, ""))
        for t in turns
    ]


def _with_people() -> Any:
    return Turn.objects.select_related("session", "session__owner", "session__rig", "rig")


def board_rows() -> list[dict[str, Any]]:
    """Every active turn (oldest first), then the turns that ended lately (newest first)."""
    active = _with_people().filter(status__in=Turn.ACTIVE).order_by("created_at", "id")
    ended = (
        _with_people()
        .exclude(status__in=Turn.ACTIVE)
        .filter(finished_at__gte=timezone.now() - ENDED_WINDOW)
        .order_by("-finished_at", "-id")[:ENDED_ROWS]
    )
    return _rows([*active, *ended])


def board_row_for(turn_id: int) -> dict[str, Any] | None:
    rows = board_rows_for([turn_id])
    return rows[0] if rows else None


def board_rows_for(turn_ids: list[int]) -> list[dict[str, Any]]:
    """The rows of these turns (those that exist), in the order given: one query for the turns whatever their number,
    then the queue positions once per rig."""
    found = {turn.pk: turn for turn in _with_people().filter(pk__in=turn_ids)}
    return _rows([found[turn_id] for turn_id in turn_ids if turn_id in found])


def publish_turn(turn_id: int) -> None:
    """Send the turn's current row to every board (when it is queued, starts or ends); nothing when no board is
    open anywhere (the row's queries would be on every submit's way)."""
    publish_turns([turn_id])


def publish_turns(turn_ids: list[int]) -> None:
    """``publish_turn`` for several turns: Redis is asked once whether a board is open, and the rows go out in one
    round trip."""
    if not events.board_watched():
        return
    rows = board_rows_for(turn_ids)
    if rows:
        events.board_turns_sync(rows=rows)


def rigs_summary() -> list[dict[str, Any]]:
    return [
        {"id": r.pk, "name": r.name, "slots": r.capacity, "server_slots": r.server_slots, "enabled": r.enabled}
        for r in Rig.objects.all()
    ]
