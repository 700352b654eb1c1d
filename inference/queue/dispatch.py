"""The fair queue: turns wait in RigDash's table and go to Celery only when their rig has a free slot.

A rig decodes ``Rig.capacity`` turns at once: its slots, never more than its server reports having. A turn is
*busy* on its rig from the moment it is dispatched (``dispatched_at`` set, task sent) until it ends. When slots free
up, waiting turns are picked round-robin across users: the user served least recently on that rig goes first (a user
never served before goes before everyone), each user's own turns oldest first. So one user's burst of turns waits
behind the single turns of others instead of starving them.

Dispatch runs inside a submit's transaction, after every turn end and every few seconds from Celery beat
(``inference.dispatch_all``). It is race-safe: the rig's row is locked (``select_for_update``) while
slots are counted and turns marked, and each turn is marked with a conditional update, so two
dispatchers never hand out the same slot or the same turn twice. The worker's claim is still a
conditional update, so a task delivered twice runs once.

A rig's queue also holds the waiting turns of chats placed by a model it serves (inference/queue/placement.py):
such a turn waits on every rig serving its model, and the first with a free slot takes it. A placed turn handed to
a rig that cannot take turns any more (its agent went down, or it was disabled) before a worker claimed it waits
again for any rig (``release_stranded``). Each task names the rig it was handed to, and the claim takes only
turns still handed to that rig, so the task left in the old rig's queue cannot start the turn once it moved.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.db import connection, transaction
from django.utils import timezone

from inference import events
from inference.errors import QueueUnavailable
from inference.live import agents, consumers
from inference.models import ChatSession, LastServed, Rig, Turn
from inference.queue import early, placement, swaps
from inference.queue.tickets import StartTicket

log = logging.getLogger(__name__)
# The worker's task (inference/tasks.py), looked up by its name: the entry points sit above this layer.
TURNS_RUN_TASK = "inference.turns_run"


@dataclass(frozen=True)
class Waiting:
    turn_id: int
    user_id: int
    session_id: int
    created_at: datetime
    placed: bool = False  # its chat targets a model: it may go to any rig serving it
    model: str = ""  # its chat's model: a router with a model limit swaps to it (inference/queue/swaps.py)


def fair_order(waiting: Sequence[Waiting], last_served: Mapping[int, datetime | None]) -> list[Waiting]:
    """The order waiting turns will start in (pure).

    1. Each user's turns queue oldest first.
    2. Repeatedly take the head turn of the user served least recently: never served first, then the
       oldest ``last_served``; ties go to the user whose head turn is older.
    3. That user now counts as served most recently, behind everyone already waiting.
    """
    per_user: dict[int, list[Waiting]] = {}
    for item in sorted(waiting, key=lambda w: (w.created_at, w.turn_id)):
        per_user.setdefault(item.user_id, []).append(item)
    heap: list[tuple[int, float, datetime, int, int]] = []
    for user_id, turns in per_user.items():
        served = last_served.get(user_id)
        rank, when = (0, 0.0) if served is None else (1, served.timestamp())
        heapq.heappush(heap, (rank, when, turns[0].created_at, turns[0].turn_id, user_id))
    order: list[Waiting] = []
    heads = {user_id: 0 for user_id in per_user}
    tick = 0
    while heap:
        *_, user_id = heapq.heappop(heap)
        turns = per_user[user_id]
        order.append(turns[heads[user_id]])
        heads[user_id] += 1
        if heads[user_id] < len(turns):
            tick += 1
            head = turns[heads[user_id]]
            heapq.heappush(heap, (2, float(tick), head.created_at, head.turn_id, user_id))
    return order


def waiting_order(rig: Rig | int) -> list[Waiting]:
    """The rig's undispatched queued turns in the order they will start (a rig id costs one more query)."""
    found = rig if isinstance(rig, Rig) else Rig.objects.filter(pk=rig).first()
    return _in_fair_order(found.pk, _rig_turns(found)[1]) if found is not None else []


