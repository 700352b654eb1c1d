"""Ollama's own arithmetic (inference/backends/ollama/rules.py, monitor.py) against the replay (tests/ollama_replay.py:
no Ollama binary runs here; the replay's sizes are written from Ollama's source, not from RigDash's code).

Each rule and where Ollama (v0.33) has it:
- sequences per model: OLLAMA_NUM_PARALLEL, default 1 (envconfig/config.go); 1 for embedding models and for the
  families server/sched.go ``load`` lists;
- batch: 512 / 1024 / 2048 by num_ctx x parallel (server/sched.go ``generationBatchForContext``);
- ``/api/ps`` ``size``: model + KV + compute buffers (llm/llama_server.go ``MemorySize``), so the weights are the file
  (``/api/tags`` ``size``), the KV the cache for ``-c num_ctx*parallel -np parallel`` (llm/llama_server.go), and the
  rest the graph.
"""

from __future__ import annotations

import asyncio

import pytest

from inference.backends.base import ChatRequest
from inference.backends.monitor import MonitorContext
from inference.backends.ollama import OllamaBackend, rules
from inference.backends.ollama.monitor import OllamaMonitor
from inference.models import Rig
from tests.ollama_replay import OllamaReplay, kv_cache_bytes, single_sequence, smollm2

SMOLLM2_KV_PER_TOKEN = 23_040  # 2 x 30 layers x 3 KV heads x 64 x 2 bytes (docs: llama-server logs 90 MiB at -c 4096)


@pytest.mark.parametrize(
    ("family", "completion", "configured", "expected"),
    [
        ("llama", True, None, 1),  # Ollama's default
        ("llama", True, 4, 4),
        ("qwen3vl", True, 4, 1),  # forced to one sequence
        ("lfm2", True, 2, 1),
        ("nomic-bert", False, 4, 1),  # an embedding model
    ],
)
def test_num_parallel(family, completion, configured, expected):
    assert rules.num_parallel(family, completion=completion, configured=configured) == expected


@pytest.mark.parametrize(
    ("context", "parallel", "batch"),
    [(2048, 1, 512), (4096, 1, 512), (4097, 1, 1024), (4096, 2, 1024), (32768, 1, 1024), (32769, 1, 2048)],
)
def test_generation_batch_follows_the_context(context, parallel, batch):
    assert rules.generation_batch(context, parallel) == batch


def test_memory_split_never_exceeds_size():
    assert rules.memory_split(1000, weights=600, kv=300.0) == rules.MemorySplit(1000, 600, 300, 100)
    assert rules.memory_split(1000, weights=1200, kv=300.0) == rules.MemorySplit(1000, 1000, 0, 0)
    assert rules.memory_split(1000, weights=None, kv=300.0).graph is None


def _load(replay: OllamaReplay, model: str, num_ctx: int) -> None:
    async def go() -> None:
        request = ChatRequest(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, num_ctx=num_ctx)
        async for _ in OllamaBackend(replay.url).stream_chat(request):
            pass

    asyncio.run(go())


def _sample(replay: OllamaReplay, *, parallel: int | None = None) -> tuple[dict, dict]:
    monitor = OllamaMonitor(
        MonitorContext(rig=Rig(name="o", kind=Rig.Kind.OLLAMA, base_url=replay.url, slots=4), server_parallel=parallel)
    )
    series: dict = {}
    detail: dict = {"sources": {}, "provenance": {}}
    asyncio.run(monitor.read(0.0, series, detail))
    return series, detail


@pytest.fixture
def replay():
    server = OllamaReplay(models=[smollm2(), single_sequence()]).start()
    yield server
    server.stop()


def test_weights_kv_and_graph_apart(replay):
    """The roofline's weights are the file, not /api/ps size (which holds the KV and compute buffers too)."""
    _load(replay, "smollm2:135m", 4096)
    series, detail = _sample(replay)
    (row,) = detail["loaded_models"]
    kv = SMOLLM2_KV_PER_TOKEN * 4096
    assert row["size_bytes"] == 105_000_000 + kv + 16 * 2**20  # what the replay's /api/ps says
    assert (row["weight_bytes"], row["kv_allocated_bytes"], row["graph_bytes"]) == (105_000_000, kv, 16 * 2**20)
    assert (row["parallel"], row["batch"], row["context_length"]) == (1, 512, 4096)
    assert series["weight_bytes"] == 105_000_000 < series["loaded_bytes"]
    assert row["expires_at"]  # the idle unload time (keep_alive)


def test_parallel_and_batch_per_loaded_model(replay):
    """OLLAMA_NUM_PARALLEL=4: four sequences of num_ctx each, a batch for the whole context; a single-sequence family
    keeps one, with the same setting."""
    replay.num_parallel = 4
    _load(replay, "smollm2:135m", 2048)
    _load(replay, "qwen3-vl:2b", 8192)
    _, detail = _sample(replay, parallel=4)
    rows = {row["name"]: row for row in detail["loaded_models"]}
    small, vision = rows["smollm2:135m"], rows["qwen3-vl:2b"]
    assert (small["parallel"], small["batch"]) == (4, 1024)
    assert small["kv_allocated_bytes"] == kv_cache_bytes(smollm2(), 2048, 4) == SMOLLM2_KV_PER_TOKEN * 2048 * 4
    assert (vision["parallel"], vision["batch"], vision["context_length"]) == (1, 1024, 8192)
    assert vision["graph_bytes"] == 16 * 2**20
    # Left at Ollama's default (RigDash not told of OLLAMA_NUM_PARALLEL), the KV is one sequence's: too small.
    _, default = _sample(replay)
    assert {r["name"]: r["parallel"] for r in default["loaded_models"]}["smollm2:135m"] == 1
