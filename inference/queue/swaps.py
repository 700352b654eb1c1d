"""Model swaps on a router that holds a limited number of models (llama-server ``--models-max``).

Such a router queues a request for a model it has not loaded while it holds its limit, and evicts the least recently
used model only once that model has no request in flight and no queued request wants it
(tools/server/server-models.cpp ``server_lru_sched``). The fair queue hands a turn to the router as soon as the rig
has a free slot, so a model in steady use would keep getting turns and never drain: the turn waiting for the swap
would starve inside the router, out of the fair queue's reach and shown running.

The rule (``SwapState``): when the next turn in fair order wants a model the router has not loaded and cannot load
without an eviction, that turn is handed out (the router queues it and swaps as soon as a loaded model idles), and
no turn for another model is handed out behind it until it has started decoding (its model loaded): the model to
evict drains, the swap happens, and the held turns wait in RigDash's queue, where their page says why. Turns for the
model being swapped in may follow it.

What the router holds is the sampler's list (inference/live/served.py), plus the models of turns already decoding,
which are loaded whatever the list says. A list that names more models than the router holds predates a swap: then
only the decoding turns' models count as loaded. A rig whose list is not known has no swaps: its turns go out as on
any rig.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inference.live import served
from inference.models import Rig


class HasModel(Protocol):
    """A waiting turn as the dispatch reads it (``dispatch.Waiting``)."""

    @property
    def turn_id(self) -> int: ...

    @property
    def model(self) -> str: ...


@dataclass
class SwapState:
    """A router's models during one dispatch: those it holds or turns in flight want (``claimed``), and those turns in
    flight wait to swap in (``swapping``; while any does, no other model's turn goes out)."""

    models_max: int
    claimed: set[str] = field(default_factory=set)
    swapping: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, *, loaded: Iterable[str], models_max: int, in_flight: Iterable[tuple[str, bool]]) -> SwapState:
        """From the router's loaded models and its turns in flight: ``(model, decoding)`` each (pure)."""
        in_flight = list(in_flight)
        started = {model for model, decoding in in_flight if decoding}
        resident = set(loaded) | started
        if len(resident) > models_max:  # the kept list predates a swap: only the decoding turns' models are sure
            resident = started
        claimed = resident | {model for model, _ in in_flight}
        swapping = claimed - resident if len(claimed) > models_max else set()
        return cls(models_max=models_max, claimed=claimed, swapping=swapping)

    def admits(self, model: str) -> bool:
        """Whether a turn for ``model`` may go out now; a turn that needs a swap is admitted and starts one."""
        if self.swapping:
            return model in self.swapping
        if model not in self.claimed:
            self.claimed.add(model)
            if len(self.claimed) > self.models_max:
                self.swapping.add(model)
        return True

    def choose(self, models: Sequence[str], free: int) -> list[int]:
        """The indexes of the turns, in fair order, that go out into ``free`` slots (wanting ``models``)."""
        chosen: list[int] = []
        for index, model in enumerate(models):
            if len(chosen) >= free:
                break
            if self.admits(model):
                chosen.append(index)
        return chosen

    def held(self, waiting: Iterable[HasModel], dispatched: Iterable[int]) -> dict[int, str]:
        """Why each waiting turn not handed out (``dispatched``) is held back by a swap, by turn id."""
        out = set(dispatched)
        return {w.turn_id: why for w in waiting if w.turn_id not in out and (why := self.held_reason(w.model))}

    def held_reason(self, model: str) -> str:
        """What the page of a turn for ``model`` held back by a swap says, or "" when it is not held."""
        if not self.swapping or model in self.swapping:
            return ""
        return f"waiting: the rig swaps to model {', '.join(sorted(self.swapping))} first"


def swap_state(rig: Rig, in_flight: Iterable[tuple[str, bool]]) -> SwapState | None:
    """The rig's swaps, or None for a rig without a model limit (no read) or whose loaded models are not known (one
    Redis read)."""
    if not rig.server_models_max:
        return None
    loaded = served.loaded_get_many([rig.pk])[rig.pk]
    if loaded is None:
        return None
    return SwapState.read(loaded=loaded, models_max=rig.server_models_max, in_flight=in_flight)