def _in_fair_order(rig_id: int, waiting: list[Waiting]) -> list[Waiting]:
    """``fair_order`` of the rig's waiting turns, reading when each of their users was last served on the rig
    (``LastServed``: one row per user, whatever the history). With one user waiting the order is theirs, oldest
    first, whenever they were served: no query."""
    if not waiting:
        return []
    users = {w.user_id for w in waiting}
    if len(users) == 1:
        return fair_order(waiting, {})
    served = LastServed.objects.filter(rig_id=rig_id, user_id__in=users).values_list("user_id", "at")
    return fair_order(waiting, dict(served))


def _served_now(rig_id: int, user_ids: set[int], at: datetime) -> None:
    """Record that these users' turns were just handed to the rig (one upsert)."""
    rows = [LastServed(rig_id=rig_id, user_id=user_id, at=at) for user_id in sorted(user_ids)]
    LastServed.objects.bulk_create(rows, update_conflicts=True, unique_fields=["rig", "user"], update_fields=["at"])


def queue_position(turn: Turn) -> int | None:
    """None unless waiting; 0 once handed to a worker; else 1 for the next turn to start, 2 after it..."""
    if turn.status != Turn.Status.QUEUED:
        return None
    if turn.dispatched_at is not None:
        return 0
    return best_place(turn.pk, waiting_places(turn), places_on)


def places_on(rig: Rig) -> dict[int, int]:
    """Each of the rig's waiting turns' place in its queue (1: next to start)."""
    return {w.turn_id: i + 1 for i, w in enumerate(waiting_order(rig))}


def best_place(turn_id: int, rigs: Iterable[Rig], places: Callable[[Rig], Mapping[int, int]]) -> int | None:
    """A waiting turn's queue position: its best place among the rigs it may go to (``places``: a rig's
    ``places_on``, which a caller asking for many turns keeps per rig)."""
    return min((p for rig in rigs if (p := places(rig).get(turn_id)) is not None), default=None)


def waiting_places(turn: Turn, *, serving: Callable[[str], list[Rig]] = placement.rigs_serving) -> list[Rig]:
    """The rigs a waiting turn may go to: its own (the chat's), or for a placed chat's turn every enabled rig serving
    its model (``serving``: ``placement.rigs_serving``, which a caller asking for many turns keeps per model)."""
    if turn.rig_id is None and turn.session.placement == placement.PLACED:
        return serving(turn.session.model_name)
    return [turn.rig or turn.session.rig]


class RigReasons:
    """Each rig's reasons for its waiting turns, read once however many turns ask: why it cannot take turns or has
    no worker (``waiting_reason``), and its model swaps (``swaps.swap_state``: the rig's turns and one Redis read,
    only for a rig with a model limit)."""

    def __init__(self) -> None:
        self._rig: dict[int, str] = {}
        self._swaps: dict[int, swaps.SwapState | None] = {}

    def rig(self, rig: Rig) -> str:
        if rig.pk not in self._rig:
            self._rig[rig.pk] = waiting_reason(rig)
        return self._rig[rig.pk]

    def swap(self, rig: Rig, model: str) -> str:
        """Why a turn for ``model`` waiting for ``rig`` is held back by a swap, or ""."""
        if not rig.server_models_max:
            return ""
        if rig.pk not in self._swaps:
            self._swaps[rig.pk] = swaps.swap_state(rig, _rig_turns(rig)[0])
        state = self._swaps[rig.pk]
        return state.held_reason(model) if state is not None else ""


def turn_waiting_reason(turn: Turn, *, reasons: RigReasons | None = None, rigs: list[Rig] | None = None) -> str:
    """Why a waiting turn cannot start now, or "": its rig cannot take turns or has no worker (``waiting_reason``),
    or no rig serving a placed chat's model can take it. ``rigs``: its ``waiting_places``, where read already."""
    reasons = reasons or RigReasons()
    rigs = waiting_places(turn) if rigs is None else rigs
    if not rigs:
        return "waiting: no enabled rig serves this model now"
    # "": a rig it may go to can take it: it waits for a slot, which its queue position says
    return _every_rigs_reason({rig.name: reasons.rig(rig) for rig in rigs})


