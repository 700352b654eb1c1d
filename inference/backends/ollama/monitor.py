"""What Ollama tells the sampler: its loaded models (``/api/ps``), their KV geometry and capabilities (``/api/show``)
and file sizes (``/api/tags``), put together by Ollama's own rules (``rules.py``: sequences, batch, what ``size``
holds): per loaded model its weights, KV cache and compute buffers apart, its context and idle unload time.

Ollama has no metrics endpoint and no slot view: the rig's decode rate is the sum of RigDash's own running turns'
(monitoring/sampling.py), and where the weights live is what ``/api/ps`` says (``size`` against ``size_vram``).
https://github.com/ollama/ollama/blob/main/docs/api.md
"""

from __future__ import annotations

from typing import Any, ClassVar

from inference.backends.base import BackendError, LoadedModel, ModelArchitecture
from inference.backends.kvcache import kv_allocated_bytes, kv_bytes_per_token
from inference.backends.monitor import BackendMonitor, MonitorContext
from inference.backends.ollama import rules
from inference.backends.ollama.chat import OllamaBackend


class OllamaMonitor(BackendMonitor):
    label: ClassVar[str] = "Ollama"
    server: ClassVar[str] = "Ollama"
    rate_from_turns: ClassVar[bool] = True

    def __init__(self, context: MonitorContext) -> None:
        super().__init__(context)
        # Per model, read once: /api/show's geometry and capabilities, /api/tags's file size.
        self.arch_cache: dict[str, ModelArchitecture | None] = {}
        self.capability_cache: dict[str, frozenset[str] | None] = {}
        self.file_cache: dict[str, int | None] = {}

    def slots_unreported(self) -> str:
        return (
            "Ollama runs OLLAMA_NUM_PARALLEL requests per model at once (1 unless set; server/sched.go), and no API "
            "reports it: set the rig's slots to it, or the rest wait inside Ollama, out of the fair queue's sight"
        )

    def backend(self, timeout_s: float) -> OllamaBackend:
        return OllamaBackend(self.context.rig.base_url, timeout_s=timeout_s, api_key=self.context.rig.api_key)

    async def read(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        backend = self.backend(timeout_s=0.8)
        try:
            loaded = await backend.loaded_models()
        except BackendError as exc:
            detail["sources"]["backend"] = {"ok": False, "error": str(exc)}
            return
        detail["sources"]["backend"] = {"ok": True, "error": ""}
        models = [await self._model_row(backend, model) for model in loaded]
        detail["loaded_models"] = models
        detail["model"] = ", ".join(m["name"] for m in models)
        series["loaded_models"] = float(len(models))
        # The roofline reads the weights: the model files, not /api/ps's size (weights + KV + compute buffers).
        weights = [m["weight_bytes"] for m in models]
        self.weight_bytes = float(sum(w for w in weights if w)) if models and all(weights) else None
        if self.weight_bytes:
            series["weight_bytes"] = self.weight_bytes
        series["loaded_bytes"] = float(sum(m["size_bytes"] for m in models))
        series["vram_bytes"] = float(sum(m["size_vram_bytes"] for m in models))
        if models and models[0]["kv_bytes_per_token"]:
            series["kv_bytes_per_token"] = models[0]["kv_bytes_per_token"]
        if any(m["kv_allocated_bytes"] for m in models):
            series["kv_allocated_bytes"] = float(sum(m["kv_allocated_bytes"] or 0 for m in models))
        if models and all(m["graph_bytes"] is not None for m in models):
            series["graph_bytes"] = float(sum(m["graph_bytes"] for m in models))

    async def _model_row(self, backend: OllamaBackend, model: LoadedModel) -> dict[str, Any]:
        """One loaded model as Ollama runs it (rules.py): its sequences, batch, KV and memory split."""
        cache_type = self.context.kv_cache_type
        arch = await self._arch(backend, model.name)
        capabilities = await self._capabilities(backend, model.name)
        family = str(model.details.get("family") or (arch.arch if arch else ""))
        completion = capabilities is None or not capabilities or "completion" in capabilities
        parallel = rules.num_parallel(family, completion=completion, configured=self.context.server_parallel)
        context = model.context_length
        batch = rules.generation_batch(context, parallel) if context else None
        per_token = kv_bytes_per_token(arch, cache_type) if arch else None
        allocated = (
            kv_allocated_bytes(arch, context, cache_type, parallel=parallel, ubatch=batch or rules.BATCH_DEFAULT)
            if arch and context
            else None
        )
        split = rules.memory_split(model.size_bytes, weights=await self._file_bytes(backend, model.name), kv=allocated)
        on_gpu = model.size_vram_bytes or 0
        return {
            "name": model.name, "size_bytes": model.size_bytes, "size_vram_bytes": on_gpu,
            "cpu_fraction": 1 - on_gpu / model.size_bytes if model.size_bytes else None,
            "context_length": context, "expires_at": model.expires_at,
            "parallel": parallel, "batch": batch, "family": family,
            "weight_bytes": split.weights, "kv_allocated_bytes": split.kv, "graph_bytes": split.graph,
            "kv_bytes_per_token": per_token,
            "capabilities": sorted(capabilities or ()),
            "arch": vars(arch) if arch else None,
        }  # fmt: skip

    async def _arch(self, backend: OllamaBackend, name: str) -> ModelArchitecture | None:
        if name not in self.arch_cache:
            try:
                self.arch_cache[name] = await backend.model_architecture(name)
            except BackendError:
                self.arch_cache[name] = None
        return self.arch_cache[name]

    async def _capabilities(self, backend: OllamaBackend, name: str) -> frozenset[str] | None:
        if name not in self.capability_cache:
            try:
                self.capability_cache[name] = await backend.model_capabilities(name)
            except BackendError:
                self.capability_cache[name] = None
        return self.capability_cache[name]

    async def _file_bytes(self, backend: OllamaBackend, name: str) -> int | None:
        if self.file_cache.get(name) is None:  # a model not listed yet is asked again next time
            try:
                self.file_cache[name] = await backend.model_file_bytes(name)
            except BackendError:
                self.file_cache[name] = None
        return self.file_cache[name]

    def loaded_models(self, detail: dict[str, Any]) -> list[str] | None:
        """What /api/ps listed: the models Ollama holds in memory now."""
        if not detail.get("sources", {}).get("backend", {}).get("ok"):
            return None
        return [m["name"] for m in detail.get("loaded_models", [])]

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
