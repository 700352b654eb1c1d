"""Ollama's own arithmetic, as its source (v0.33) does it: how many sequences a loaded model runs, the batch it
loads with, and what ``/api/ps`` ``size`` holds. Pure functions; the monitor (``monitor.py``) applies them.

- Parallel sequences (server/sched.go ``load``): ``OLLAMA_NUM_PARALLEL`` (envconfig/config.go: default 1), forced to
  1 for a model without the completion capability (an embedding model) and for the families in
  ``SINGLE_SEQUENCE_FAMILIES`` ("not safe with num_parallel > 1", ollama/ollama#4165).
- The runner is llama-server started with ``-c num_ctx*parallel -np parallel`` (llm/llama_server.go), so the KV
  cache is ``parallel`` sequences of ``num_ctx`` (inference/backends/kvcache.py does llama.cpp's cells).
- Batch (server/sched.go ``automaticGenerationBatch``, ``generationBatchForContext``): with ``num_batch`` not set,
  512 up to 4096 tokens of context (num_ctx x parallel), 1024 up to 32768, 2048 above; lowered step by step where the
  estimate leaves too little memory free, and 512 (256 on a GPU of 8 GiB or less past 4096 tokens) on CUDA without
  flash attention. RigDash sees neither the free memory at load nor the flash-attention choice: ``generation_batch``
  is the figure for the context, the most Ollama picks.
- ``/api/ps`` ``size`` (server/routes.go PsHandler, from llm/llama_server.go ``MemorySize``): the sum of the model,
  KV, compute, output and recurrent-state buffers llama-server logged at load, per loaded model; ``size_vram`` the
  part of them on GPUs. Not the weights: the weights are the model file (``/api/tags`` ``size``, which Ollama's own
  estimate takes for them, ``PredictServerVRAM``), the KV is the cache above, the rest is compute buffers (graph).
"""

from __future__ import annotations

from dataclasses import dataclass

# server/sched.go, load(): families whose runner always has one sequence.
SINGLE_SEQUENCE_FAMILIES = frozenset(
    {
        "mllama", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3next", "lfm2", "lfm2moe", "nemotron_h",
        "nemotron_h_moe", "nemotron_h_omni",
    }
)  # fmt: skip
DEFAULT_NUM_PARALLEL = 1  # envconfig/config.go: NumParallel = Uint("OLLAMA_NUM_PARALLEL", 1)
DEFAULT_LOAD_TIMEOUT_S = 300.0  # envconfig/config.go LoadTimeout: OLLAMA_LOAD_TIMEOUT, default 5 minutes
BATCH_DEFAULT, BATCH_MEDIUM, BATCH_LARGE = 512, 1024, 2048  # server/sched.go llamaServerGenerationBatch*


def num_parallel(family: str, *, completion: bool = True, configured: int | None = None) -> int:
    """Sequences Ollama's runner holds for a model of ``family`` (``configured``: OLLAMA_NUM_PARALLEL where known)."""
    parallel = max(configured or DEFAULT_NUM_PARALLEL, 1)
    if not completion or family in SINGLE_SEQUENCE_FAMILIES:
        return 1
    return parallel


def generation_batch(context_tokens: int, parallel: int = 1) -> int:
    """The batch Ollama picks for ``context_tokens`` per sequence x ``parallel`` (num_batch unset), at most."""
    effective = context_tokens * max(parallel, 1)
    if effective > 32768:
        return BATCH_LARGE
    if effective > 4096:
        return BATCH_MEDIUM
    return BATCH_DEFAULT


@dataclass(frozen=True)
class MemorySplit:
    """One loaded model's ``size`` taken apart: weights, KV cache and the rest (compute buffers: the graph)."""

    size: int
    weights: int | None
    kv: int | None
    graph: int | None


def memory_split(size: int, *, weights: int | None, kv: float | None) -> MemorySplit:
    """``size`` (``/api/ps``) less the weights (the model file) and the KV (the cache as allocated): the graph. A
    part that is unknown leaves the graph unknown; none is larger than what is left of ``size``."""
    kept_weights = min(weights, size) if weights else None
    kept_kv = min(round(kv), size - (kept_weights or 0)) if kv else None
    graph = size - kept_weights - kept_kv if kept_weights is not None and kept_kv is not None else None
    return MemorySplit(size=size, weights=kept_weights, kv=kept_kv, graph=graph)
