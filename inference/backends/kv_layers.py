"""A model's KV cache per layer, from its metadata: GGUF ``<arch>.*`` keys, which Ollama's ``/api/show`` returns
under the same names in ``model_info``.

The rules are llama.cpp's (``src/llama-model.cpp`` ``load_hparams``, ``src/llama-hparams.cpp``,
``src/llama-kv-cache.cpp``). They hold for Ollama as well: its current series runs GGUF models on llama-server
(``llm/llama_server.go``). tests/test_kv_llama_server.py checks them against the real llama-server's logged cache.
- ``attention.head_count_kv`` may be a list, one per layer; a layer with 0 KV heads has no attention (a hybrid's
  recurrent or MLP layer). Absent, it is ``attention.head_count`` (also per layer). A shorter list is padded with
  its single value.
- Head size: ``attention.key_length`` / ``value_length``, each by default ``embedding_length`` / the first layer's
  head count (the value size does not follow the key's); sliding-window layers take ``key_length_swa`` /
  ``value_length_swa`` where given.
- Which layers are recurrent (no per-token cache; a state per sequence instead): those ``attention.recurrent_layers``
  marks; else, where ``full_attention_interval`` is n (qwen3next and qwen3.5 say 4 when the GGUF does not), all
  but every n-th; else, in nemotron-h, a layer with neither KV heads nor a feed-forward; else one with 0 KV heads.
  A recurrent-only architecture (mamba, rwkv) has no per-token cache at all.
- Sliding-window layers (``attention.sliding_window``) are chosen by ``attention.sliding_window_pattern`` (a list of
  booleans, or n: n-1 sliding then one full), else by the architecture's fixed pattern (gemma2 and gpt-oss every
  other layer, gemma3 five of six, cohere2 three of four). How many cells they hold: monitoring/decode.py.
- MLA (deepseek2 and kin, marked by ``attention.key_length_mla``): the GGUF states the compressed cache itself
  (one KV head, key_length = kv_lora_rank + the rope dimension) and llama.cpp caches K only, V being a view of K.
  An older conversion without ``key_length_mla`` is cached as plain multi-head attention, as stated.
- A recurrent layer's state, f32, per sequence: (conv_kernel - 1) x (inner + 2 x groups x state) + state x inner.
"""

from __future__ import annotations

from typing import Any

from inference.backends.base import LayerKV

RECURRENT_ONLY = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# llama.cpp's full_attention_interval where the GGUF states none: all layers but every n-th are recurrent.
FULL_ATTENTION_INTERVAL = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "qwen4exp": 4}
# n: in each run of n layers, the first n-1 slide and the last attends to everything.
SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2, "gptoss": 2, "cohere2": 4}
F32_BYTES = 4


def _per_layer(value: Any, layers: int, default: list[int]) -> list[int]:
    """A scalar or per-layer list as one int per layer (a short list padded with its only value)."""
    if isinstance(value, list):
        if not value:
            raise ValueError("an empty per-layer list (Ollama's /api/show blanks long lists unless verbose)")
        pad = [int(value[0])] * layers if len(value) == 1 else default
        return [int(value[i]) if i < len(value) else pad[i] for i in range(layers)]
    return [int(value)] * layers if value is not None else list(default)


def _sliding(meta: dict[str, Any], arch: str, layers: int) -> list[bool]:
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and pattern:
        return [bool(pattern[i]) if i < len(pattern) else False for i in range(layers)]
    period = int(pattern) if isinstance(pattern, int | float) and pattern > 0 else SLIDING_PATTERN.get(arch, 0)
    if not period:
        return [False] * layers
    return [i % period < period - 1 for i in range(layers)]


def _recurrent(meta: dict[str, Any], arch: str, kv_heads: list[int]) -> list[bool]:
    count = len(kv_heads)
    listed = meta.get(f"{arch}.attention.recurrent_layers")
    if isinstance(listed, list) and listed:
        return [bool(listed[i]) if i < len(listed) else False for i in range(count)]
    if arch in RECURRENT_ONLY:
        return [True] * count
    interval = int(meta.get(f"{arch}.full_attention_interval") or FULL_ATTENTION_INTERVAL.get(arch, 0))
    if interval > 0:
        return [(i + 1) % interval != 0 for i in range(count)]
    if arch in ("nemotron_h", "nemotron_h_moe"):  # an MLP-only block has neither heads nor state
        ff = _per_layer(meta.get(f"{arch}.feed_forward_length"), count, [0] * count)
        return [n == 0 and ff[i] == 0 for i, n in enumerate(kv_heads)]
    return [n == 0 for n in kv_heads]


def _recurrent_state_bytes(meta: dict[str, Any], arch: str) -> int:
    def get(name: str) -> int:
        return int(meta.get(f"{arch}.ssm.{name}") or 0)

    conv, inner, state, groups = get("conv_kernel"), get("inner_size"), get("state_size"), get("group_count")
    rolling = (conv - 1) * (inner + 2 * groups * state) if conv > 0 else 0
    return (rolling + state * inner) * F32_BYTES


def layers_from_metadata(meta: dict[str, Any]) -> tuple[LayerKV, ...]:
    """Each layer's cache geometry (see the module's rules)."""
    arch = str(meta["general.architecture"])

    def get(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    def dim(name: str, default: int) -> int:
        return int(get(name) or default)

    count = int(get("block_count"))
    heads = _per_layer(get("attention.head_count"), count, [0] * count)
    kv_heads = _per_layer(get("attention.head_count_kv"), count, heads)
    first = heads[0] if heads and heads[0] else min((h for h in heads if h), default=1)
    head_dim = int(get("embedding_length")) // first
    key_dim, value_dim = dim("attention.key_length", head_dim), dim("attention.value_length", head_dim)
    key_swa, value_swa = dim("attention.key_length_swa", key_dim), dim("attention.value_length_swa", value_dim)
    mla = bool(get("attention.key_length_mla"))
    recurrent = _recurrent(meta, arch, kv_heads)
    kv_heads = [0 if recurrent[i] else n for i, n in enumerate(kv_heads)]
    window = int(get("attention.sliding_window") or 0)
    sliding = _sliding(meta, arch, count) if window else [False] * count
    state = _recurrent_state_bytes(meta, arch)
    return tuple(
        LayerKV(
            kv_heads=n,
            key_dim=key_swa if sliding[i] else key_dim,
            value_dim=0 if mla else (value_swa if sliding[i] else value_dim),
            window=window if sliding[i] else 0,
            state_bytes=state if recurrent[i] else 0,
        )
        for i, n in enumerate(kv_heads)
    )
