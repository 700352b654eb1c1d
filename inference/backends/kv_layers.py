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
- Sliding-window layers: only in the families whose ``load_arch_hparams`` (``src/models/<arch>.cpp``) sets a
  ``swa_type`` (``SWA_FAMILIES``; any other family's ``sliding_window`` key is ignored, phi3's explicitly). Which
  layers: ``attention.sliding_window_pattern`` (a list of booleans, or n), else the family's n
  (``llama_model_base::load_swa_pattern`` -> ``llama_hparams::set_swa_pattern``): n-1 sliding then one full, or with
  ``dense_first`` one full then n-1 sliding; n = 0: every layer slides. Window: the GGUF's ``sliding_window``, some
  families with a default (gemma2 4096, exaone4's 64-layer 32B 4096) or a fixed value (llama4 8192, smallthinker
  4096); several slide only when the GGUF states a window above 0. How many cells they hold: kvcache.py.
- llama4's chunked attention (``LLAMA_SWA_TYPE_CHUNKED``, src/models/llama4.cpp): three layers of four attend within
  chunks of 8192 tokens (fixed: a ``sliding_window`` of 0 turns it off, any other value is ignored) and are cached in
  the sliding-window cache, sized as a window of 8192 (``llama_kv_cache_iswa``).
- NextN/MTP layers (``nextn_predict_layers``, the last layers of ``block_count``): no cache in the main context
  (``llama_model::create_memory``: ``filter = il < n_layer()``; the hybrids' ``filter_attn`` / ``filter_recr`` the
  same), nor a recurrent state. Only a speculative MTP draft context caches them, apart.
- falcon-h1: every layer has both an attention cache and a Mamba-2 state (``create_memory``: both filters true);
  lfm2: its short-convolution layers (0 KV heads) keep ``(shortconv.l_cache - 1) x embedding`` f32 a sequence, and
  with a window every attention layer slides (src/models/lfm2.cpp, ``llama_memory_hybrid_iswa``).
- Shared-KV layers (gemma3n, gemma4): layers from ``n_layer_kv_from_start`` on reuse an earlier layer's cache
  (``llama_hparams::has_kv``, ``create_memory``'s ``reuse``) and allocate none: gemma3n's first 20 layers have a cache
  (fixed in src/models/gemma3n.cpp), gemma4's all but the last ``attention.shared_kv_layers``.
- MLA (deepseek2 and kin, marked by ``attention.key_length_mla``): the GGUF states the compressed cache itself
  (one KV head, key_length = kv_lora_rank + the rope dimension) and llama.cpp caches K only, V being a view of K.
  An older conversion without ``key_length_mla`` is cached as plain multi-head attention, as stated.
- A recurrent layer's state, f32, per sequence (``llama_hparams::n_embd_r`` + ``n_embd_s``): (conv_kernel - 1) x
  (inner + 2 x groups x state) + state x inner; RWKV (token_shift_count x embedding) + embedding x wkv.head_size.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from inference.backends.base import LayerKV

RECURRENT_ONLY = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# llama.cpp's full_attention_interval where the GGUF states none: all layers but every n-th are recurrent.
FULL_ATTENTION_INTERVAL = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "qwen4exp": 4}
F32_BYTES = 4


class SwaRule(NamedTuple):
    """A family's sliding-window rule, from its ``load_arch_hparams`` in llama.cpp b11434's src/models/<file>.cpp.

    ``period``: n of ``load_swa_pattern(ml, n, dense_first)`` (None: the GGUF's pattern list is required).
    ``window``: the window where the GGUF states none (0: none, no sliding); ``fixed``: llama.cpp's window whatever
    the GGUF says. ``needs_window``: the family slides only when the GGUF states a window above 0. ``layers``: the
    family slides only with this many layers (exaone4: its 32B)."""

    period: int | None
    dense_first: bool = False
    window: int = 0
    fixed: int = 0
    needs_window: bool = False
    layers: int = 0


SWA_FAMILIES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, window=4096),  # gemma2.cpp
    "gemma3": SwaRule(6, needs_window=True),  # gemma3.cpp
    "gemma3n": SwaRule(5),  # gemma3n.cpp
    "gemma4": SwaRule(None),  # gemma4.cpp: the pattern list only
    "gpt-oss": SwaRule(2),  # openai-moe.cpp
    "gptoss": SwaRule(2),  # the same, as Ollama names it
    "cohere2": SwaRule(4),  # cohere2.cpp
    "cohere2moe": SwaRule(4, dense_first=True),  # cohere2moe.cpp
    "exaone4": SwaRule(4, window=4096, layers=64),  # exaone4.cpp: the 64-layer 32B only
    "exaone-moe": SwaRule(4, window=128),  # exaone-moe.cpp
    "olmo2": SwaRule(4, needs_window=True),  # olmo2.cpp
    "plamo3": SwaRule(8, needs_window=True),  # plamo3.cpp
    "smallthinker": SwaRule(4, dense_first=True, fixed=4096, needs_window=True),  # smallthinker.cpp
    "mellum": SwaRule(4, needs_window=True),  # mellum.cpp
    "afmoe": SwaRule(4, needs_window=True),  # afmoe.cpp
    "laguna": SwaRule(4, dense_first=True, needs_window=True),  # laguna.cpp
    "muse-glimmer": SwaRule(4),  # muse-glimmer.cpp
    "llama4": SwaRule(4, fixed=8192),  # llama4.cpp: chunked attention, chunks of 8192
    **{arch: SwaRule(None) for arch in ("granite-swa", "maple", "mimo2", "spark2-5", "step35")},
    "lfm2": SwaRule(0, needs_window=True),  # lfm2.cpp: the attention layers slide (below); lfm2moe never
}
# gemma3n.cpp: the first 20 layers hold a cache, the rest reuse one of them (llama_hparams::n_layer_kv_from_start).
GEMMA3N_KV_LAYERS = 20


