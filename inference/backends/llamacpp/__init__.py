"""llama.cpp's ``llama-server``: the chat stream (``chat``), its signals for the sampler (``metrics``, ``monitor``)."""

from __future__ import annotations

from inference.backends.llamacpp.chat import LlamaCppBackend
from inference.backends.llamacpp.monitor import LlamaCppMonitor

__all__ = ["LlamaCppBackend", "LlamaCppMonitor"]
