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

from inference.backends import backend_for, monitor_for
from inference.backends.base import BackendError, ModelArchitecture
from inference.backends.monitor import BackendMonitor, MonitorContext
from inference.live import energy as live_energy
from inference.live import served
from inference.live import state as live
from inference.models import Rig
from inference.turns import selectors as turn_selectors
from monitoring import decode, gpus, placement
from monitoring.collectors import Unavailable, host

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# A sample's per-GPU series: gpu<i>_<key> from each reading's field.
GPU_SERIES = (
    ("memory_used_bytes", "memory_used_bytes"), ("memory_total_bytes", "memory_total_bytes"),
    ("memory_reserved_bytes", "memory_reserved_bytes"), ("utilization_pct", "utilization_pct"),
    ("power_w", "power_w"), ("temperature_c", "temperature_c"),
)  # fmt: skip


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
    """Sampling state kept between ticks of one rig: its backend's monitor (inference/backends/<kind>/monitor.py)
    and what the host readings need (the backend's pid)."""

    rig: Rig
    kv_cache_type: str = "f16"
    bandwidth_gbs: float | None = None  # the profile's: an admin's setting, or the probe's on the rig's host
    bandwidth_source: str = ""  # RigProfile.BandwidthSource
    # This process runs on the rig's host (an agent, or a backend on loopback without an agent); None: by the URL.
    local_host: bool | None = None
    profile_arch: ModelArchitecture | None = None  # KV geometry an admin typed, where the backend cannot say
    backend_pid: int | None = None
    served_at: float = 0.0
    energy_at: float | None = None  # the previous sample's time, for the energy account
    loaded_kept: tuple[tuple[str, ...] | None, float] | None = None  # the loaded models last stored, and when
    monitor: BackendMonitor = field(init=False)

    def __post_init__(self) -> None:
        if self.local_host is None:
            self.local_host = is_local(self.rig)
        self.monitor = monitor_for(
            MonitorContext(
                rig=self.rig, kv_cache_type=self.kv_cache_type, local_host=self.local_host,
                profile_arch=self.profile_arch,
            )
        )  # fmt: skip

    @property
    def weight_bytes(self) -> float | None:
        return self.monitor.weight_bytes

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
        await self.monitor.read(now, series, detail)
        self.monitor.kv(series, detail)
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
        detail["placement"] = self.monitor.placement(detail) or {
            "vram_fraction": None, "spill": None, "label": f"Where the weights are is unknown: {why}",
        }  # fmt: skip

    def _bandwidth(self, detail: dict[str, Any]) -> dict[str, Any]:
        """The memory bandwidth the roofline divides by, and where it comes from: an admin's setting; else the peak of
        the GPUs that hold the weights (monitoring/placement.py); else the host RAM's, measured by the probe on the
        rig's host."""
        if self.bandwidth_source == "setting" and self.bandwidth_gbs:
            return {"gbs": self.bandwidth_gbs, "source": "set by an admin in the rig's profile"}
        gpus = detail.get("gpus") or []
        fraction = (detail.get("placement") or {}).get("vram_fraction")
        held = placement.process_gpu_bytes(gpus) or 0.0
        weights = self.weight_bytes
        on_gpu = placement.all_unified(gpus) or (fraction is not None and fraction >= 0.5)
        if on_gpu or (held and weights and held >= weights):
            found = placement.gpu_bandwidth(gpus, weights_on_gpu=on_gpu)
            if found is not None:
                return found
        if self.bandwidth_gbs and self.local_host:
            return {"gbs": self.bandwidth_gbs, "source": "host RAM, measured by RigDash's probe on the rig's host"}
        return {"gbs": None, "source": "unknown: no agent on the rig's host, and no bandwidth set in its profile"}

    def complete(self, sample: Sample) -> None:
        """Add the rig's queue and turns to ``sample``, then the roofline (which, for Ollama, needs the turns' rates).
        Blocking: call it where the database may be used, in the same hop as the sample's store
        (``sampler.rig_loop``): one thread hop a tick instead of one for the turns and one for the store."""
        self._queue_and_turns(sample.series, sample.detail)
        self._roofline(sample.series, sample.detail)
        self._energy(sample.series, sample.detail)
        self._keep_loaded(sample)
        self._keep_server_slots(sample)

    def _keep_server_slots(self, sample: Sample) -> None:
        """The slots the server reports, for the fair queue (``Rig.capacity``), and what the rig's page says of them;
        a router's model limit, for its swaps (``Rig.server_models_max``). A server that does not answer keeps the
        figures last read."""
        if sample.detail.get("sources", {}).get("backend", {}).get("ok"):
            self.rig.record_server_slots(sample.detail.get("server_slots"))
            self.rig.record_server_models_max(sample.detail.get("server_models_max"))
        rig = self.rig
        sample.detail["capacity"] = {"slots": rig.slots, "server_slots": rig.server_slots, "capacity": rig.capacity}
        if rig.server_slots is None:
            sample.detail["capacity"]["unreported"] = self.monitor.slots_unreported()

    def _keep_loaded(self, sample: Sample) -> None:
        """The models the server holds now, for placement (inference/queue/placement.py): stored when they change,
        and again before the kept list expires."""
        names = self.monitor.loaded_models(sample.detail)
        kept = (tuple(sorted(names)) if names is not None else None, sample.ts)
        previous = self.loaded_kept
        if previous is not None and kept[0] == previous[0] and sample.ts - previous[1] < served.TTL_S / 2:
            return
        served.loaded_store(self.rig.pk, names)
        self.loaded_kept = kept

    def _memory(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        try:
            for key, value in host.host_memory().items():
                series[f"host_{key}"] = value
            detail["sources"]["host"] = {"ok": True, "error": ""}
        except Unavailable as exc:
            detail["sources"]["host"] = {"ok": False, "error": str(exc)}
        self._backend_process(series, detail)
        survey = gpus.gpus(self.backend_pid if "process" in detail else None)
        rows = []
        for index, reading in enumerate(survey.readings):
            row = reading.as_dict()
            row["vendor_index"], row["index"] = reading.index, index  # series keys number every vendor's GPUs
            rows.append(row)
            for key, name in GPU_SERIES:
                if row.get(name) is not None:
                    series[f"gpu{index}_{key}"] = float(row[name])
        detail["gpus"] = rows
        if rows:
            detail["sources"]["gpu"] = {"ok": True, "error": ""}
            self._backend_vram(series, detail)
        else:
            detail["sources"]["gpu"] = {"ok": False, "error": survey.why_none}
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
        """The backend process's own GPU memory, as the GPUs' tools attribute it to the pid found for its port."""
        if "process" not in detail:
            return
        vram = placement.process_gpu_bytes(detail["gpus"])
        detail["process"]["vram_bytes"] = vram
        if vram is not None:
            series["backend_vram_bytes"] = vram
        for row in detail["gpus"]:
            if row.get("process_memory_bytes") is not None:
                series[f"gpu{row['index']}_backend_memory_bytes"] = float(row["process_memory_bytes"])

    def _placement(self, detail: dict[str, Any]) -> dict[str, Any]:
        """Where the weights live: unified memory never spills; else what the backend says (Ollama's /api/ps);
        else, with no GPU, system RAM; else the GPU memory attributed to the backend's process bounds it."""
        rows = detail.get("gpus") or []
        if placement.all_unified(rows):
            return placement.unified_placement(rows)
        told = self.monitor.placement(detail)
        if told is not None:
            return told
        if not rows:
            return {"vram_fraction": 0.0, "spill": False, "label": "CPU only: weights and KV cache in system RAM"}
        process = detail.get("process")
        why = "" if process else detail["sources"].get("process", {}).get("error") or "its process was not found"
        return placement.process_placement(
            rows, weight_bytes=self.weight_bytes, server=self.monitor.server, label=self.monitor.label, why_unseen=why
        )

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
            if self.monitor.rate_from_turns:  # no per-slot view: the rig's rate is its running turns'
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
        if any(slot.get("kv_bytes", 0.0) is None for slot in active):  # the server does not say a slot's context
            unknown = detail.get("sources", {}).get("kv_used", {}).get("error", "a slot's context is not reported")
            detail["roofline"] = {"ok": False, "error": f"the KV cache the decoding slots read is unknown: {unknown}"}
            return
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

    def _energy(self, series: dict[str, float], detail: dict[str, Any]) -> None:
        """Energy per decoded token: the power of the GPUs that hold the backend's memory over the rig's decode rate
        at this sample (J/token = W / (tokens/s)); absent where no GPU reports power or nothing is decoding."""
        watts = placement.power_w(detail.get("gpus") or [])
        rate = series.get("decode_tps") or 0.0
        if watts is None:
            why = "no GPU reports its power draw" if detail.get("gpus") else "no GPU seen (a CPU's power is not read)"
            detail["energy"] = {"ok": False, "error": f"power is not measurable: {why}"}
            return
        series["power_gpus_w"] = round(watts, 2)
        if rate > 0:
            series["energy_j_per_token"] = round(watts / rate, 4)
        # The calculator's figure for this rig: the same power at the bandwidth bound's rate (monitoring/calculator.py).
        if series.get("bound_tps"):
            series["energy_bound_j_per_token"] = round(watts / series["bound_tps"], 4)
        detail["energy"] = {"ok": True, "error": "" if rate > 0 else "nothing is decoding"}

    def energy_account(self, sample: Sample) -> None:
        """Add the interval since the previous sample to the rig's energy account in Redis
        (inference/live/energy.py)."""
        previous_ts, self.energy_at = self.energy_at, sample.ts
        if previous_ts is None:
            return
        energy = sample.detail.get("energy") or {}
        watts = sample.series.get("power_gpus_w") if energy.get("ok") else None
        why = str(energy.get("error", "")).removeprefix("power is not measurable: ")
        live_energy.energy_add(
            live.sync_client(), self.rig.pk, watts=watts, decode_tps=sample.series.get("decode_tps") or 0.0,
            interval_s=sample.ts - previous_ts, why=why,
        )  # fmt: skip


def is_idle(sample: Sample) -> bool:
    """Nothing on the rig to watch: no busy slot (a client other than RigDash counts too), no request the backend
    deferred, no turn of RigDash's waiting or running, no message in the rig's Celery queue. A sample whose queue
    and turns could not be read is not idle: the sampler keeps its full pace until it can see them."""
    series = sample.series
    if "active_turns" not in series:
        return False
    return not any(series.get(name, 0.0) for name in ("active_turns", "queue_depth", "busy_slots", "deferred_requests"))
