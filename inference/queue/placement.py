"""Placement: a chat that targets a model, not a rig, has each turn handed to an enabled rig that serves the model.

A chat's ``placement`` is ``rig`` (its turns go to its rig) or ``model``. A placed turn waits in the fair queue of
every enabled rig whose backend last listed its model (``Rig.models_served``, kept by the sampler and by every
model list RigDash asks for); whichever of them frees a slot first takes it (``dispatch.rig_dispatch``), and a
submit hands it at once to the rig with the most free slots, then the shortest queue. The turn records that rig
(``Turn.rig``) and its chat moves there: a chat runs one turn at a time, so its running turn and the chat agree on
the rig, which the worker, the claim and the board read.

docs/architecture.md, "Placement", says how this meets the fair queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from django.db.models import Q

from inference.live import served
from inference.models import ChatSession, Rig, Turn

PLACED = ChatSession.Placement.MODEL


def rigs_serving(model_name: str) -> list[Rig]:
    """The enabled rigs whose backend last said it serves ``model_name``, by id."""
    return [rig for rig in Rig.objects.filter(enabled=True).order_by("pk") if rig.serves(model_name)]


def turns_of(rig: Rig) -> Q:
    """The active turns that concern ``rig``: those it runs or was handed (``Turn.rig``; a row written without one
    counts on its chat's rig), its own chats' waiting turns, and the waiting turns of chats placed by a model it
    serves."""
    mine = Q(rig_id=rig.pk) | Q(rig__isnull=True, session__rig_id=rig.pk, session__placement=ChatSession.Placement.RIG)
    if rig.enabled and rig.models_served:
        mine |= Q(
            rig__isnull=True,
            status=Turn.Status.QUEUED,
            session__placement=PLACED,
            session__model_name__in=list(rig.models_served),
        )
    return mine


def choose(rigs: Iterable[Rig], *, excluded: Iterable[int] = (), model: str = "") -> Rig | None:
    """The rig a new placed turn goes to: one whose server holds ``model`` in memory now (no load to wait for), then
    one that cannot say, then one that would load it; among those the most free slots, then the fewest turns
    waiting or running, then the oldest rig. ``excluded``: rigs that cannot take a turn now (their agent is down).
    One query and one Redis read when there is a choice."""
    shut = set(excluded)
    candidates = [rig for rig in rigs if rig.pk not in shut]
    if len(candidates) < 2:  # nothing to choose between (the one rig's dispatch counts its slots)
        return candidates[0] if candidates else None
    loaded = served.loaded_get_many([rig.pk for rig in candidates]) if model else {}

    def load_rank(rig: Rig) -> int:
        names = loaded.get(rig.pk)
        return 1 if names is None else (0 if model in names else 2)

    load = Counter(
        Turn.objects.filter(status__in=Turn.ACTIVE, rig_id__in=[rig.pk for rig in candidates])
        .order_by()
        .values_list("rig_id", flat=True)
    )
    return min(candidates, key=lambda rig: (load_rank(rig), -(rig.capacity - load[rig.pk]), load[rig.pk], rig.pk))


def placed_models_waiting() -> set[str]:
    """The models that placed turns wait for."""
    waiting = Turn.objects.filter(
        status=Turn.Status.QUEUED, dispatched_at__isnull=True, rig__isnull=True, session__placement=PLACED
    )
    return set(waiting.order_by().values_list("session__model_name", flat=True).distinct())
