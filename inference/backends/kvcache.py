"""KV-cache arithmetic as plain functions: what a model's cache holds and what a backend allocates for it.

KV bytes, per layer (inference/backends/kv_layers.py): KV heads x (key dim + value dim) x bytes per element for
each token the layer holds. A full-attention layer holds every token of the context; a sliding-window layer at
most its window plus one batch per sequence; a layer without attention none (a recurrent layer's state is a fixed
size per sequence, f32). ``kv_bytes_per_token`` is what each further token of context adds (the full-attention
layers); ``kv_bytes`` what n tokens in each of p sequences hold; ``kv_allocated_bytes`` what the backend allocates
for a context of n tokens per sequence and p sequences, cell for cell as llama.cpp does (llama-server's
``-c n*p -np p``, which is also how Ollama's current series starts it for num_ctx n and OLLAMA_NUM_PARALLEL p;
checked against the real llama-server in tests/test_kv_llama_server.py).
"""

from __future__ import annotations

from inference.backends.base import LayerKV, ModelArchitecture

# Bytes per element of llama.cpp's KV cache types (block formats: bytes per 32-element block / 32).
KV_CACHE_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}


UBATCH = 512  # a sliding-window layer holds its window plus one batch (llama.cpp's -ub, Ollama's num_batch)
KV_PAD = 256  # llama.cpp pads the context, each sequence's share and the sliding-window cache to 256 cells


def ollama_kv_cache_type(requested: str, *, flash_attention: bool | None = None) -> str:
    """What Ollama's cache is for OLLAMA_KV_CACHE_TYPE=``requested`` (empty: f16). Since v0.30 Ollama passes it to
    llama-server as is (llm/server.go, ``--cache-type-k/-v``) with ``--flash-attn auto``, or on/off where
    OLLAMA_FLASH_ATTENTION says so or the GPU has none (``flash_attention`` True/False; None: auto). llama.cpp turns
    flash attention on for a quantized V cache under auto; with it off, the model does not load."""
    cache_type = (requested or "f16").lower()
    _element_bytes(cache_type)  # a type llama.cpp does not know: ValueError, as llama-server refuses it
    if flash_attention is False and cache_type not in ("f32", "f16", "bf16"):
        raise ValueError(f"a {cache_type} V cache needs flash attention, which is off: Ollama cannot load the model")
    return cache_type


def _element_bytes(cache_type: str) -> float:
    try:
        return KV_CACHE_TYPE_BYTES[cache_type]
    except KeyError:
        raise ValueError(f"unknown KV cache type {cache_type!r}; known: {sorted(KV_CACHE_TYPE_BYTES)}") from None


def _layers(arch: ModelArchitecture) -> tuple[LayerKV, ...]:
    if arch.layers:
        return arch.layers
    key_dim = arch.key_length or arch.embedding_length // arch.head_count
    return (LayerKV(arch.head_count_kv, key_dim, arch.value_length or key_dim),) * arch.block_count


def kv_bytes_per_token(arch: ModelArchitecture, cache_type: str = "f16") -> float:
    """Bytes each further token of context adds: the full-attention layers' K and V."""
    element = _element_bytes(cache_type)
    return sum(
        layer.kv_heads * (layer.key_dim + layer.value_dim) * element for layer in _layers(arch) if not layer.window
    )


def kv_bytes(arch: ModelArchitecture, tokens: int, cache_type: str = "f16", *, parallel: int = 1) -> float:
    """Bytes of cache that ``tokens`` of context in each of ``parallel`` sequences hold (a sliding-window layer at
    most window x parallel + one batch)."""
    element = _element_bytes(cache_type)
    cells = tokens * parallel
    total = 0.0
    for layer in _layers(arch):
        held = min(cells, layer.window * parallel + UBATCH) if layer.window else cells
        total += held * layer.kv_heads * (layer.key_dim + layer.value_dim) * element + layer.state_bytes * parallel
    return total


def _pad(cells: int) -> int:
    return -(-cells // KV_PAD) * KV_PAD


def kv_cells(
    tokens: int,
    *,
    parallel: int = 1,
    window: int = 0,
    ubatch: int = UBATCH,
    unified: bool = False,
    swa_full: bool = False,
) -> int:
    """Cells llama.cpp gives each stream in one layer (``llama_kv_cache_iswa``, src/llama-kv-cache-iswa.cpp).

    Per sequence (``unified`` False: ``-c tokens*parallel -np parallel``, one stream per sequence, llama-server's
    default when the slot count is given): the context padded to 256, each sequence's share padded to 256; a
    sliding-window layer the window plus one micro-batch (no more than the context), padded to 256.

    Unified (``-kvu``, and llama-server's default without ``-np``: 4 slots over one cache): one stream of ``tokens``
    cells (the whole ``-c``, which every slot reports as its n_ctx) padded to 256, shared by the ``parallel``
    sequences; a sliding-window layer holds the window of every sequence plus one micro-batch
    (``llama_kv_cache_iswa``: ``n_swa * n_seq_max + n_ubatch``), no more than the pool, padded to 256.

    llama4's chunked layers are sized the same way, their chunk as the window. ``swa_full`` (llama-server's
    ``--swa-full``): sliding-window layers hold as many cells as full-attention ones."""
    if swa_full:
        window = 0
    if unified:
        pool = _pad(tokens)
        if not window:
            return pool
        return _pad(min(pool, window * parallel + min(ubatch, tokens)))
    context = tokens * parallel
    per_sequence = _pad(_pad(context) // parallel)
    if not window:
        return per_sequence
    ubatch = min(ubatch, context)  # llama.cpp: the batch is no larger than the context
    return min(per_sequence, _pad(window + ubatch))


def kv_allocated_bytes(
    arch: ModelArchitecture,
    tokens: int,
    cache_type: str = "f16",
    *,
    parallel: int = 1,
    ubatch: int = UBATCH,
    unified: bool = False,
    swa_full: bool = False,
) -> float:
    """Bytes the backend allocates for ``parallel`` sequences (see ``kv_cells``): ``tokens`` of context per sequence,
    or with ``unified`` one pool of ``tokens`` cells they share; recurrent states included, one per sequence."""
    element = _element_bytes(cache_type)
    streams = 1 if unified else parallel
    total = 0.0
    for layer in _layers(arch):
        cells = kv_cells(
            tokens, parallel=parallel, window=layer.window, ubatch=ubatch, unified=unified, swa_full=swa_full
        )
        cells *= streams
        total += cells * layer.kv_heads * (layer.key_dim + layer.value_dim) * element + layer.state_bytes * parallel
    return total
