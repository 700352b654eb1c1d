"""Every message that reaches a browser from the inference app is built and sent here, and only here.

Groups: one per chat session (``chat.session.<id>``); a chat page joins its session's group.
One per rig's model management (``rig.<id>.models``); only staff sockets join it.
Event types (one consumer handler each):
- ``chat.turn_queued``  a new turn was stored: its snapshot.
- ``chat.turn_state``   a turn changed phase (queued -> prompt -> decoding), or a waiting turn's place in
                        its rig's fair queue changed (``queue_position``: 0 starting, n: n-1 wait ahead).
- ``chat.token``        a coalesced batch of tokens: turn id, seq_from..seq_to, and ``frame``, the browser's
                        ``token`` frame (turn, seq_from, seq_to, text, running stats) serialised once.
- ``chat.turn_end``     a turn ended: status, finish reason, error, final stats and last seq.
- ``models.pull_progress``  a model download step: pull id, model, status, digest, total, completed.
- ``models.pull_end``       a download ended: ok, or error {code, message}.
- ``models.changed``        a model was deleted or unloaded (pages re-read the rig's models).

The admin board (group ``board``, staff sockets only; inference/consumers/board.py):
- ``board.turn``      one turn's board row (user, rig, model, state, tokens...) when it is queued, starts or ends.
- ``board.progress``  a running turn's tokens so far, tokens/s and context fill, at most ~2 per second.
- ``board.queue``     a rig's waiting turns, their queue positions and why those held wait, after each dispatch.
- ``board.sweep``     a decode sweep's state (inference/turns/sweep_rows.py), when it starts, a step starts or ends.

A decode sweep's page (group ``sweep.<id>``, staff sockets only; monitoring/consumers.py): ``sweep.progress``, the
sweep's state and the points its last step measured, when it starts, a step starts or ends, and when it ends.

Per user (group ``user.<id>``, every socket of that user): ``user.revoked``: the user was deactivated or
their rights changed; sockets re-check and close what they may no longer see.

To the monitoring sampler (group ``rigs.activity``, no browser joins it): ``rig.decoding``: a turn on a rig got its
first token; the sampler, which reads an idle rig less often, samples that rig at once (monitoring/sampler.py).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

import orjson
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from inference.event_types import (
    BoardProgress,
    BoardQueue,
    BoardSweep,
    BoardTurn,
    ChatToken,
    ChatTurnEnd,
    ChatTurnQueued,
    ChatTurnState,
    Event,
    ModelsChanged,
    ModelsPullEnd,
    ModelsPullProgress,
    RigDecoding,
    RigsChanged,
    SweepProgress,
    TokenFrame,
    UserRevoked,
)
from rigdash.groups import user_group


def session_group(session_id: int) -> str:
    return f"chat.session.{session_id}"


BOARD_GROUP = "board"


def _layer() -> Any:
    return get_channel_layer()


def token_frame(
    *,
    turn_id: int,
    seq_from: int,
    seq_to: int,
    text: str,
    stats: dict[str, Any],
    thinking: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
    logprobs: list[Any] | None = None,
) -> str:
    """The browser's ``token`` frame, serialised once per batch rather than once per watching socket. ``thinking``
    (a reasoning model's thoughts in this batch) is there only when the batch has some; so are an API client's
    ``tool_calls`` deltas and ``logprobs`` (OpenAI's shapes, for the /v1/ stream; a page ignores them)."""
    frame: TokenFrame = {
        "type": "token", "turn": turn_id, "seq_from": seq_from, "seq_to": seq_to, "text": text, "stats": stats,
    }  # fmt: skip
    if thinking:
        frame["thinking"] = thinking
    if tool_calls:
        frame["tool_calls"] = tool_calls
    if logprobs:
        frame["logprobs"] = logprobs
    return orjson.dumps(frame).decode()


def token_batch_message(
    *,
    turn_id: int,
    seq_from: int,
    seq_to: int,
    text: str,
    stats: dict[str, Any],
    thinking: str = "",
    tool_calls: list[dict[str, Any]] | None = None,
    logprobs: list[Any] | None = None,
) -> ChatToken:
    """``chat.token``: the ready frame, and the turn and seqs for anything that filters on them."""
    frame = token_frame(turn_id=turn_id, seq_from=seq_from, seq_to=seq_to, text=text, stats=stats, thinking=thinking,
                        tool_calls=tool_calls, logprobs=logprobs)  # fmt: skip
    return {"type": "chat.token", "turn": turn_id, "seq_from": seq_from, "seq_to": seq_to, "frame": frame}


def pubsub_publication(group: str, message: Event) -> tuple[str, bytes] | None:
    """The Redis channel and bytes that ``group_send(group, message)`` would publish, when the layer is a pub/sub
    layer on ``settings.REDIS_URL`` (rigdash/channel_layer.py); None otherwise. The worker publishes a token batch
    in the same Redis round trip as its append to the live list."""
    from rigdash import channel_layer  # channels_redis: imported at first use (a worker preloads it, rigdash.celery)

    return channel_layer.publication(group, message)


def board_watched() -> bool:
    """Whether any process has a board socket open (one Redis PUBSUB NUMSUB; True when the layer is not ours).

    A board subscribes before it reads its snapshot from the database, so a change committed while nobody was
    subscribed is in the snapshot of whichever board opens next: building and sending its row can be skipped."""
    from rigdash import channel_layer

    channel = channel_layer.group_channel(BOARD_GROUP)
    if channel is None:
        return True
    counts: list[tuple[bytes, int]] = _sync_redis(settings.REDIS_URL).pubsub_numsub(channel)  # type: ignore[assignment]
    return bool(counts and counts[0][1])


@functools.cache
def _sync_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, health_check_interval=30)


def send_sync(*messages: tuple[str, Event]) -> None:
    """``group_send`` from synchronous code (services, views, tasks), in order, in one pipelined round trip.

    The PUBLISHes go out from the calling thread: ``async_to_sync(group_send)`` would hop to the event loop and wait
    for it, and in the web's database thread that is the loop that also writes every socket's frames."""
    publications = [pubsub_publication(group, message) for group, message in messages]
    if all(p is not None for p in publications):
        pipe = _sync_redis(settings.REDIS_URL).pipeline(transaction=False)
        for publication in publications:
            assert publication is not None
            pipe.publish(*publication)
        pipe.execute()
        return

    async def send_all() -> None:
        for group, message in messages:
            await _layer().group_send(group, message)

    async_to_sync(send_all)()


async def group_send(group: str, message: Event) -> None:
    """A message built here, through the channel layer (the worker's fallback when it cannot pipeline)."""
    await _layer().group_send(group, message)


async def turn_state(*, session_id: int, turn_id: int, status: str) -> None:
    message: ChatTurnState = {"type": "chat.turn_state", "turn": turn_id, "status": status}
    await _layer().group_send(session_group(session_id), message)


def _turn_end_message(turn: dict[str, Any], seq: int) -> ChatTurnEnd:
    return {"type": "chat.turn_end", "turn": turn, "seq": seq}


async def turn_end(*, session_id: int, turn: dict[str, Any], seq: int) -> None:
    await _layer().group_send(session_group(session_id), _turn_end_message(turn, seq))


def turn_end_sync(*, session_id: int, turn: dict[str, Any], seq: int) -> None:
    send_sync((session_group(session_id), _turn_end_message(turn, seq)))


def turns_queued_sync(turns: list[tuple[int, dict[str, Any]]]) -> None:
    """New turns were stored: ``(session_id, snapshot)`` each, in one round trip."""
    queued: list[tuple[str, Event]] = [
        (session_group(session_id), ChatTurnQueued(type="chat.turn_queued", turn=turn)) for session_id, turn in turns
    ]
    send_sync(*queued)


RIG_ACTIVITY_GROUP = "rigs.activity"


async def rig_decoding(*, rig_id: int) -> None:
    await _layer().group_send(RIG_ACTIVITY_GROUP, RigDecoding(type="rig.decoding", rig=rig_id))


def rigs_changed_sync() -> None:
    """A rig was saved or deleted: the sampler reads its list of rigs again (monitoring.sampler.run)."""
    send_sync((RIG_ACTIVITY_GROUP, RigsChanged(type="rigs.changed")))


def rig_models_group(rig_id: int) -> str:
    return f"rig.{rig_id}.models"


async def models_pull_progress(
    *, rig_id: int, pull_id: str, model: str, status: str, digest: str | None, total: int | None, completed: int | None
) -> None:
    await _layer().group_send(
        rig_models_group(rig_id),
        ModelsPullProgress(
            type="models.pull_progress",
            rig=rig_id,
            pull=pull_id,
            model=model,
            status=status,
            digest=digest,
            total=total,
            completed=completed,
        ),
    )


async def models_pull_end(
    *, rig_id: int, pull_id: str, model: str, ok: bool, error: dict[str, str] | None = None
) -> None:
    await _layer().group_send(
        rig_models_group(rig_id),
        ModelsPullEnd(type="models.pull_end", rig=rig_id, pull=pull_id, model=model, ok=ok, error=error),
    )


def models_changed_sync(*, rig_id: int, action: str, model: str) -> None:
    send_sync((rig_models_group(rig_id), ModelsChanged(type="models.changed", rig=rig_id, action=action, model=model)))


def queue_positions_sync(
    *,
    rig_id: int,
    waiting: list[tuple[int, int, int]],
    pages: list[tuple[int, int, int]] | None = None,
    reason: str = "",
    held: Mapping[int, str] | None = None,
) -> None:
    """After a dispatch: waiting turns' places, ``(session_id, turn_id, position)``: those in ``pages`` (default:
    all) to their chat pages (``chat.turn_state``, with ``waiting_reason`` when the rig cannot take turns now, or
    the turn's own in ``held``: a model swap holds it back), all of them to the board (``board.queue``, with the
    same reasons), in one round trip."""

    def why(turn_id: int) -> str:
        return reason or (held or {}).get(turn_id, "")

    messages: list[tuple[str, Event]] = []
    for session_id, turn_id, position in waiting if pages is None else pages:
        state = ChatTurnState(
            type="chat.turn_state", turn=turn_id, status="queued", queue_position=position,
            queue_ahead=max(0, position - 1),
        )  # fmt: skip
        if said := why(turn_id):
            state["waiting_reason"] = said
        messages.append((session_group(session_id), state))
    positions = {str(turn_id): position for _, turn_id, position in waiting}
    reasons = {str(turn_id): said for _, turn_id, _ in waiting if (said := why(turn_id))}
    messages.append((BOARD_GROUP, BoardQueue(type="board.queue", rig=rig_id, positions=positions, reasons=reasons)))
    send_sync(*messages)


def board_turns_sync(*, rows: list[dict[str, Any]]) -> None:
    """Turns' board rows (``board.turn``, one message each), in one round trip."""
    send_sync(*((BOARD_GROUP, BoardTurn(type="board.turn", turn=row)) for row in rows))


def board_progress_message(progress: dict[str, Any]) -> BoardProgress:
    return cast(BoardProgress, {"type": "board.progress", **progress})  # the fields of ProgressReporter.take()


async def board_progress(*, progress: dict[str, Any]) -> None:
    await _layer().group_send(BOARD_GROUP, board_progress_message(progress))


def user_revoked_sync(*, user_id: int) -> None:
    send_sync((user_group(user_id), UserRevoked(type="user.revoked", user=user_id)))


def sweep_group(sweep_id: int) -> str:
    return f"sweep.{sweep_id}"


def sweep_progress_sync(*, sweep: dict[str, Any], points: list[dict[str, Any]] | None = None) -> None:
    """A sweep's state to its page (with the points its last step measured) and to the board, in one round trip."""
    page = SweepProgress(type="sweep.progress", sweep=sweep, points=points or [])
    send_sync((sweep_group(sweep["id"]), page), (BOARD_GROUP, BoardSweep(type="board.sweep", sweep=sweep)))
