"""RigDash's Prometheus export through ``prometheus_client``: each rig's latest sample as gauges (and llama-server's
own counters as counters), and histograms and counters of finished turns.

A custom collector computes everything from the database at scrape time, not multiprocess mode: the database is
the record every web and worker process shares, so any process answers with the same exact figures and no frozen
worker code or shared metrics directory is needed (https://prometheus.github.io/client_python/collector/custom/).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from django.contrib.auth.models import Group
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from inference.live import ratewindow
from inference.models import ApiKey, Rig
from monitoring import selectors
from monitoring.turn_metrics import Totals, turn_totals

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes
NO_GROUP = "none"

# sample series name -> (metric name, help)
GAUGES = {
    "decode_tps": ("rigdash_decode_tokens_per_second", "Decode tokens/s of the rig, all slots together"),
    "bound_tps": ("rigdash_decode_bound_tokens_per_second", "Memory-bandwidth bound on decode tokens/s"),
    "roofline_ratio": ("rigdash_roofline_ratio", "Measured decode tokens/s over the bandwidth bound"),
    "busy_slots": ("rigdash_busy_slots", "Backend slots processing a request"),
    "total_slots": ("rigdash_slots", "Backend slots"),
    "deferred_requests": ("rigdash_deferred_requests", "Requests the backend deferred (all slots busy)"),
    "queue_depth": ("rigdash_queue_depth", "Turns waiting in the rig's Celery queue"),
    "active_turns": ("rigdash_active_turns", "Turns queued or running on the rig"),
    "context_tokens": ("rigdash_context_tokens", "Tokens held in the backend's context, all slots"),
    "kv_bytes_per_token": ("rigdash_kv_bytes_per_token", "KV-cache bytes per token of context"),
    "kv_used_bytes": ("rigdash_kv_used_bytes", "KV-cache bytes holding tokens now"),
    "kv_allocated_bytes": ("rigdash_kv_allocated_bytes", "KV-cache bytes allocated (all slots' context)"),
    "weight_bytes": ("rigdash_model_weight_bytes", "Model weight bytes"),
    "host_used_bytes": ("rigdash_host_memory_used_bytes", "System RAM in use"),
    "host_total_bytes": ("rigdash_host_memory_total_bytes", "System RAM"),
    "backend_rss_bytes": ("rigdash_backend_resident_bytes", "Resident memory of the backend process"),
    "backend_vram_bytes": ("rigdash_backend_vram_bytes", "GPU memory the GPUs' tools attribute to the backend process"),
    "energy_j_per_token": (
        "rigdash_energy_joules_per_token",
        "GPU power over the rig's decode rate at the sample: joules per decoded token (GPUs that report power only)",
    ),
    "power_gpus_w": ("rigdash_backend_gpus_power_watts", "Power of the GPUs that hold the backend's memory"),
    "spec_acceptance": (
        "rigdash_backend_draft_acceptance_ratio",
        "Draft tokens accepted over drafted since the backend started (llama-server's counters)",
    ),
}
# llama-server's own counters (monotonic; they restart with the server): sample series -> (name without _total, help)
BACKEND_COUNTERS = {
    "llamacpp_tokens_predicted_total": ("rigdash_backend_tokens_predicted", "Backend counter of decoded tokens"),
    "llamacpp_prompt_tokens_total": ("rigdash_backend_prompt_tokens", "Backend counter of prompt tokens"),
    "llamacpp_spec_decode_num_draft_tokens_total": (
        "rigdash_backend_draft_tokens", "Backend counter of tokens its draft model proposed"),
    "llamacpp_spec_decode_num_accepted_tokens_total": (
        "rigdash_backend_draft_accepted_tokens", "Backend counter of draft tokens the model accepted"),
}  # fmt: skip
GPU_SERIES = re.compile(r"gpu(\d+)_(\w+)")  # a sample's per-GPU series: gpu<index>_<reading>
GPU_GAUGES = {
    "memory_used_bytes": ("rigdash_gpu_memory_used_bytes", "GPU memory used"),
    "memory_total_bytes": ("rigdash_gpu_memory_total_bytes", "GPU memory"),
    "memory_reserved_bytes": ("rigdash_gpu_memory_reserved_bytes", "GPU memory the driver reserves for itself"),
    "utilization_pct": ("rigdash_gpu_utilization_percent", "GPU utilisation"),
    "power_w": ("rigdash_gpu_power_watts", "GPU power draw"),
    "temperature_c": ("rigdash_gpu_temperature_celsius", "GPU temperature"),
    "backend_memory_bytes": ("rigdash_gpu_backend_memory_bytes", "GPU memory held by the backend process, per GPU"),
}
HISTOGRAMS = {
    "ttft": ("rigdash_time_to_first_token_seconds", "Backend request to first token of finished turns"),
    "itl": ("rigdash_inter_token_latency_seconds", "Gaps between successive tokens of finished turns"),
    "duration": ("rigdash_request_duration_seconds", "Backend request to last token of finished turns"),
    "queue": ("rigdash_queue_wait_seconds", "Turn created to started on the rig (RigDash's fair queue)"),
}
RIG_MODEL = ["rig", "model"]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def rig_metrics(rigs: list[dict[str, Any]]) -> Iterator[Metric]:
    """``rigs``: [{"name", "model", "up", "series", "turns_by_user"}] -> the rigs' gauges and backend counters."""
    up = GaugeMetricFamily("rigdash_rig_up", "1 when RigDash's last sample reached the rig's backend", labels=RIG_MODEL)
    for r in rigs:
        up.add_metric([r["name"], r["model"]], 1.0 if r["up"] else 0.0)
    yield up
    agent_up = GaugeMetricFamily("rigdash_agent_up", "1 while the rig's agent heartbeat is fresh (rigs with an agent)",
                                 labels=RIG_MODEL)  # fmt: skip
    spilled = GaugeMetricFamily("rigdash_weights_spilled", "1 when the rig's model weights are proven partly in system "
                                "RAM, 0 when proven not (absent: unknown)", labels=RIG_MODEL)  # fmt: skip
    for r in rigs:
        if r.get("agent_up") is not None:
            agent_up.add_metric([r["name"], r["model"]], 1.0 if r["agent_up"] else 0.0)
        if r.get("spill") is not None:
            spilled.add_metric([r["name"], r["model"]], 1.0 if r["spill"] else 0.0)
    yield agent_up
    yield spilled
    for key, (metric, help_text) in GAUGES.items():
        gauge = GaugeMetricFamily(metric, help_text, labels=RIG_MODEL)
        for r in rigs:
            if (value := _number(r["series"].get(key))) is not None:
                gauge.add_metric([r["name"], r["model"]], value)
        yield gauge
    for key, (metric, help_text) in BACKEND_COUNTERS.items():
        counter = CounterMetricFamily(metric, help_text, labels=RIG_MODEL)
        for r in rigs:
            if (value := _number(r["series"].get(key))) is not None:
                counter.add_metric([r["name"], r["model"]], value)
        yield counter
    for key, (metric, help_text) in GPU_GAUGES.items():
        gauge = GaugeMetricFamily(metric, help_text, labels=[*RIG_MODEL, "gpu"])
        for r in rigs:
            for name, raw in r["series"].items():
                value = _number(raw)
                found = GPU_SERIES.fullmatch(name)
                if found and found[2] == key and value is not None:
                    gauge.add_metric([r["name"], r["model"], found[1]], value)
        yield gauge
    by_user = GaugeMetricFamily("rigdash_active_turns_by_user", "Turns queued or running, by user",
                                labels=[*RIG_MODEL, "user"])  # fmt: skip
    for r in rigs:
        for user, count in r["turns_by_user"].items():
            by_user.add_metric([r["name"], r["model"], user], float(count))
    yield by_user