def _turn_swap_reason(turn: Turn, reasons: RigReasons, rigs: list[Rig]) -> str:
    """Why a waiting turn is held back by a model swap on every rig it may go to (``rigs``; inference/queue/swaps.py),
    or "". Apart from ``turn_waiting_reason``: a swap ends by itself, and a long wait for a reason there fails a placed
    turn."""
    if turn.dispatched_at is not None:  # handed out: no swap holds it
        return ""
    return _every_rigs_reason({rig.name: reasons.swap(rig, turn.session.model_name) for rig in rigs})


def turns_waiting_reasons(
    turns: Iterable[Turn], *, serving: Callable[[str], list[Rig]] = placement.rigs_serving
) -> dict[int, str]:
    """What each waiting turn's page says about why it waits (its rigs' reasons, else a swap's), by turn id, for
    those that have one; each rig read once (``serving``: as for ``waiting_places``)."""
    reasons = RigReasons()
    out: dict[int, str] = {}
    for turn in turns:
        if turn.status != Turn.Status.QUEUED:
            continue
        rigs = waiting_places(turn, serving=serving)
        why = turn_waiting_reason(turn, reasons=reasons, rigs=rigs)
        if why := why or _turn_swap_reason(turn, reasons, rigs):
            out[turn.pk] = why
    return out


def _every_rigs_reason(reasons: Mapping[str, str]) -> str:
    """The reason a turn waits, by the rig it may go to: "" when any rig has none (or there is no rig), the one
    rig's, else each rig's named."""
    if not reasons or not all(reasons.values()):
        return ""
    if len(reasons) == 1:
        return next(iter(reasons.values()))
    return "waiting: " + "; ".join(f"{name}: {why.removeprefix('waiting: ')}" for name, why in reasons.items())


def _rig_turns(rig: Rig) -> tuple[list[tuple[str, bool]], list[Waiting]]:
    """The rig's busy slots (turns running, or handed to a worker and not yet claimed: their model, and whether it is
    decoding) and the waiting turns it may start (its own chats', and placed chats' whose model it serves), in one
    query."""
    rows = Turn.objects.filter(placement.turns_of(rig), status__in=Turn.ACTIVE)
    rows = rows.order_by()  # fair_order sorts the waiting ones
    busy, waiting = [], []
    for pk, status, dispatched_at, user_id, session_id, created_at, how, model in rows.values_list(
        "pk", "status", "dispatched_at", "session__owner_id", "session_id", "created_at", "session__placement",
        "session__model_name",
    ):  # fmt: skip
        if status != Turn.Status.QUEUED or dispatched_at is not None:
            busy.append((model, status == Turn.Status.DECODING))
        else:
            placed = how == placement.PLACED
            waiting.append(Waiting(pk, user_id, session_id, created_at, placed=placed, model=model))
    return busy, waiting


