"""Backend plug-ins by rig kind: one folder each (``<kind>/``: its chat stream, model management and what the
sampler reads), registered in ``PLUGINS`` below. docs/architecture.md, "Where does a new backend go"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference.backends.base import Backend, BackendError, Capabilities
from inference.backends.llamacpp import LlamaCppBackend, LlamaCppMonitor
from inference.backends.monitor import BackendMonitor, MonitorContext
from inference.backends.ollama import OllamaBackend, OllamaMonitor
from inference.backends.openai import OpenAICompatBackend, OpenAICompatMonitor

if TYPE_CHECKING:
    from inference.models import Rig


@dataclass(frozen=True)
class Plugin:
    backend: type[Backend]
    monitor: type[BackendMonitor]


PLUGINS: tuple[Plugin, ...] = (
    Plugin(LlamaCppBackend, LlamaCppMonitor),
    Plugin(OllamaBackend, OllamaMonitor),
    Plugin(OpenAICompatBackend, OpenAICompatMonitor),
)
BACKENDS: dict[str, type[Backend]] = {plugin.backend.kind: plugin.backend for plugin in PLUGINS}
MONITORS: dict[str, type[BackendMonitor]] = {plugin.backend.kind: plugin.monitor for plugin in PLUGINS}


def backend_for(rig: Rig, *, timeout_s: float = 10.0) -> Backend:
    try:
        cls = BACKENDS[rig.kind]
    except KeyError:
        raise BackendError(f"RigDash has no backend for rig kind {rig.kind!r} yet") from None
    return cls(rig.base_url, timeout_s=timeout_s, api_key=rig.api_key)


def monitor_for(context: MonitorContext) -> BackendMonitor:
    """The sampler's reader of the rig's backend; an unknown kind's reports that it has none."""
    return MONITORS.get(context.rig.kind, BackendMonitor)(context)


def capabilities(kind: str) -> Capabilities:
    """What the plug-in for a rig kind declares it can do (an unknown kind: nothing beyond the defaults)."""
    cls = BACKENDS.get(kind)
    return cls.capabilities if cls is not None else Capabilities()


def backend_supports(kind: str, capability: str) -> bool:
    """Whether the plug-in for a rig kind implements an optional capability of ``base.Backend``."""
    cls = BACKENDS.get(kind)
    return cls is not None and getattr(cls, capability, None) is not getattr(Backend, capability)