def turn_metrics(
    totals: Totals,
    rig_names: dict[int, str],
    user_groups: dict[int, str],
    keys: dict[int, tuple[str, str]] | None = None,
) -> Iterator[Metric]:
    """Histograms and counters of finished turns, labelled by rig name, model and (tokens) user group; the requests
    and tokens of API keys by key (``keys``: id -> (name, owner's username); a key deleted since is left out)."""
    for name, (metric, help_text) in HISTOGRAMS.items():
        histograms = HistogramMetricFamily(metric, help_text, labels=RIG_MODEL)
        for (kind, (rig_id, model)), histogram in sorted(totals.histograms.items()):
            if kind == name:
                rig = rig_names.get(rig_id, str(rig_id))
                histograms.add_metric([rig, model], histogram.cumulative(), histogram.total)
        yield histograms
    turns = CounterMetricFamily("rigdash_turns", "Finished turns by final status", labels=[*RIG_MODEL, "status"])
    for (rig_id, model, status), count in sorted(totals.turns.items()):
        turns.add_metric([rig_names.get(rig_id, str(rig_id)), model, status], count)
    yield turns
    for metric, help_text, by_user in (
        ("rigdash_prompt_tokens", "Prompt tokens of finished turns", totals.prompt_tokens),
        ("rigdash_generation_tokens", "Reply tokens of finished turns", totals.output_tokens),
    ):
        by_group: Counter[tuple[str, str, str]] = Counter()
        for (rig_id, model, user_id), count in by_user.items():
            by_group[(rig_names.get(rig_id, str(rig_id)), model, user_groups.get(user_id, NO_GROUP))] += count
        family = CounterMetricFamily(metric, f"{help_text} (by the user's first group)", labels=[*RIG_MODEL, "group"])
        for labels, count in sorted(by_group.items()):
            family.add_metric(list(labels), count)
        yield family
    for metric, help_text, counts in (
        ("rigdash_draft_tokens", "Draft tokens proposed in finished turns (speculative decoding)", totals.draft_tokens),
        ("rigdash_draft_accepted_tokens", "Draft tokens accepted in finished turns", totals.draft_accepted_tokens),
    ):
        family = CounterMetricFamily(metric, help_text, labels=RIG_MODEL)
        for (rig_id, model), count in sorted(counts.items()):
            family.add_metric([rig_names.get(rig_id, str(rig_id)), model], count)
        yield family
    yield from key_metrics(totals, keys or {})


