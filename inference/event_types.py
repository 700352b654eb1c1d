"""The shape of every message that reaches a browser (built in inference/events.py and monitoring/events.py): one
TypedDict per event type, so a renamed or missing field fails mypy, not a page. Nested objects that have a builder of
their own (a turn's snapshot, a board row, a sweep) stay ``dict[str, Any]`` here and are typed where they are built."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class TokenFrame(TypedDict):
    """The browser's ``token`` frame (serialised once per batch, carried in ``ChatToken.frame``)."""

    type: Literal["token"]
    turn: int
    seq_from: int
    seq_to: int
    text: str
    stats: dict[str, Any]
    thinking: NotRequired[str]
    tool_calls: NotRequired[list[dict[str, Any]]]  # an API client's streamed tool-call deltas (OpenAI's shape)
    logprobs: NotRequired[list[Any]]


class ChatToken(TypedDict):
    type: Literal["chat.token"]
    turn: int
    seq_from: int
    seq_to: int
    frame: str


class ChatTurnQueued(TypedDict):
    type: Literal["chat.turn_queued"]
    turn: dict[str, Any]


class ChatTurnState(TypedDict):
    type: Literal["chat.turn_state"]
    turn: int
    status: str
    queue_position: NotRequired[int]
    queue_ahead: NotRequired[int]
    waiting_reason: NotRequired[str]


class ChatTurnEnd(TypedDict):
    type: Literal["chat.turn_end"]
    turn: dict[str, Any]
    seq: int


class RigDecoding(TypedDict):
    type: Literal["rig.decoding"]
    rig: int


class RigsChanged(TypedDict):
    type: Literal["rigs.changed"]


class ModelsPullProgress(TypedDict):
    type: Literal["models.pull_progress"]
    rig: int
    pull: str
    model: str
    status: str
    digest: str | None
    total: int | None
    completed: int | None


class ModelsPullEnd(TypedDict):
    type: Literal["models.pull_end"]
    rig: int
    pull: str
    model: str
    ok: bool
    error: dict[str, str] | None


class ModelsChanged(TypedDict):
    type: Literal["models.changed"]
    rig: int
    action: str
    model: str


class BoardQueue(TypedDict):
    type: Literal["board.queue"]
    rig: int
    positions: dict[str, int]
    reasons: dict[str, str]  # why a turn waits, for those of ``positions`` with a reason (as their pages are told)


class BoardTurn(TypedDict):
    type: Literal["board.turn"]
    turn: dict[str, Any]


class BoardProgress(TypedDict, total=False):
    """A running turn's progress (inference/live/progress.py), spread into the message."""

    type: Literal["board.progress"]
    turn: int
    tokens: int
    decode_tps: float | None
    status: str
    prompt_tokens: int | None
    prompt_estimated: bool
    context_used: int | None
    n_ctx: int | None
    context_ratio: float | None


class BoardSweep(TypedDict):
    type: Literal["board.sweep"]
    sweep: dict[str, Any]


class SweepProgress(TypedDict):
    type: Literal["sweep.progress"]
    sweep: dict[str, Any]
    points: list[dict[str, Any]]


class UserRevoked(TypedDict):
    type: Literal["user.revoked"]
    user: int


class RigSample(TypedDict):
    """A rig's sample (monitoring/sampling.py): ``{"ts", "series", "detail"}``."""

    type: Literal["rig.sample"]
    rig: int
    sample: dict[str, Any]


Event = (
    ChatToken | ChatTurnQueued | ChatTurnState | ChatTurnEnd | RigDecoding | RigsChanged | ModelsPullProgress
    | ModelsPullEnd | ModelsChanged | BoardQueue | BoardTurn | BoardProgress | BoardSweep | SweepProgress
    | UserRevoked | RigSample
)  # fmt: skip
