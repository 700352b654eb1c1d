"""Any OpenAI-compatible server (vLLM, LM Studio, LocalAI, ...): the chat stream (``chat``, ``stream``) and what the
sampler can learn from it (``monitor``). ``stream`` is shared with llama-server, which speaks the same protocol."""

from __future__ import annotations

from inference.backends.openai.chat import OpenAICompatBackend
from inference.backends.openai.monitor import OpenAICompatMonitor

__all__ = ["OpenAICompatBackend", "OpenAICompatMonitor"]