def _per_layer(value: Any, layers: int, default: list[int]) -> list[int]:
    """A scalar or per-layer list as one int per layer (a short list padded with its only value)."""
    if isinstance(value, list):
        if not value:
            raise ValueError("an empty per-layer list (Ollama's /api/show blanks long lists unless verbose)")
        pad = [int(value[0])] * layers if len(value) == 1 else default
        return [int(value[i]) if i < len(value) else pad[i] for i in range(layers)]
    return [int(value)] * layers if value is not None else list(default)


def swa_window(meta: dict[str, Any], arch: str, trunk: int) -> int:
    """The sliding (or chunked) window llama.cpp uses for ``arch``, 0 when it has no sliding-window layers."""
    rule = SWA_FAMILIES.get(arch)
    if rule is None or (rule.layers and trunk != rule.layers):
        return 0
    stated = meta.get(f"{arch}.attention.sliding_window")
    if rule.fixed:  # llama4: a stated 0 turns chunking off; smallthinker: only a stated window turns it on
        off = stated is not None and int(stated) == 0 if not rule.needs_window else not stated
        return 0 if off else rule.fixed
    window = int(stated) if stated is not None else rule.window
    return window if window > 0 else 0


def _sliding(meta: dict[str, Any], arch: str, layers: int, trunk: int) -> list[bool]:
    """``load_swa_pattern``: the GGUF's list, else its n, else the family's; NextN layers (past ``trunk``) never."""
    rule = SWA_FAMILIES[arch]
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and pattern:
        return [bool(pattern[i]) if i < len(pattern) and i < trunk else False for i in range(layers)]
    period = int(pattern) if isinstance(pattern, int | float) and not isinstance(pattern, bool) else rule.period
    if period is None:
        raise ValueError(f"{arch} needs attention.sliding_window_pattern as a list")
    if rule.dense_first:
        return [i < trunk and (period == 0 or i % period != 0) for i in range(layers)]
    return [i < trunk and (period == 0 or i % period < period - 1) for i in range(layers)]


def kv_layer_count(meta: dict[str, Any], arch: str, layers: int) -> int:
    """How many leading layers own a cache (``llama_hparams::has_kv``): gemma3n's 20, gemma4's all but the shared
    ones; else all."""
    if arch == "gemma3n":
        return min(layers, GEMMA3N_KV_LAYERS)
    if arch == "gemma4":
        return layers - int(meta.get(f"{arch}.attention.shared_kv_layers") or 0)
    return layers


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
    """``llama_hparams::n_embd_r() + n_embd_s()`` (src/llama-hparams.cpp), f32: RWKV's token shifts and wkv state,
    LFM2's short-convolution cache, else Mamba's (or Gated DeltaNet's) rolling convolution and SSM state."""

    def get(name: str) -> int:
        return int(meta.get(f"{arch}.{name}") or 0)

    embd = get("embedding_length")
    if get("wkv.head_size"):
        return (int(meta.get(f"{arch}.token_shift_count") or 2) * embd + embd * get("wkv.head_size")) * F32_BYTES
    if get("shortconv.l_cache"):
        return embd * (get("shortconv.l_cache") - 1) * F32_BYTES
    conv, inner = get("ssm.conv_kernel"), get("ssm.inner_size")
    state, groups = get("ssm.state_size"), get("ssm.group_count")
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
    # NextN/MTP layers (llama_hparams::n_layer() = n_layer_all - n_layer_nextn) are filtered out of the main
    # context's cache in llama_model::create_memory; granite-switch repurposes the count for a router layer it keeps.
    nextn = int(get("nextn_predict_layers") or 0) if arch != "granite-switch" else 0
    trunk = count - nextn
    with_kv = min(trunk, kv_layer_count(meta, arch, count))
    heads = _per_layer(get("attention.head_count"), count, [0] * count)
    kv_heads = _per_layer(get("attention.head_count_kv"), count, heads)
    first = heads[0] if heads and heads[0] else min((h for h in heads if h), default=1)
    head_dim = int(get("embedding_length")) // first
    key_dim, value_dim = dim("attention.key_length", head_dim), dim("attention.value_length", head_dim)
    key_swa, value_swa = dim("attention.key_length_swa", key_dim), dim("attention.value_length_swa", value_dim)
    mla = bool(get("attention.key_length_mla"))
    recurrent = _recurrent(meta, arch, kv_heads)
    if arch == "falcon-h1":  # create_memory: filter_attn and filter_recr both true, every layer has both
        recurrent = [True] * count
    else:
        kv_heads = [0 if recurrent[i] else n for i, n in enumerate(kv_heads)]
    kv_heads = [0 if i >= with_kv else n for i, n in enumerate(kv_heads)]
    recurrent = [r and i < trunk for i, r in enumerate(recurrent)]
    window = swa_window(meta, arch, trunk)
    if arch == "lfm2":  # lfm2.cpp: with a window, every attention layer slides (hybrid_iswa)
        sliding = [bool(window) and bool(n) for n in kv_heads]
    else:
        sliding = _sliding(meta, arch, count, trunk) if window else [False] * count
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
