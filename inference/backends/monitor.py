"""What the sampler asks of a backend: its own figures for one sample of a rig (docs/monitoring.md).

A backend's monitor (``<kind>/monitor.py``) reads the server's signals (slots, loaded models, counters) and sizes
its KV cache; the sampler (monitoring/sampling.py) adds what any backend shares: host memory, the backend process,
GPUs, the queue, the roofline. One monitor lives as long as the rig's sampling loop, so it may keep state between
ticks (previous counters, facts read once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from inference.backends.base import ModelArchitecture
    from inference.models import Rig


class Unavailable(Exception):
    """A reading could not be taken; the message says why (shown on the panel)."""


@dataclass
class MonitorContext:
    """What the sampler knows of the rig beyond its row: its profile's settings and where this process runs."""

    rig: Rig
    kv_cache_type: str = "f16"
    local_host: bool = False  # this process runs on the rig's host, so the backend's files are readable here
    profile_arch: ModelArchitecture | None = None  # KV geometry an admin typed, where the backend cannot say
    # Sequences the server runs per model where an admin said (Ollama's OLLAMA_NUM_PARALLEL, which no API reports);
    # None: the server's default (Ollama: 1).
    server_parallel: int | None = None


class BackendMonitor:
    """The backend's part of a sample. ``read`` writes ``detail["sources"]["backend"]`` (ok or why not) and what the
    server says into ``series`` and ``detail``; ``kv`` the KV cache's size and fill. Both leave out what the server
    cannot tell, never guessing it."""

    # The label placement rules use for this backend's process ("llama.cpp: its process holds ...").
    label: ClassVar[str] = "the backend"
    server: ClassVar[str] = "the backend"  # the server's own name, for what it does or does not report
    # No per-slot view: the rig's decode rate is the sum of RigDash's own running turns' rates.
    rate_from_turns: ClassVar[bool] = True

    def __init__(self, context: MonitorContext) -> None:
        self.context = context
        self.weight_bytes: float | None = None  # the served model's size, where the backend says

    async def read(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        detail["sources"]["backend"] = {"ok": False, "error": f"no monitoring reader for {self.context.rig.kind}"}

    def kv(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        detail["sources"]["kv"] = {"ok": False, "error": "the backend does not report its KV cache"}

    def loaded_models(self, detail: dict[str, Any]) -> list[str] | None:
        """The models the server holds in memory now, from this sample's ``detail``; None where it cannot say (the
        OpenAI API has no such list). Placement prefers rigs where a turn's model is loaded."""
        return None

    def placement(self, detail: dict[str, Any]) -> dict[str, Any] | None:
        """Where the backend itself says the weights are (Ollama's /api/ps), or None: the sampler's process rule."""
        return None

    def slots_unreported(self) -> str:
        """Why the server's own slot count (``detail["server_slots"]``, ``Rig.capacity``) is missing from a sample
        where it answers, and what the rig's slots should then be."""
        return (
            f"{self.server} reports no slot count: set the rig's slots to the requests it decodes at once (more would "
            "wait inside it, out of the fair queue's sight)"
        )