def rig_dispatch(*, rig_id: int, rig: Rig | None = None, tickets: Mapping[int, StartTicket] | None = None) -> list[int]:
    """Hand waiting turns to the rig's Celery queue while it has free slots, fairly; returns their ids.

    Inside a caller's transaction (a submit's) it joins it, without a savepoint: the turns stored and their
    dispatch commit together, and the task goes to Celery after that one commit. A lone submit on a rig with a
    free slot costs three queries here (lock the rig, read its turns, mark the turn): this is on every turn's time
    to first token. Who was served is written after the commit (``_served_now``).

    ``rig``: the rig as the caller read it in this transaction. It is read again, locked, where the database has
    row locks; on SQLite the transaction already holds the database's write lock, and the read would only cost
    time.

    ``tickets``: start tickets of turns stored in this transaction, by turn id; those handed out go in the task."""
    with transaction.atomic(savepoint=False):
        if rig is None or connection.features.has_select_for_update:
            rig = Rig.objects.select_for_update().filter(pk=rig_id).order_by().first()
        if rig is None:
            return []
        busy, waiting = _rig_turns(rig)
        free = rig.capacity - len(busy)
        reason = cannot_take_turns(rig)
        if reason:
            free = 0  # nothing consumes the rig's queue: its turns wait here, where the page can say why
        dispatched: list[int] = []
        still_waiting: list[Waiting] | None = None  # known only when the order was read here
        swaps_now = swaps.swap_state(rig, busy)  # None on a rig without a model limit: no read
        if free > 0:
            now = timezone.now()
            order = _in_fair_order(rig_id, waiting)
            if swaps_now is None:
                chosen = [item.turn_id for item in order[:free]]
            else:
                chosen = [order[i].turn_id for i in swaps_now.choose([item.model for item in order], free)]
            # One UPDATE for the lot. A turn cancelled since the read is not QUEUED any more and is left out; when
            # the UPDATE marked fewer than chosen, the marked ones are read back.
            # A placed turn may be handed out by another rig's dispatch at the same moment: the condition on its
            # ``dispatched_at`` lets only one of them mark it.
            handed_out = Turn.objects.filter(pk__in=chosen, status=Turn.Status.QUEUED, dispatched_at__isnull=True)
            marked_count = handed_out.update(dispatched_at=now, rig_id=rig.pk) if chosen else 0
            if marked_count == len(chosen):
                dispatched = chosen
            elif marked_count:
                marked = Turn.objects.filter(pk__in=chosen, dispatched_at=now, rig_id=rig.pk)
                found = set(marked.values_list("pk", flat=True))
                dispatched = [turn_id for turn_id in chosen if turn_id in found]
            moved = [item.session_id for item in order if item.placed and item.turn_id in dispatched]
            if moved:  # a placed chat follows its turn to this rig: the worker and the board read the chat's rig
                ChatSession.objects.filter(pk__in=moved).exclude(rig_id=rig.pk).update(rig_id=rig.pk)
            still_waiting = [item for item in order if item.turn_id not in dispatched]
        queue = rig.queue
        # A placed turn's ticket was written before its rig was known.
        sent_tickets = [replace(tickets[t], rig_id=rig.pk) for t in dispatched if t in tickets] if tickets else []
        transaction.on_commit(lambda: _send(dispatched, queue, sent_tickets, rig_id=rig_id))
        # The early lane's free slots (inference/queue/early.py): none while a turn waits or a swap is under way,
        # none through an agent.
        swapping = swaps_now is not None and bool(swaps_now.swapping)
        open_slots = free - len(dispatched) if still_waiting == [] and not rig.agent_key and not swapping else 0
        held = swaps_now.held(waiting, dispatched) if swaps_now is not None else {}
        transaction.on_commit(lambda: early.open_slots_set(rig_id, open_slots), robust=True)
        transaction.on_commit(
            lambda: announce_positions(
                rig_id=rig_id, waiting_order_now=still_waiting, just_dispatched=dispatched, reason=reason, held=held
            )
        )
        if dispatched:
            # After the task is sent, off the turn's way to its first token; a dispatch of this rig in between reads
            # the row before it (one hand-out's fairness, not a lost turn).
            served = {item.user_id for item in waiting if item.turn_id in dispatched}
            transaction.on_commit(lambda: _served_now(rig_id, served, now), robust=True)
    return dispatched


def task_reprs(turn_ids: list[int], tickets: Sequence[StartTicket], rig_id: int | None = None) -> dict[str, str]:
    """What Celery shows of the turns' task arguments: in the message's headers, in task events (Flower) and in the
    worker's log of a task that fails. The turn ids and the rig, never a ticket's conversation. Left to Celery, they
    are ``saferepr`` of the arguments, walked in Python at every send, on every turn's way to its first token."""
    shown = {"tickets": f"<start tickets of turns {[ticket.turn_id for ticket in tickets]}>"} if tickets else {}
    if rig_id is not None:
        shown["rig_id"] = str(rig_id)
    kwargs = ", ".join(f"{name!r}: {value}" for name, value in shown.items())
    return {"argsrepr": repr([turn_ids]), "kwargsrepr": f"{{{kwargs}}}"}