KEY_LABELS = ["key_id", "key", "owner"]


def key_metrics(totals: Totals, keys: dict[int, tuple[str, str]]) -> Iterator[Metric]:
    """Finished requests (turns) and their tokens per API key: ``/v1/`` and Ollama's ``/api/`` clients' use."""
    requests = CounterMetricFamily(
        "rigdash_api_key_requests", "Finished API requests by key and final status", labels=[*KEY_LABELS, "status"]
    )
    for (key_id, status), count in sorted(totals.key_requests.items()):
        if key_id in keys:
            requests.add_metric([str(key_id), *keys[key_id], status], count)
    yield requests
    for metric, help_text, counts in (
        ("rigdash_api_key_prompt_tokens", "Prompt tokens of finished API requests by key", totals.key_prompt_tokens),
        ("rigdash_api_key_generation_tokens", "Reply tokens of finished API requests by key", totals.key_output_tokens),
    ):
        family = CounterMetricFamily(metric, help_text, labels=KEY_LABELS)
        for key_id, count in sorted(counts.items()):
            if key_id in keys:
                family.add_metric([str(key_id), *keys[key_id]], count)
        yield family


def _rig_rows() -> list[dict[str, Any]]:
    rigs = []
    enabled = list(Rig.objects.filter(enabled=True))
    newest = selectors.rigs_latest(enabled)  # two queries for every rig, not one per rig
    for rig in enabled:
        latest = newest.get(rig.pk) or {"series": {}, "detail": {}}
        detail = latest["detail"]
        rigs.append(
            {
                "name": rig.name,
                "model": str(detail.get("model", "")),
                "up": bool(detail.get("sources", {}).get("backend", {}).get("ok")),
                "series": latest["series"],
                "turns_by_user": Counter(turn["user"] for turn in detail.get("turns", [])),
                "agent_up": (detail.get("agent") or {}).get("up") if rig.agent_key else None,
                "spill": (detail.get("placement") or {}).get("spill"),
            }
        )
    return rigs


def key_labels(key_ids: set[int]) -> dict[int, tuple[str, str]]:
    """The name and owner's username of each API key still there (no query when no key made a request)."""
    if not key_ids:
        return {}
    keys = ApiKey.objects.filter(pk__in=key_ids).values_list("id", "name", "owner__username")
    return {pk: (name, owner) for pk, name, owner in keys}


def user_groups() -> dict[int, str]:
    """Each user in a group -> the name of their first group by name (a user counts in one group only)."""
    first: dict[int, str] = {}
    memberships = defaultdict(list)
    for user_id, name in Group.user_set.through.objects.values_list("user_id", "group__name"):
        memberships[user_id].append(name)
    for user_id, names in memberships.items():
        first[user_id] = min(names)
    return first


class RigDashCollector:
    """Reads the database at every scrape (``turn_totals`` keeps finished turns' totals incrementally)."""

    def describe(self) -> list[Metric]:
        return []  # unknown until a scrape: the registry must not call collect() at registration

    def collect(self) -> Iterator[Metric]:
        yield from rig_metrics(_rig_rows())
        rig_names = dict(Rig.objects.values_list("id", "name"))
        totals = turn_totals.snapshot()
        yield from turn_metrics(totals, rig_names, user_groups(), key_labels({k for k, _ in totals.key_requests}))
        yield rate_limited_metric()


def rate_limited_metric() -> Metric:
    """Requests refused by a rate limit, by scope (user, key) and limit, from Redis (inference/live/ratewindow.py)."""
    help_text = "Requests refused by a rate limit (HTTP 429 or an error frame)"
    family = CounterMetricFamily("rigdash_rate_limited", help_text, labels=["scope", "limit"])
    try:
        counts = ratewindow.refusals()
    except Exception:  # Redis down: the rest of the scrape still answers
        counts = {}
    for label, count in sorted(counts.items()):
        scope, _, limit = label.partition(":")
        family.add_metric([scope, limit], count)
    return family


registry = CollectorRegistry(auto_describe=False)
registry.register(RigDashCollector())  # type: ignore[arg-type]


def render(rigs: list[dict[str, Any]] | None = None) -> str:
    """The exposition text: of everything (``rigs`` None), or of the given rigs' gauges alone."""
    if rigs is None:
        return generate_latest(registry).decode()
    one_off = CollectorRegistry(auto_describe=False)
    one_off.register(_Fixed(list(rig_metrics(rigs))))  # type: ignore[arg-type]
    return generate_latest(one_off).decode()


class _Fixed:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)
