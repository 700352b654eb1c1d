"""Backend plug-ins by rig kind. A new backend is one module implementing ``base.Backend``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inference.backends.base import Backend, BackendError
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.ollama import OllamaBackend

if TYPE_CHECKING:
    from inference.models import Rig

BACKENDS: dict[str, type[Backend]] = {backend.kind: backend for backend in (LlamaCppBackend, OllamaBackend)}


def backend_for(rig: Rig, *, timeout_s: float = 10.0) -> Backend:
    try:
        cls = BACKENDS[rig.kind]
    except KeyError:
        raise BackendError(f"RigDash has no backend for rig kind {rig.kind!r} yet") from None
    return cls(rig.base_url, timeout_s=timeout_s)


def backend_supports(kind: str, capability: str) -> bool:
    """Whether the plug-in for a rig kind implements an optional capability of ``base.Backend``."""
    cls = BACKENDS.get(kind)
    return cls is not None and getattr(cls, capability, None) is not getattr(Backend, capability)