def _send(turn_ids: list[int], queue: str, tickets: Sequence[StartTicket] = (), *, rig_id: int | None = None) -> None:
    """One task for the turns handed out together: one Celery message to send, and the worker claims them together.
    Their start tickets go with it (inference/queue/tickets.py), and the rig they were handed to (``rig_id``): the
    claim takes only turns still handed to it.

    A turn whose request went out early (inference/queue/early.py) is confirmed to the process holding it first, which
    claims it at once: the task is sent after, off its first token's way, for a holder that is gone.

    When the message cannot be sent (the broker is down), the turns go back to waiting, so the next dispatch
    (after a turn ends, or beat's ``dispatch_all``) hands them out again instead of the 120 s resend; the caller
    gets ``QueueUnavailable`` (the broker's error as its cause), which a page or an API client is shown. A turn
    confirmed to its early request's holder stays handed out (the holder claims it; were it gone, the resend)."""
    if not turn_ids:
        return
    confirmed = early.confirm(tickets)
    try:
        # Straight to the queue's list: through the default exchange, kombu has no binding to look up.
        kwargs: dict[str, Any] = {"tickets": [ticket.as_message() for ticket in tickets]} if tickets else {}
        if rig_id is not None:
            kwargs["rig_id"] = rig_id
        current_app.tasks[TURNS_RUN_TASK].apply_async(
            args=[turn_ids],
            kwargs=kwargs,
            queue=queue,
            exchange="",
            routing_key=queue,
            **task_reprs(turn_ids, tickets, rig_id),
        )
    except Exception as exc:
        waiting = [turn_id for turn_id in turn_ids if turn_id not in confirmed]
        if not waiting:
            log.warning("turns %s: their task could not be sent; their early requests' holders claim them: %r",
                        turn_ids, exc)  # fmt: skip
            return
        Turn.objects.filter(pk__in=waiting, status=Turn.Status.QUEUED).update(dispatched_at=None)
        raise QueueUnavailable(waiting) from exc


def waiting_reason(rig: Rig) -> str:
    """What a waiting turn's page says about why it waits: the rig cannot take turns now (held here), or no worker
    consumes its queue (as the workers last answered: inference/live/consumers.py), or ""."""
    return cannot_take_turns(rig) or (consumers.NO_WORKER if consumers.unconsumed(rig.queue) else "")


def announce_waiting_reasons() -> None:
    """Tell the waiting turns of every rig with one why they wait, while the reason lasts, and once when it ends:
    a chat page learns that no worker serves its rig (or that one came back) while it is open. The dispatch of a
    rig with turns to hand out tells its held turns itself (``rig_dispatch``); this tells the rest, the turns
    already handed to a queue nobody consumes among them."""
    waiting = Turn.objects.filter(status=Turn.Status.QUEUED).values("session__rig_id")
    for rig in Rig.objects.filter(pk__in=waiting).order_by("pk"):
        reason = waiting_reason(rig)
        before = consumers.swap_told(rig.pk, reason)
        if reason == consumers.NO_WORKER or reason != before:
            announce_positions(rig_id=rig.pk, reason=reason)


def cannot_take_turns(rig: Rig) -> str:
    """Why the rig cannot take a turn now (its agent, which serves its queue, is down), or ""."""
    if not rig.agent_key:
        return ""
    agent = agents.agent_state(rig.pk, rig.agent_key)
    return "" if agent.up else f"waiting: the rig's {agent.describe()}"


