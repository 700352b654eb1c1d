"""Take one sample of a rig: backend signals, slots, KV cache, memory, queue, active turns, roofline.

Each source is read on its own; one that fails is reported under ``detail.sources`` with its reason
and the others still count. Nothing here writes: ``monitoring.services`` stores and publishes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from channels.db import database_sync_to_async

from inference.backends import backend_for
from inference.backends.base import BackendError, ModelArchitecture
from inference.live import served
from inference.live import state as live
from inference.models import Rig
from inference.turns import selectors as turn_selectors
from monitoring import decode
from monitoring.collectors import Unavailable, host, llamacpp, nvml

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
METRICS_EVERY_S = 5.0  # llama-server's /metrics counters move when a request ends; /slots is read every tick
GIB = 1024**3


def is_local(rig: Rig) -> bool:
    """Whether this process is on the rig's host: its backend answers on loopback and no agent reports for it (with
    an agent, the rig's host figures are the agent's, wherever this process runs)."""
    return not rig.agent_key and urlparse(rig.base_url).hostname in LOOPBACK


@dataclass
class Sample:
    ts: float
    series: dict[str, float]
    detail: dict[str, Any]


@dataclass
class RigSampler:
    """Sampling state kept between ticks of one rig (previous counters, cached model facts)."""

    rig: Rig
    kv_cache_type: str = "f16"
    bandwidth_gbs: float | None = None  # the profile's: an admin's setting, or the probe's on the rig's host
    bandwidth_source: str = ""  # RigProfile.BandwidthSource
    # This process runs on the rig's host (an agent, or a backend on loopback without an agent); None: by the URL.
    local_host: bool | None = None
    profile_arch: ModelArchitecture | None = None  # KV geometry an admin typed, where the backend cannot say
    props: dict[str, Any] = field(default_factory=dict)
    arch: ModelArchitecture | None = None
    arch_error: str = ""
    arch_source: str = ""
    weight_bytes: float | None = None
    weights_error: str = ""
    params: float | None = None
    backend_pid: int | None = None
    previous_slots: dict[int, tuple[int | None, int, float]] = field(default_factory=dict)
    ollama_arch: dict[str, ModelArchitecture | None] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_at: float = 0.0
    served_at: float = 0.0

    def __post_init__(self) -> None:
        if self.local_host is None:
            self.local_host = is_local(self.rig)

    async def take(self) -> Sample:
        """One sample, stored nowhere: ``read`` here, then ``complete`` in the database's thread."""
        sample = await self.read()
        await database_sync_to_async(self.complete)(sample)
        return sample

    async def keep_served_models(self, sample: Sample) -> None:
        """Every ``served.REFRESH_S``, while the backend answers, keep the rig's model list for the pages that list the
        rigs (inference/live/served.py), so that they need not ask the backend."""
        if sample.ts - self.served_at < served.REFRESH_S or not sample.detail.get("sources", {}).get("backend", {}).get(
            "ok"
        ):
            return
        self.served_at = sample.ts
        try:
            models = await backend_for(self.rig, timeout_s=0.8).list_models()
        except BackendError:
            return
        await asyncio.to_thread(served.served_store, self.rig.pk, models)
        # The names, in the database, for placement (inference/queue/placement.py): one UPDATE when they changed.
        await database_sync_to_async(self.rig.record_models)(model.name for model in models)

    async def read(self) -> Sample:
        """What the backend and the host say: everything but RigDash's own queue and turns."""
        now = time.time()
        series: dict[str, float] = {}
        detail: dict[str, Any] = {"sources": {}, "rig": self.rig.name, "kind": self.rig.kind, "provenance": {}}
        await self._backend(now, series, detail)
        self._kv(series, detail)
        if self.local_host:
            detail["provenance"]["host"] = "this host (the backend's)"
            self._memory(series, detail)
        else:
            self._no_host_figures(series, detail)
        detail["bandwidth"] = self._bandwidth(detail)
        return Sample(ts=now, series=series, detail=detail)

    def _no_host_figures(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        """A rig on another host with no agent: nothing of this host is the rig's, so nothing of it is read."""
        why = "the rig runs on another host: run an agent beside it (manage.py rigdash_agent) for this figure"
        for source in ("host", "process", "gpu"):
            detail["sources"][source] = {"ok": False, "error": why}
        detail["gpus"] = []
        detail["provenance"]["host"] = None
        if self.weight_bytes:
            series["weight_bytes"] = self.weight_bytes
        loaded = detail.get("loaded_models")
        detail["placement"] = (
            self._placement(detail)
            if loaded
            else {"vram_fraction": None, "spill": None, "label": f"Where the weights are is unknown: {why}"}
        )

    def _bandwidth(self, detail: dict[str, Any]) -> dict[str, Any]:
        """The memory bandwidth the roofline divides by, and where it comes from: an admin's setting; else the GPU's
        peak (NVML: memory clock x bus width) where the weights are in its memory; else the host RAM's, measured by
        the probe on the rig's host."""
        if self.bandwidth_source == "setting" and self.bandwidth_gbs:
            return {"gbs": self.bandwidth_gbs, "source": "set by an admin in the rig's profile"}
        placement = detail.get("placement") or {}
        peaks = [g for g in detail.get("gpus") or [] if g.get("memory_bandwidth_gbs")]
        on_gpu = placement.get("vram_fraction") is not None and placement["vram_fraction"] >= 0.5
        held = (detail.get("process") or {}).get("vram_bytes") or 0
        if peaks and (on_gpu or (held and self.weight_bytes and held >= self.weight_bytes)):
            gpu = peaks[0]
            return {
                "gbs": gpu["memory_bandwidth_gbs"],
                "source": f"{gpu['name']}: memory clock x bus width (NVML peak)",
            }
        if self.bandwidth_gbs and self.local_host:
            return {"gbs": self.bandwidth_gbs, "source": "host RAM, measured by RigDash's probe on the rig's host"}
        return {"gbs": None, "source": "unknown: no agent on the rig's host, and no bandwidth set in its profile"}

    def complete(self, sample: Sample) -> None:
        """Add the rig's queue and turns to ``sample``, then the roofline (which, for Ollama, needs the turns' rates).
        Blocking: call it where the database may be used, in the same hop as the sample's store
        (``sampler.rig_loop``): one thread hop a tick instead of one for the turns and one for the store."""
        self._queue_and_turns(sample.series, sample.detail)
        self._roofline(sample.series, sample.detail)

    async def _backend(self, now: float, series: dict[str, float], detail: dict[str, Any]) -> None:
        if self.rig.kind == Rig.Kind.OLLAMA:
            await self._ollama(series, detail)
            return
        if self.rig.kind != Rig.Kind.LLAMACPP:
            detail["sources"]["backend"] = {"ok": False, "error": f"no monitoring collector for {self.rig.kind} yet"}
            return
        fresh_metrics = now - self.metrics_at >= METRICS_EVERY_S
        try:
            reading = await llamacpp.collect(
                self.rig.base_url, props_cache=self.props, metrics_cache=None if fresh_metrics else self.metrics
            )
        except Unavailable as exc:
            self.props, self.metrics_at = {}, 0.0  # re-read /props and /metrics when the server is back
            detail["sources"]["backend"] = {"ok": False, "error": str(exc)}
            return
        self.props = reading.props
        if fresh_metrics:
            self.metrics, self.metrics_at = reading.metrics, now
        detail["sources"]["backend"] = {"ok": True, "error": ""}
        await self._model_facts()
        metrics = reading.metrics
        for name in ("prompt_tokens_total", "tokens_predicted_total", "requests_processing", "requests_deferred",
                     "n_decode_total", "n_busy_slots_per_decode", "prompt_tokens_seconds", "predicted_tokens_seconds",
                     "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"):  # fmt: skip
            if name in metrics:
                series[f"llamacpp_{name}"] = metrics[name]
        drafts = metrics.get("spec_decode_num_draft_tokens_total") or 0
        if drafts:
            series["spec_acceptance"] = metrics.get("spec_decode_num_accepted_tokens_total", 0) / drafts
        slots = []
        total_tps = 0.0
        for slot in reading.slots:
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
        detail["model"] = self.props.get("model_alias") or self.props.get("model_path", "")
        series["decode_tps"] = round(total_tps, 3)
        series["busy_slots"] = float(sum(1 for s in reading.slots if s.processing))
        series["total_slots"] = float(len(reading.slots))
        series["deferred_requests"] = metrics.get("requests_deferred", 0.0)

    async def _ollama(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        """Ollama has no metrics endpoint: loaded models and their memory come from /api/ps, the KV geometry
        from /api/show; decode speed is the sum of RigDash's own running turns (see _queue_and_turns)."""
        backend = backend_for(self.rig, timeout_s=0.8)
        try:
            loaded = await backend.loaded_models()
        except BackendError as exc:
            detail["sources"]["backend"] = {"ok": False, "error": str(exc)}
            return
        detail["sources"]["backend"] = {"ok": True, "error": ""}
        models: list[dict[str, Any]] = []
        for model in loaded:
            arch = await self._ollama_arch(backend, model.name)
            per_token = decode.kv_bytes_per_token(arch, self.kv_cache_type) if arch else None
            on_gpu = model.size_vram_bytes or 0
            # /api/ps's context_length is one sequence's (num_ctx); the runner holds it for each of
            # OLLAMA_NUM_PARALLEL sequences, which the rig's slots stand for.
            allocated = (
                decode.kv_allocated_bytes(arch, model.context_length, self.kv_cache_type, parallel=self.rig.slots or 1)
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
        series["weight_bytes"] = float(sum(m["size_bytes"] for m in models))
        series["vram_bytes"] = float(sum(m["size_vram_bytes"] for m in models))
        if models and models[0]["kv_bytes_per_token"]:
            series["kv_bytes_per_token"] = models[0]["kv_bytes_per_token"]
        if any(m["kv_allocated_bytes"] for m in models):
            series["kv_allocated_bytes"] = float(sum(m["kv_allocated_bytes"] or 0 for m in models))

    async def _ollama_arch(self, backend: Any, name: str) -> ModelArchitecture | None:
        if name not in self.ollama_arch:
            try:
                self.ollama_arch[name] = await backend.model_architecture(name)
            except BackendError:
                self.ollama_arch[name] = None
        return self.ollama_arch[name]

    def _slot_rate(self, slot: llamacpp.SlotReading, now: float) -> float | None:
        """Tokens/s of a slot since the last tick (0 when idle; None on its first tick)."""
        previous = self.previous_slots.get(slot.id)
        self.previous_slots[slot.id] = (slot.task, slot.decoded, now)
        if not slot.processing:
            return 0.0
        if previous is None or previous[0] != slot.task:
            return None
        return decode.rate_from_counters(previous[1], slot.decoded, now - previous[2])

    async def _model_facts(self) -> None:
        """The weights' size (the backend's model list) and the KV geometry (the GGUF file, read where it is: on the
        rig's host; else the rig profile's), each on its own, once."""
        backend = backend_for(self.rig, timeout_s=2.0)
        if self.weight_bytes is None and not self.weights_error:
            try:
                models = await backend.list_models()
                self.weight_bytes = float(models[0].size_bytes) if models and models[0].size_bytes else None
                n_params = models[0].details.get("n_params") if models else None
                self.params = float(n_params) if isinstance(n_params, int | float) and n_params > 0 else None
            except BackendError as exc:
                self.weights_error = str(exc)
        if self.arch is None and not self.arch_error:
            if not self.local_host:
                self._arch_from_profile("the model file is on the rig's host, which runs no agent")
                return
            try:
                self.arch = await backend.model_architecture(self.props.get("model_alias", ""))
                self.arch_source = "the GGUF file's header"
            except BackendError as exc:
                self._arch_from_profile(str(exc))

    def _arch_from_profile(self, why: str) -> None:
        if self.profile_arch is not None:
            self.arch, self.arch_source = self.profile_arch, "the rig's profile (typed by an admin)"
        else:
            self.arch_error = f"{why}; type the model's geometry in the rig's profile"

    def _kv(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        if self.rig.kind == Rig.Kind.OLLAMA:
            ok = "kv_bytes_per_token" in series
            error = "" if ok else "no loaded model, or /api/show gave no KV geometry"
            detail["sources"]["kv"] = {"ok": ok, "error": error}
            detail["kv"] = {"cache_type": self.kv_cache_type, "arch": None}
            detail["provenance"]["kv"] = "the backend's /api/show" if ok else None
            return
        if self.arch is None:
            detail["sources"]["kv"] = {"ok": False, "error": self.arch_error or "model architecture not known yet"}
            return
        per_token = decode.kv_bytes_per_token(self.arch, self.kv_cache_type)
        slots = detail.get("slots", [])
        for slot in slots:
            slot["kv_bytes"] = decode.kv_bytes(self.arch, slot["context_tokens"], self.kv_cache_type)
            slot["fill"] = slot["context_tokens"] / slot["n_ctx"] if slot["n_ctx"] else None
        series["kv_bytes_per_token"] = per_token
        series["kv_used_bytes"] = sum(slot["kv_bytes"] for slot in slots)
        # Each slot's n_ctx is its sequence's share of -c, already padded as llama.cpp allocates it.
        series["kv_allocated_bytes"] = (
            decode.kv_allocated_bytes(self.arch, slots[0]["n_ctx"], self.kv_cache_type, parallel=len(slots))
            if slots
            else 0.0
        )
        series["context_tokens"] = float(sum(slot["context_tokens"] for slot in slots))
        detail["kv"] = {"cache_type": self.kv_cache_type, "arch": _arch_summary(self.arch), "params": self.params}
        detail["provenance"]["kv"] = self.arch_source
        detail["sources"]["kv"] = {"ok": True, "error": ""}

    def _memory(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        try:
            for key, value in host.host_memory().items():
                series[f"host_{key}"] = value
            detail["sources"]["host"] = {"ok": True, "error": ""}
        except Unavailable as exc:
            detail["sources"]["host"] = {"ok": False, "error": str(exc)}
        self._backend_process(series, detail)
        try:
            gpus = nvml.gpus()
            for gpu in gpus:
                i = gpu["index"]
                series[f"gpu{i}_memory_used_bytes"] = gpu["memory_used_bytes"]
                series[f"gpu{i}_memory_total_bytes"] = gpu["memory_total_bytes"]
                series[f"gpu{i}_memory_reserved_bytes"] = gpu["memory_reserved_bytes"]
                series[f"gpu{i}_utilization_pct"] = gpu["utilization_gpu_pct"]
                series[f"gpu{i}_power_w"] = gpu["power_w"]
                series[f"gpu{i}_temperature_c"] = gpu["temperature_c"]
            detail["gpus"] = gpus
            detail["sources"]["gpu"] = {"ok": True, "error": ""}
            self._backend_vram(series, detail)
        except Unavailable as exc:
            detail["gpus"] = []
            detail["sources"]["gpu"] = {"ok": False, "error": str(exc)}
        if self.weight_bytes:
            series["weight_bytes"] = self.weight_bytes
        detail["placement"] = self._placement(detail)

    def _backend_process(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        url = urlparse(self.rig.base_url)  # on the rig's host: the backend is what listens on its URL's port
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            if self.backend_pid is None:
                self.backend_pid = host.find_listening_pid(port)
            if self.backend_pid is None:
                raise Unavailable(f"no local process listens on port {port}")
            process = host.process_memory(self.backend_pid)
        except Unavailable as exc:
            self.backend_pid = None
            detail["sources"]["process"] = {"ok": False, "error": str(exc)}
            return
        series["backend_rss_bytes"] = process["rss_bytes"]
        detail["process"] = process
        detail["sources"]["process"] = {"ok": True, "error": ""}

    def _backend_vram(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        """The backend process's own VRAM, as NVML attributes it to the pid found for its port."""
        if self.backend_pid is None or "process" not in detail:
            return
        try:
            vram = nvml.process_vram(self.backend_pid)
        except Unavailable as exc:
            detail["process"]["vram_error"] = str(exc)
            return
        detail["process"]["vram_bytes"] = vram
        if vram is not None:
            series["backend_vram_bytes"] = vram

    def _placement(self, detail: dict[str, Any]) -> dict[str, Any]:
        """Where the weights live. Ollama says (size vs size_vram in /api/ps). llama.cpp reports no layer
        split over HTTP, so with no GPU the answer is "system RAM". With GPUs, the VRAM NVML attributes to its
        process (the CUDA context included) bounds it: less VRAM than the weights take means some of them are in
        system RAM; more tells nothing about the split."""
        loaded = detail.get("loaded_models")
        if loaded:
            size = sum(m["size_bytes"] for m in loaded)
            vram = sum(m["size_vram_bytes"] for m in loaded)
            fraction = vram / size if size else 0.0
            spill = 0 < fraction < 1 or (fraction == 0 and bool(detail.get("gpus")))
            label = f"Ollama: {fraction:.0%} of the loaded models in VRAM, {1 - fraction:.0%} in system RAM"
            return {"vram_fraction": round(fraction, 4), "spill": spill, "label": label}
        if not detail.get("gpus"):
            return {"vram_fraction": 0.0, "spill": False, "label": "CPU only: weights and KV cache in system RAM"}
        return self._llamacpp_gpu_placement(detail)

    def _llamacpp_gpu_placement(self, detail: dict[str, Any]) -> dict[str, Any]:
        unknown = {"vram_fraction": None, "spill": None}
        process = detail.get("process")
        vram = process.get("vram_bytes") if process else None
        if vram is None:
            if not process:
                why = detail["sources"].get("process", {}).get("error") or "its process was not found"
            else:
                why = process.get("vram_error") or "NVML attributes no VRAM to its process"
            label = f"GPU present: layer split not reported by llama-server ({why})"
            return {**unknown, "label": label, "why": why}  # why: for staff (monitoring.selectors.redact_users)
        weights = self.weight_bytes
        if weights and vram < weights:
            return {
                **unknown,
                "spill": True,
                "label": f"llama.cpp: its process holds {vram / GIB:.2f} GiB of VRAM, less than the"
                f" {weights / GIB:.2f} GiB of weights: at least {(weights - vram) / GIB:.2f} GiB of them in system RAM",
            }
        of_weights = f" for {weights / GIB:.2f} GiB of weights" if weights else ""
        return {
            **unknown,
            "label": f"llama.cpp: its process holds {vram / GIB:.2f} GiB of VRAM{of_weights} (CUDA context"
            " included; the layer split is not reported)",
        }

    def _queue_and_turns(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        try:
            redis_client = live.sync_client()
            # Celery's Redis transport keeps a queue's messages in one list, and a message sent with a priority in a
            # list of its own (``<queue>\x06\x16<p>``); RigDash sends none, so one LLEN a tick.
            series["queue_depth"] = float(redis_client.llen(self.rig.queue))  # type: ignore[arg-type]
            turns = turn_selectors.rig_active_turns(self.rig.pk)
            if turns:
                with redis_client.pipeline(transaction=False) as pipe:
                    for turn in turns:
                        pipe.lindex(live.live_key(turn["id"]), -1)
                    latest = pipe.execute()
                for turn, raw in zip(turns, latest, strict=True):
                    turn["live"] = live.latest_stats(raw) or {}
            detail["turns"] = turns
            series["active_turns"] = float(len(turns))
            if self.rig.kind == Rig.Kind.OLLAMA:  # no per-slot view: the rig's rate is its running turns'
                series["decode_tps"] = float(sum((t["live"].get("decode_tps") or 0) for t in turns if "live" in t))
            detail["sources"]["queue"] = {"ok": True, "error": ""}
        except Exception as exc:
            detail["sources"]["queue"] = {"ok": False, "error": repr(exc)}

    def _roofline(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        bandwidth = detail.get("bandwidth") or {}
        bandwidth_gbs, weight_bytes = bandwidth.get("gbs"), series.get("weight_bytes")
        if not (bandwidth_gbs and weight_bytes):
            missing = bandwidth.get("source", "") if not bandwidth_gbs else "the model's size is unknown"
            detail["roofline"] = {"ok": False, "error": f"memory bandwidth or model size unknown ({missing})"}
            return
        active = [slot for slot in detail.get("slots", []) if slot["phase"] == "decoding"]
        kv_read = sum(slot.get("kv_bytes", 0.0) for slot in active)
        streams = max(1, len(active))
        # One decode step reads the weights once for all active sequences, and each sequence's KV cache.
        bound = streams * decode.decode_bound_tps(
            bandwidth_bytes_s=bandwidth_gbs * 1e9, weight_bytes=weight_bytes, kv_bytes_read=kv_read
        )
        series["bound_tps"] = round(bound, 2)
        if active and series.get("decode_tps"):
            series["roofline_ratio"] = round(series["decode_tps"] / bound, 4)
        detail["roofline"] = {
            "ok": True,
            "bandwidth_gbs": bandwidth_gbs,
            "bandwidth_source": bandwidth.get("source", ""),
            "streams": streams,
        }


def is_idle(sample: Sample) -> bool:
    """Nothing on the rig to watch: no busy slot (a client other than RigDash counts too), no request the backend
    deferred, no turn of RigDash's waiting or running, no message in the rig's Celery queue. A sample whose queue
    and turns could not be read is not idle: the sampler keeps its full pace until it can see them."""
    series = sample.series
    if "active_turns" not in series:
        return False
    return not any(series.get(name, 0.0) for name in ("active_turns", "queue_depth", "busy_slots", "deferred_requests"))


def _arch_summary(arch: ModelArchitecture) -> dict[str, Any]:
    """The architecture for the page: its fields, the per-layer cache counted by kind."""
    summary = {key: value for key, value in vars(arch).items() if key != "layers"}
    summary["attention_layers"] = sum(1 for layer in arch.layers if layer.kv_heads) if arch.layers else arch.block_count
    summary["sliding_layers"] = sum(1 for layer in arch.layers if layer.kv_heads and layer.window)
    return summary
