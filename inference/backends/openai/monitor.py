"""What an OpenAI-compatible server tells the sampler: whether it answers, and the models it serves.

The OpenAI API has no slots, counters or KV figures: the rig's decode rate is the sum of RigDash's own running
turns', the KV panel says it is not reported, and the host's figures come from an agent beside the server.
"""

from __future__ import annotations

from typing import Any, ClassVar

from inference.backends.base import BackendError
from inference.backends.monitor import BackendMonitor
from inference.backends.openai.chat import OpenAICompatBackend


class OpenAICompatMonitor(BackendMonitor):
    label: ClassVar[str] = "the OpenAI-compatible server"
    server: ClassVar[str] = "the OpenAI-compatible server"
    rate_from_turns: ClassVar[bool] = True

    async def read(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        try:
            models = await OpenAICompatBackend(
                self.context.rig.base_url, timeout_s=0.8, api_key=self.context.rig.api_key
            ).list_models()
        except BackendError as exc:
            detail["sources"]["backend"] = {"ok": False, "error": str(exc)}
            return
        detail["sources"]["backend"] = {"ok": True, "error": ""}
        detail["model"] = ", ".join(model.name for model in models)

    def kv(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        detail["sources"]["kv"] = {"ok": False, "error": "the OpenAI API does not report a server's KV cache"}