def announce_positions(
    *,
    rig_id: int,
    waiting_order_now: list[Waiting] | None = None,
    just_dispatched: list[int] | None = None,
    reason: str = "",
    held: Mapping[int, str] | None = None,
) -> None:
    """Tell each waiting turn's chat page (and the board) where it now stands in the rig's queue (0: starting).
    ``waiting_order_now``: the order the dispatch just read under the rig's lock, less what it handed out.
    ``held``: why turns held back for a model swap wait, by turn id (inference/queue/swaps.py).
    ``just_dispatched``: the turns it handed out. A turn already starting stays at 0 until its worker claims it,
    so only these are told they start (telling every starting turn again would make a burst of n submits send
    n^2/2 messages); the board still gets every position."""
    starting = Turn.objects.filter(rig_id=rig_id, status=Turn.Status.QUEUED, dispatched_at__isnull=False)
    waiting = [(session_id, turn_id, 0) for turn_id, session_id in starting.values_list("pk", "session_id")]
    order = waiting_order(rig_id) if waiting_order_now is None else waiting_order_now
    waiting += [(w.session_id, w.turn_id, i + 1) for i, w in enumerate(order)]
    if waiting:
        fresh = set(just_dispatched or ())
        told = waiting if just_dispatched is None else [w for w in waiting if w[2] > 0 or w[1] in fresh]
        events.queue_positions_sync(rig_id=rig_id, waiting=waiting, pages=told, reason=reason, held=held)


def dispatch_resend_stale(*, older_than_s: float) -> list[int]:
    """Send again the tasks of turns dispatched long ago but never claimed (a lost message), to the rig they were
    handed to; harmless twice."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    resent: list[int] = []
    stale = Turn.objects.filter(status=Turn.Status.QUEUED, dispatched_at__lt=cutoff, rig__isnull=False)
    for turn_id, old, rig_id, queue in stale.values_list("pk", "dispatched_at", "rig_id", "rig__queue"):
        if Turn.objects.filter(pk=turn_id, status=Turn.Status.QUEUED, dispatched_at=old, rig_id=rig_id).update(
            dispatched_at=timezone.now()
        ):
            _send([turn_id], queue, rig_id=rig_id)
            resent.append(turn_id)
            log.warning("turn %s was dispatched at %s but never started: task sent again", turn_id, old)
    return resent


def release_stranded() -> list[int]:
    """Placed turns handed to a rig that cannot take turns any more (its agent is down, or it was disabled) and not
    claimed: waiting again for any rig serving their model, this one too once it is back. Their task stays in the old
    rig's queue, where its claim, which names that rig, finds nothing to start."""
    handed = Turn.objects.filter(
        status=Turn.Status.QUEUED, dispatched_at__isnull=False, rig__isnull=False, session__placement=placement.PLACED
    )
    by_rig: dict[int, list[int]] = {}
    for turn_id, rig_id in handed.order_by().values_list("pk", "rig_id"):
        by_rig.setdefault(rig_id, []).append(turn_id)
    released: list[int] = []
    for rig in Rig.objects.filter(pk__in=list(by_rig)).order_by("pk"):
        if rig.enabled and not cannot_take_turns(rig):
            continue
        ids = by_rig[rig.pk]
        mine = Turn.objects.filter(pk__in=ids, status=Turn.Status.QUEUED, rig_id=rig.pk, dispatched_at__isnull=False)
        if mine.update(dispatched_at=None, rig_id=None):
            moved = list(Turn.objects.filter(pk__in=ids, rig__isnull=True).values_list("pk", flat=True))
            released += moved
            log.warning("turns %s were handed to rig %s, which cannot take turns now: waiting for any rig", moved, rig)
    return released


def dispatch_all(*, resend_after_s: float = 120.0) -> dict[str, list[int]]:
    """The periodic pass: placed turns stranded on a rig that went down wait again; dispatch every rig with waiting
    turns; resend lost tasks."""
    released = release_stranded()
    dispatched: list[int] = []
    waiting = Turn.objects.filter(status=Turn.Status.QUEUED, dispatched_at__isnull=True).order_by()
    rig_ids = set(waiting.exclude(session__placement=placement.PLACED).values_list("session__rig_id", flat=True))
    if models := placement.placed_models_waiting():
        rig_ids |= {rig.pk for rig in Rig.objects.filter(enabled=True) if models & set(rig.models_served or ())}
    for rig_id in sorted(rig_ids):
        dispatched += rig_dispatch(rig_id=rig_id)
    announce_waiting_reasons()
    resent = dispatch_resend_stale(older_than_s=resend_after_s)
    return {"released": released, "dispatched": dispatched, "resent": resent}
