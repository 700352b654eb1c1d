"""What Ollama tells the sampler: its loaded models (``/api/ps``) and their KV geometry (``/api/show``).

Ollama has no metrics endpoint and no slot view: the rig's decode rate is the sum of RigDash's own running turns'
(monitoring/sampling.py), and where the weights live is what ``/api/ps`` says (``size`` against ``size_vram``).
https://github.com/ollama/ollama/blob/main/docs/api.md
"""

from __future__ import annotations

from typing import Any, ClassVar

from inference.backends.base import BackendError, ModelArchitecture
from inference.backends.kvcache import kv_allocated_bytes, kv_bytes_per_token
from inference.backends.monitor import BackendMonitor, MonitorContext
from inference.backends.ollama.chat import OllamaBackend


class OllamaMonitor(BackendMonitor):
    label: ClassVar[str] = "Ollama"
    server: ClassVar[str] = "Ollama"
    rate_from_turns: ClassVar[bool] = True

    def __init__(self, context: MonitorContext) -> None:
        super().__init__(context)
        self.arch_cache: dict[str, ModelArchitecture | None] = {}  # /api/show per model, read once

    def backend(self, timeout_s: float) -> OllamaBackend:
        return OllamaBackend(self.context.rig.base_url, timeout_s=timeout_s)

    async def read(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        backend = self.backend(timeout_s=0.8)
        try:
            loaded = await backend.loaded_models()
        except BackendError as exc:
            detail["sources"]["backend"] = {"ok": False, "error": str(exc)}
            return
        detail["sources"]["backend"] = {"ok": True, "error": ""}
        cache_type = self.context.kv_cache_type
        models: list[dict[str, Any]] = []
        for model in loaded:
            arch = await self._arch(backend, model.name)
            per_token = kv_bytes_per_token(arch, cache_type) if arch else None
            on_gpu = model.size_vram_bytes or 0
            # /api/ps's context_length is one sequence's (num_ctx); the runner holds it for each of
            # OLLAMA_NUM_PARALLEL sequences, which the rig's slots stand for.
            allocated = (
                kv_allocated_bytes(arch, model.context_length, cache_type, parallel=self.context.rig.slots or 1)
                if arch and model.context_length
                else None
            )
            models.append(
                {
                    "name": model.name, "size_bytes": model.size_bytes, "size_vram_bytes": on_gpu,
                    "cpu_fraction": 1 - on_gpu / model.size_bytes if model.size_bytes else None,
                    "context_length": model.context_length, "expires_at": model.expires_at,
                    "kv_bytes_per_token": per_token,
                    "kv_allocated_bytes": allocated,
                    "arch": vars(arch) if arch else None,
                }
            )  # fmt: skip
        detail["loaded_models"] = models
        detail["model"] = ", ".join(m["name"] for m in models)
        series["loaded_models"] = float(len(models))
        self.weight_bytes = float(sum(m["size_bytes"] for m in models))
        series["weight_bytes"] = self.weight_bytes
        series["vram_bytes"] = float(sum(m["size_vram_bytes"] for m in models))
        if models and models[0]["kv_bytes_per_token"]:
            series["kv_bytes_per_token"] = models[0]["kv_bytes_per_token"]
        if any(m["kv_allocated_bytes"] for m in models):
            series["kv_allocated_bytes"] = float(sum(m["kv_allocated_bytes"] or 0 for m in models))

    async def _arch(self, backend: OllamaBackend, name: str) -> ModelArchitecture | None:
        if name not in self.arch_cache:
            try:
                self.arch_cache[name] = await backend.model_architecture(name)
            except BackendError:
                self.arch_cache[name] = None
        return self.arch_cache[name]

    def kv(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        ok = "kv_bytes_per_token" in series
        error = "" if ok else "no loaded model, or /api/show gave no KV geometry"
        detail["sources"]["kv"] = {"ok": ok, "error": error}
        detail["kv"] = {"cache_type": self.context.kv_cache_type, "arch": None}
        detail["provenance"]["kv"] = "the backend's /api/show" if ok else None

    def placement(self, detail: dict[str, Any]) -> dict[str, Any] | None:
        """Ollama says where each loaded model is: ``size_vram`` of its ``size`` in VRAM, the rest in system RAM."""
        loaded = detail.get("loaded_models")
        if not loaded:
            return None
        size = sum(m["size_bytes"] for m in loaded)
        vram = sum(m["size_vram_bytes"] for m in loaded)
        fraction = vram / size if size else 0.0
        spill = 0 < fraction < 1 or (fraction == 0 and bool(detail.get("gpus")))
        label = f"Ollama: {fraction:.0%} of the loaded models in VRAM, {1 - fraction:.0%} in system RAM"
        return {"vram_fraction": round(fraction, 4), "spill": spill, "label": label}
