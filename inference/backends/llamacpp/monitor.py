"""What llama-server tells the sampler: its slots, counters and props, and the KV cache its model's geometry implies.

https://github.com/ggml-org/llama.cpp/tree/master/tools/server — /slots (per-slot progress), /metrics (needs
``--metrics``), /props; the model's geometry from its GGUF file where this process can read it.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from inference.backends.base import BackendError, ModelArchitecture, auth_headers, positive_int
from inference.backends.kvcache import KV_CACHE_TYPE_BYTES, kv_allocated_bytes, kv_bytes, kv_bytes_per_token
from inference.backends.llamacpp import flags as server_flags
from inference.backends.llamacpp import metrics as llama_metrics
from inference.backends.llamacpp.chat import LlamaCppBackend
from inference.backends.monitor import BackendMonitor, MonitorContext, Unavailable

# An older build's /slots (b9093's) gives a busy slot's decoded tokens but not its prompt's.
SLOT_CONTEXT_UNKNOWN = (
    "llama-server's /slots does not say how many prompt tokens a busy slot holds (no n_prompt_tokens_processed or "
    "n_prompt_tokens_cache: an older build), so the KV cache in use and that slot's context fill are unknown"
)
METRICS_EVERY_S = 5.0  # llama-server's /metrics counters move when a request ends; /slots is read every tick
COUNTERS = ("prompt_tokens_total", "tokens_predicted_total", "requests_processing", "requests_deferred",
            "n_decode_total", "n_busy_slots_per_decode", "prompt_tokens_seconds", "predicted_tokens_seconds",
            "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")  # fmt: skip


def _rate(previous: float, current: float, dt_s: float) -> float | None:
    if dt_s <= 0 or current < previous:
        return None
    return (current - previous) / dt_s


@dataclass
class _Instance:
    """One llama-server model's state between ticks: the server's own, or one loaded model of a router."""

    props: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_at: float = 0.0
    metrics_refused: str = ""  # why /metrics was refused at its last read: named on every tick until the next
    arch: ModelArchitecture | None = None
    arch_error: str = ""
    arch_source: str = ""
    previous_slots: dict[int, tuple[int | None, int, float]] = field(default_factory=dict)
    slots: list[dict[str, Any]] = field(default_factory=list)
    slot_view: bool = False
    sleeping: bool = False
    args: list[str] | None = None  # router mode: the instance's command line (``status.args``)


class LlamaCppMonitor(BackendMonitor):
    label: ClassVar[str] = "llama.cpp"
    server: ClassVar[str] = "llama-server"
    rate_from_turns: ClassVar[bool] = False

    def __init__(self, context: MonitorContext) -> None:
        super().__init__(context)
        self.main = _Instance()
        self.instances: dict[str, _Instance] = {}  # router mode: per loaded model
        self.router = False
        self.weights_error = ""
        self.params: float | None = None
        self.process_flags: server_flags.ServerFlags | None = None
        self.process_flags_read = False

    @property
    def props(self) -> dict[str, Any]:
        return self.main.props

    def backend(self, timeout_s: float) -> LlamaCppBackend:
        return LlamaCppBackend(self.context.rig.base_url, timeout_s=timeout_s, api_key=self.context.rig.api_key)

    async def _collect(self, instance: _Instance, now: float, model: str | None) -> llama_metrics.LlamaCppReading:
        fresh_metrics = now - instance.metrics_at >= METRICS_EVERY_S
        reading = await llama_metrics.collect(
            self.context.rig.base_url,
            props_cache=instance.props,
            metrics_cache=None if fresh_metrics else instance.metrics,
            model=model,
            headers=auth_headers(self.context.rig.api_key),
        )
        instance.props = reading.props
        if fresh_metrics and not reading.sleeping:
            instance.metrics, instance.metrics_at = reading.metrics, now
            instance.metrics_refused = reading.refused.get("metrics", "")
        elif instance.metrics_refused:
            reading.refused.setdefault("metrics", instance.metrics_refused)
        instance.sleeping = reading.sleeping
        return reading

    async def read(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        try:
            reading = await self._collect(self.main, now, None)
        except Unavailable as exc:
            self.main.props, self.main.metrics_at = {}, 0.0  # re-read /props and /metrics when the server is back
            detail["sources"]["backend"] = {"ok": False, "error": str(exc)}
            return
        detail["sources"]["backend"] = {"ok": True, "error": ""}
        self.router = reading.router
        for endpoint, why in reading.refused.items():  # a missing panel, named: the server itself is up
            detail["sources"][f"backend_{endpoint}"] = {"ok": False, "error": why}
        if self.router:
            detail["build"] = _build(reading.props, slots=[], metrics={})
            if (models_max := positive_int(self.props.get("max_instances"))) is not None:
                detail["server_models_max"] = models_max  # --models-max: the fair queue's swaps (Rig field)
            await self._read_router(now, series, detail)
            return
        if (total := positive_int(self.props.get("total_slots"))) is not None:
            detail["server_slots"] = total  # the server's -np, whatever it was started with (Rig.capacity)
        await self._model_facts()
        await self._arch(self.main, self.props.get("model_path"))
        if reading.sleeping:
            detail["sleeping"] = True
            detail["sources"]["backend_slots"] = {
                "ok": False,
                "error": "llama-server sleeps (--sleep-idle-seconds): its model is unloaded until a request wakes it; "
                "its slots are not read, as reading them would wake it",
            }
        self._counters(self.main.metrics if reading.sleeping else reading.metrics, series)
        self._slots(self.main, reading.slots, now, detail, slot_view="backend_slots" not in detail["sources"])
        detail["slots"] = self.main.slots
        self._slot_series([self.main], series)
        detail["model"] = self.props.get("model_alias") or self.props.get("model_path", "")
        detail["build"] = _build(reading.props, slots=reading.slots, metrics=self.main.metrics)

    def slots_unreported(self) -> str:
        if self.router:
            return (
                "a router's models each have slots of their own (the -np each is started with): the rig's slots "
                "bound the turns across all of them"
            )
        return super().slots_unreported()

    def loaded_models(self, detail: dict[str, Any]) -> list[str] | None:
        """Router mode: the models whose status is ``loaded``; one model: that model, unless the server sleeps."""
        if "models" in detail:
            return [m["name"] for m in detail["models"] if m.get("status") == "loaded"]
        if detail.get("sleeping") or not detail.get("sources", {}).get("backend", {}).get("ok"):
            return []
        return [name for name in (self.props.get("model_alias"), self.props.get("model_path")) if name]

    async def _read_router(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        """Router mode: every model the router has, each loaded one's slots and counters (``?model=``). A model
        that is not loaded is never asked about: the router would load it."""
        try:
            models = await self.backend(timeout_s=2.0).list_models()
        except BackendError as exc:
            detail["sources"]["backend_models"] = {"ok": False, "error": str(exc)}
            models = []
        listed = [{"name": m.name, "status": m.details.get("status") or "unknown"} for m in models]
        detail["models"] = listed
        loaded = [m for m in models if m.details.get("status") == "loaded"]
        for name in set(self.instances) - {m.name for m in loaded}:
            del self.instances[name]  # unloaded: its next load is a new instance
        metrics: dict[str, float] = {}
        for model in loaded:
            instance = self.instances.setdefault(model.name, _Instance())
            instance.args = model.details.get("args") or []
            try:
                reading = await self._collect(instance, now, model.name)
            except Unavailable as exc:
                detail["sources"][f"backend_{model.name}"] = {"ok": False, "error": str(exc)}
                continue
            for endpoint, why in reading.refused.items():
                detail["sources"][f"backend_{endpoint}_{model.name}"] = {"ok": False, "error": why}
            self._slots(instance, reading.slots, now, detail, slot_view="slots" not in reading.refused)
            for slot in instance.slots:
                slot["model"] = model.name
            for name, value in (instance.metrics if reading.sleeping else reading.metrics).items():
                metrics[name] = metrics.get(name, 0.0) + value
            await self._arch(instance, server_flags.parse(instance.args).model_path or instance.props.get("model_path"))
        self._counters(metrics, series)
        instances = [self.instances[m.name] for m in loaded if m.name in self.instances]
        detail["slots"] = [slot for instance in instances for slot in instance.slots]
        self._slot_series(instances, series)
        series["models_loaded"] = float(len(loaded))
        series["models_available"] = float(len(models))
        detail["model"] = ", ".join(m.name for m in loaded)

    def _counters(self, metrics: dict[str, float], series: dict[str, float]) -> None:
        for name in COUNTERS:
            if name in metrics:
                series[f"llamacpp_{name}"] = metrics[name]
        drafts = metrics.get("spec_decode_num_draft_tokens_total") or 0
        if drafts:
            series["spec_acceptance"] = metrics.get("spec_decode_num_accepted_tokens_total", 0) / drafts
        series["deferred_requests"] = metrics.get("requests_deferred", 0.0)

    def _slots(
        self,
        instance: _Instance,
        readings: list[llama_metrics.SlotReading],
        now: float,
        detail: dict[str, Any],
        *,
        slot_view: bool,
    ) -> None:
        slots = []
        for slot in readings:
            tps = self._slot_rate(instance, slot, now)
            slots.append(
                {
                    "id": slot.id, "phase": slot.phase, "n_ctx": slot.n_ctx, "context_tokens": slot.context_tokens,
                    "prompt_tokens": slot.prompt_tokens, "prompt_processed": slot.prompt_processed,
                    "decoded": slot.decoded, "decode_tps": None if tps is None else round(tps, 2),
                }
            )  # fmt: skip
        instance.slots, instance.slot_view = slots, slot_view

    def _slot_series(self, instances: list[_Instance], series: dict[str, float]) -> None:
        if not any(instance.slot_view for instance in instances):
            return  # no slot view: the rate and the slots are unknown, not zero
        slots = [slot for instance in instances for slot in instance.slots]
        series["decode_tps"] = round(sum(slot["decode_tps"] or 0.0 for slot in slots), 3)
        series["busy_slots"] = float(sum(1 for slot in slots if slot["phase"] != "idle"))
        series["total_slots"] = float(len(slots))

    def _slot_rate(self, instance: _Instance, slot: llama_metrics.SlotReading, now: float) -> float | None:
        """Tokens/s of a slot since the last tick (0 when idle; None on its first tick)."""
        previous = instance.previous_slots.get(slot.id)
        instance.previous_slots[slot.id] = (slot.task, slot.decoded, now)
        if not slot.processing:
            return 0.0
        if previous is None or previous[0] != slot.task:
            return None
        return _rate(previous[1], slot.decoded, now - previous[2])

    async def _model_facts(self) -> None:
        """The weights' size and parameter count (the backend's model list), once."""
        if self.weight_bytes is not None or self.weights_error:
            return
        try:
            models = await self.backend(timeout_s=2.0).list_models()
            self.weight_bytes = float(models[0].size_bytes) if models and models[0].size_bytes else None
            n_params = models[0].details.get("n_params") if models else None
            self.params = float(n_params) if isinstance(n_params, int | float) and n_params > 0 else None
        except BackendError as exc:
            self.weights_error = str(exc)

    async def _arch(self, instance: _Instance, path: Any) -> None:
        """The KV geometry: the GGUF file, read where it is (on the rig's host), else the rig profile's; once."""
        if instance.arch is not None or instance.arch_error:
            return
        if not self.context.local_host:
            self._arch_from_profile(instance, "the model file is on the rig's host, which runs no agent")
            return
        if not isinstance(path, str) or not os.path.isfile(path):
            self._arch_from_profile(instance, f"the model file {path!r} is not readable from RigDash's host")
            return
        from inference.backends.gguf import architecture_from_metadata, read_metadata

        try:
            instance.arch = architecture_from_metadata(await asyncio.to_thread(read_metadata, path))
            instance.arch_source = "the GGUF file's header"
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._arch_from_profile(instance, f"cannot read the GGUF metadata of {path}: {exc}")

    def _arch_from_profile(self, instance: _Instance, why: str) -> None:
        if self.context.profile_arch is not None and not self.router:
            instance.arch, instance.arch_source = self.context.profile_arch, "the rig's profile (typed by an admin)"
        else:
            instance.arch_error = f"{why}; type the model's geometry in the rig's profile"

    def _flags(self, instance: _Instance) -> tuple[server_flags.ServerFlags | None, str]:
        """The flags the instance runs with and where they come from: a router's ``status.args``, or the server
        process's command line on this host; None where neither can be seen."""
        if instance.args is not None:
            return server_flags.parse(instance.args), "the router's command line for the model (/models)"
        if self.context.local_host:
            if not self.process_flags_read:
                self.process_flags = server_flags.local_process_flags(self.context.rig.base_url)
                self.process_flags_read = self.process_flags is not None
            if self.process_flags is not None:
                return self.process_flags, "the server process's command line"
        return None, ""

    def layout(self, instance: _Instance) -> dict[str, Any]:
        """How the instance's cache is laid out: slots, cells each slot reports, unified or one stream per slot."""
        slots = instance.slots
        settings = instance.props.get("default_generation_settings")
        n_ctx = slots[0]["n_ctx"] if slots else (settings.get("n_ctx") if isinstance(settings, dict) else 0)
        total = instance.props.get("total_slots")
        n_slots = len(slots) or (total if isinstance(total, int) and total > 0 else 0)
        flags, source = self._flags(instance)
        if flags is not None:
            unified = flags.unified
        else:
            unified = n_slots > 1
            source = (
                "assumed: llama-server's default without -np (4 slots over one unified cache); its command line "
                "is not readable here (run an agent on its host)"
            )
        cache_type = self.context.kv_cache_type
        if flags is not None and flags.cache_type_k in KV_CACHE_TYPE_BYTES:
            cache_type = flags.cache_type_k
        return {
            "slots": n_slots, "n_ctx": int(n_ctx or 0), "unified": unified and n_slots > 1, "source": source,
            "cache_type": cache_type,
        }  # fmt: skip

    def kv(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        instances = (
            [(name, self.instances[name]) for name in sorted(self.instances)] if self.router else [("", self.main)]
        )
        if self.router and not instances:
            detail["sources"]["kv"] = {"ok": True, "error": ""}
            series["kv_allocated_bytes"] = series["kv_used_bytes"] = series["context_tokens"] = 0.0
            detail["kv"] = {"models": []}
            return
        missing = [
            instance.arch_error or "model architecture not known yet" for _, instance in instances if not instance.arch
        ]
        if missing:
            detail["sources"]["kv"] = {"ok": False, "error": missing[0]}
            return
        allocated = used = context = 0.0
        unknown = 0
        models: list[dict[str, Any]] = []
        for name, instance in instances:
            arch = instance.arch
            assert arch is not None
            layout = self.layout(instance)
            cache_type = layout["cache_type"]
            for slot in instance.slots:
                tokens = slot["context_tokens"]
                slot["kv_bytes"] = None if tokens is None else kv_bytes(arch, tokens, cache_type)
                slot["fill"] = tokens / slot["n_ctx"] if tokens is not None and slot["n_ctx"] else None
            # Unified: every slot reports the whole pool as its n_ctx; per slot: its share of -c, already padded.
            model_allocated = (
                0.0
                if instance.sleeping or not layout["slots"]
                else kv_allocated_bytes(
                    arch, layout["n_ctx"], cache_type, parallel=layout["slots"], unified=layout["unified"]
                )
            )
            allocated += model_allocated
            used += sum(slot["kv_bytes"] or 0.0 for slot in instance.slots)
            context += sum(slot["context_tokens"] or 0 for slot in instance.slots)
            unknown += sum(1 for slot in instance.slots if slot["context_tokens"] is None)
            models.append({"name": name, "kv_allocated_bytes": model_allocated, "layout": layout,
                           "arch": arch_summary(arch), "sleeping": instance.sleeping})  # fmt: skip
        first = instances[0][1]
        assert first.arch is not None
        series["kv_bytes_per_token"] = kv_bytes_per_token(first.arch, models[0]["layout"]["cache_type"])
        series["kv_allocated_bytes"] = allocated
        if unknown:  # the busy slots' prompts are not reported: the sum of the others would understate it
            detail["sources"]["kv_used"] = {"ok": False, "error": SLOT_CONTEXT_UNKNOWN}
        else:
            series["kv_used_bytes"] = used
            series["context_tokens"] = context
        detail["kv"] = {
            "cache_type": models[0]["layout"]["cache_type"], "arch": models[0]["arch"], "params": self.params,
            "layout": models[0]["layout"], "models": models,
        }  # fmt: skip
        detail["provenance"]["kv"] = first.arch_source
        detail["sources"]["kv"] = {"ok": True, "error": ""}


def _build(
    props: dict[str, Any], *, slots: list[llama_metrics.SlotReading], metrics: dict[str, float]
) -> dict[str, Any]:
    """The server's build (/props ``build_info``, ``b<number>-<commit>``; a build from a source package says
    ``b0-unknown``, hence None) and what its answers lack, read from the answers themselves rather than guessed
    from the number."""
    info = props.get("build_info")
    text = info if isinstance(info, str) else ""
    number = text[1:].split("-", 1)[0] if text.startswith("b") else ""
    build = int(number) if number.isdigit() and int(number) > 0 else None
    notes = []
    if any(slot.task is not None and slot.prompt_processed is None for slot in slots):
        notes.append(
            "its /slots has no prompt counters: while a slot works, its context fill and the KV in use are unknown"
        )
    if metrics and "spec_decode_num_draft_tokens_total" not in metrics:
        notes.append(
            "its /metrics has no speculative-decoding counters (spec_decode_*): its own draft acceptance is not "
            "reported (each reply's draft counts still are, in its timings)"
        )
    if "is_sleeping" not in props and props.get("role") != "router" and props:
        notes.append("it does not report sleeping (/props is_sleeping)")
    return {"build_info": text, "build": build, "notes": notes}


def arch_summary(arch: ModelArchitecture) -> dict[str, Any]:
    """The architecture for the page: its fields, the per-layer cache counted by kind."""
    summary = {key: value for key, value in vars(arch).items() if key != "layers"}
    summary["attention_layers"] = sum(1 for layer in arch.layers if layer.kv_heads) if arch.layers else arch.block_count
    summary["sliding_layers"] = sum(1 for layer in arch.layers if layer.kv_heads and layer.window)
    summary["window"] = max((layer.window for layer in arch.layers if layer.kv_heads), default=0)
    summary["recurrent_layers"] = sum(1 for layer in arch.layers if layer.state_bytes and not layer.kv_heads)
    summary["state_bytes"] = max((layer.state_bytes for layer in arch.layers), default=0)
    return summary
