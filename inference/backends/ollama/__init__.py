"""Ollama: the chat stream and model management (``chat``), its loaded models for the sampler (``monitor``)."""

from __future__ import annotations

from inference.backends.ollama.chat import OllamaBackend
from inference.backends.ollama.monitor import OllamaMonitor

__all__ = ["OllamaBackend", "OllamaMonitor"]
