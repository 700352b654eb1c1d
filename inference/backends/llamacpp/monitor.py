"""What llama-server tells the sampler: its slots, counters and props, and the KV cache its model's geometry implies.

https://github.com/ggml-org/llama.cpp/tree/master/tools/server — /slots (per-slot progress), /metrics (needs
``--metrics``), /props; the model's geometry from its GGUF file where this process can read it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from inference.backends.base import BackendError, ModelArchitecture
from inference.backends.kvcache import kv_allocated_bytes, kv_bytes, kv_bytes_per_token
from inference.backends.llamacpp import metrics as llama_metrics
from inference.backends.llamacpp.chat import LlamaCppBackend
from inference.backends.monitor import BackendMonitor, MonitorContext, Unavailable

METRICS_EVERY_S = 5.0  # llama-server's /metrics counters move when a request ends; /slots is read every tick
COUNTERS = ("prompt_tokens_total", "tokens_predicted_total", "requests_processing", "requests_deferred",
            "n_decode_total", "n_busy_slots_per_decode", "prompt_tokens_seconds", "predicted_tokens_seconds",
            "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")  # fmt: skip


def _rate(previous: float, current: float, dt_s: float) -> float | None:
    if dt_s <= 0 or current < previous:
        return None
    return (current - previous) / dt_s


class LlamaCppMonitor(BackendMonitor):
    label: ClassVar[str] = "llama.cpp"
    server: ClassVar[str] = "llama-server"
    rate_from_turns: ClassVar[bool] = False

    def __init__(self, context: MonitorContext) -> None:
        super().__init__(context)
        self.props: dict[str, Any] = {}
        self.metrics: dict[str, float] = {}
        self.metrics_at = 0.0
        self.arch: ModelArchitecture | None = None
        self.arch_error = ""
        self.arch_source = ""
        self.weights_error = ""
        self.params: float | None = None
        self.previous_slots: dict[int, tuple[int | None, int, float]] = {}

    def backend(self, timeout_s: float) -> LlamaCppBackend:
        return LlamaCppBackend(self.context.rig.base_url, timeout_s=timeout_s)

    async def read(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        fresh_metrics = now - self.metrics_at >= METRICS_EVERY_S
        try:
            reading = await llama_metrics.collect(
                self.context.rig.base_url,
                props_cache=self.props,
                metrics_cache=None if fresh_metrics else self.metrics,
            )
        except Unavailable as exc:
            self.props, self.metrics_at = {}, 0.0  # re-read /props and /metrics when the server is back
            detail["sources"]["backend"] = {"ok": False, "error": str(exc)}
            return
        self.props = reading.props
        if fresh_metrics:
            self.metrics, self.metrics_at = reading.metrics, now
        detail["sources"]["backend"] = {"ok": True, "error": ""}
        for endpoint, why in reading.refused.items():  # a missing panel, named: the server itself is up
            detail["sources"][f"backend_{endpoint}"] = {"ok": False, "error": why}
        await self._model_facts()
        metrics = reading.metrics
        for name in COUNTERS:
            if name in metrics:
                series[f"llamacpp_{name}"] = metrics[name]
        drafts = metrics.get("spec_decode_num_draft_tokens_total") or 0
        if drafts:
            series["spec_acceptance"] = metrics.get("spec_decode_num_accepted_tokens_total", 0) / drafts
        self._slots(reading.slots, now, series, detail)
        detail["model"] = self.props.get("model_alias") or self.props.get("model_path", "")
        series["deferred_requests"] = metrics.get("requests_deferred", 0.0)

    def _slots(
        self, readings: list[llama_metrics.SlotReading], now: float, series: dict[str, float], detail: dict[str, Any]
    ) -> None:
        slots = []
        total_tps = 0.0
        for slot in readings:
            tps = self._slot_rate(slot, now)
            total_tps += tps or 0.0
            slots.append(
                {
                    "id": slot.id, "phase": slot.phase, "n_ctx": slot.n_ctx, "context_tokens": slot.context_tokens,
                    "prompt_tokens": slot.prompt_tokens, "prompt_processed": slot.prompt_processed,
                    "decoded": slot.decoded, "decode_tps": None if tps is None else round(tps, 2),
                }
            )  # fmt: skip
        detail["slots"] = slots
        if "backend_slots" in detail["sources"]:
            return  # no slot view: the rate and the slots are unknown, not zero
        series["decode_tps"] = round(total_tps, 3)
        series["busy_slots"] = float(sum(1 for s in readings if s.processing))
        series["total_slots"] = float(len(readings))

    def _slot_rate(self, slot: llama_metrics.SlotReading, now: float) -> float | None:
        """Tokens/s of a slot since the last tick (0 when idle; None on its first tick)."""
        previous = self.previous_slots.get(slot.id)
        self.previous_slots[slot.id] = (slot.task, slot.decoded, now)
        if not slot.processing:
            return 0.0
        if previous is None or previous[0] != slot.task:
            return None
        return _rate(previous[1], slot.decoded, now - previous[2])

    async def _model_facts(self) -> None:
        """The weights' size (the backend's model list) and the KV geometry (the GGUF file, read where it is: on the
        rig's host; else the rig profile's), each on its own, once."""
        backend = self.backend(timeout_s=2.0)
        if self.weight_bytes is None and not self.weights_error:
            try:
                models = await backend.list_models()
                self.weight_bytes = float(models[0].size_bytes) if models and models[0].size_bytes else None
                n_params = models[0].details.get("n_params") if models else None
                self.params = float(n_params) if isinstance(n_params, int | float) and n_params > 0 else None
            except BackendError as exc:
                self.weights_error = str(exc)
        if self.arch is None and not self.arch_error:
            if not self.context.local_host:
                self._arch_from_profile("the model file is on the rig's host, which runs no agent")
                return
            try:
                self.arch = await backend.model_architecture(self.props.get("model_alias", ""))
                self.arch_source = "the GGUF file's header"
            except BackendError as exc:
                self._arch_from_profile(str(exc))

    def _arch_from_profile(self, why: str) -> None:
        if self.context.profile_arch is not None:
            self.arch, self.arch_source = self.context.profile_arch, "the rig's profile (typed by an admin)"
        else:
            self.arch_error = f"{why}; type the model's geometry in the rig's profile"

    def kv(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        if self.arch is None:
            detail["sources"]["kv"] = {"ok": False, "error": self.arch_error or "model architecture not known yet"}
            return
        cache_type = self.context.kv_cache_type
        per_token = kv_bytes_per_token(self.arch, cache_type)
        slots = detail.get("slots", [])
        for slot in slots:
            slot["kv_bytes"] = kv_bytes(self.arch, slot["context_tokens"], cache_type)
            slot["fill"] = slot["context_tokens"] / slot["n_ctx"] if slot["n_ctx"] else None
        series["kv_bytes_per_token"] = per_token
        series["kv_used_bytes"] = sum(slot["kv_bytes"] for slot in slots)
        # Each slot's n_ctx is its sequence's share of -c, already padded as llama.cpp allocates it.
        series["kv_allocated_bytes"] = (
            kv_allocated_bytes(self.arch, slots[0]["n_ctx"], cache_type, parallel=len(slots)) if slots else 0.0
        )
        series["context_tokens"] = float(sum(slot["context_tokens"] for slot in slots))
        detail["kv"] = {"cache_type": cache_type, "arch": arch_summary(self.arch), "params": self.params}
        detail["provenance"]["kv"] = self.arch_source
        detail["sources"]["kv"] = {"ok": True, "error": ""}


def arch_summary(arch: ModelArchitecture) -> dict[str, Any]:
    """The architecture for the page: its fields, the per-layer cache counted by kind."""
    summary = {key: value for key, value in vars(arch).items() if key != "layers"}
    summary["attention_layers"] = sum(1 for layer in arch.layers if layer.kv_heads) if arch.layers else arch.block_count
    summary["sliding_layers"] = sum(1 for layer in arch.layers if layer.kv_heads and layer.window)
    return summary
