"""Tiny GGUF model files that llama.cpp loads, for checking RigDash's KV figures against the real llama-server.

Written here with ``struct`` (GGUF v3: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) rather than with
the ``gguf`` package, which needs numpy. Every weight is zero (f32) and each file is well under 1 MiB: embedding
64, a few layers, a 259-token SentencePiece-style vocabulary (three specials and the 256 byte tokens llama.cpp's
SPM tokenizer needs for its newline). The output is nonsense; the KV cache is allocated as for a real model.

Tensor names and shapes follow each architecture's ``load_arch_tensors`` in llama.cpp's ``src/models/<arch>.cpp``
(ne0 first, as GGUF stores them); the metadata keys its ``load_arch_hparams`` requires.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

EMBD, FF, VOCAB = 64, 128, 259
ALIGN = 32
F32 = 0

_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<Q", len(data)) + data


def _scalar(value: Any) -> tuple[int, bytes]:
    if isinstance(value, bool):
        return _BOOL, struct.pack("<?", value)
    if isinstance(value, int):
        return (_U32, struct.pack("<I", value)) if value >= 0 else (_I32, struct.pack("<i", value))
    if isinstance(value, float):
        return _F32, struct.pack("<f", value)
    if isinstance(value, str):
        return _STR, _string(value)
    raise TypeError(f"no GGUF type for {value!r}")


def _value(value: Any) -> tuple[int, bytes]:
    if not isinstance(value, list):
        return _scalar(value)
    first = value[0]
    kind = _BOOL if isinstance(first, bool) else _I32 if isinstance(first, int) else _scalar(first)[0]
    items = b"".join(struct.pack("<i", v) if kind == _I32 else _scalar(v)[1] for v in value)
    return _ARR, struct.pack("<IQ", kind, len(value)) + items


def write_gguf(
    path: Path,
    meta: dict[str, Any],
    tensors: dict[str, tuple[int, ...]] | None = None,
    values: dict[str, list[float]] | None = None,
) -> Path:
    """A GGUF file with ``meta`` and f32 ``tensors`` (name: shape, ne0 first), zero-filled but for those ``values``
    gives (every element, in order). Ints are u32 (i32 when negative) and int lists i32, as llama.cpp's converter
    writes them."""
    tensors, values = tensors or {}, values or {}
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
    for key, value in meta.items():
        kind, data = _value(value)
        out += _string(key) + struct.pack("<I", kind) + data
    offset, sizes = 0, []
    for name, shape in tensors.items():
        out += _string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", n) for n in shape)
        out += struct.pack("<IQ", F32, offset)
        size = 4
        for n in shape:
            size *= n
        sizes.append(size)
        offset += -(-size // ALIGN) * ALIGN
    out += bytes(-len(out) % ALIGN)
    for name, size in zip(tensors, sizes, strict=True):
        data = struct.pack(f"<{size // 4}f", *values[name]) if name in values else bytes(size)
        out += data + bytes(-(-size // ALIGN) * ALIGN - size)
    path.write_bytes(bytes(out))
    return path


def _vocab() -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * len(tokens),
        "tokenizer.ggml.token_type": [2, 3, 3, *([6] * 256)],  # unknown, control x2, byte
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }


def _base(arch: str, layers: int, **keys: Any) -> dict[str, Any]:
    return {
        "general.architecture": arch,
        "general.name": f"tiny-{arch}",
        f"{arch}.context_length": 8192,
        f"{arch}.embedding_length": EMBD,
        f"{arch}.block_count": layers,
        f"{arch}.feed_forward_length": FF,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        **{f"{arch}.{k}": v for k, v in keys.items()},
        **_vocab(),
    }


def _ffn(i: int) -> dict[str, tuple[int, ...]]:
    return {
        f"blk.{i}.ffn_norm.weight": (EMBD,),
        f"blk.{i}.ffn_gate.weight": (EMBD, FF),
        f"blk.{i}.ffn_up.weight": (EMBD, FF),
        f"blk.{i}.ffn_down.weight": (FF, EMBD),
    }


def _attention(i: int, heads: int, kv_heads: int, key: int, value: int) -> dict[str, tuple[int, ...]]:
    return {
        f"blk.{i}.attn_norm.weight": (EMBD,),
        f"blk.{i}.attn_q.weight": (EMBD, heads * key),
        f"blk.{i}.attn_k.weight": (EMBD, kv_heads * key),
        f"blk.{i}.attn_v.weight": (EMBD, kv_heads * value),
        f"blk.{i}.attn_output.weight": (heads * value, EMBD),
    }


def _top() -> dict[str, tuple[int, ...]]:
    return {"token_embd.weight": (EMBD, VOCAB), "output_norm.weight": (EMBD,)}


def llama_gqa(layers: int = 4, heads: int = 4, kv_heads: int = 1) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """src/models/llama.cpp: grouped-query attention, head size embedding / heads."""
    meta = _base("llama", layers, **{"attention.head_count": heads, "attention.head_count_kv": kv_heads})
    head = EMBD // heads
    tensors = _top()
    for i in range(layers):
        tensors |= _attention(i, heads, kv_heads, head, head) | _ffn(i)
    return meta, tensors


def reranker(layers: int = 2) -> tuple[dict[str, Any], dict[str, tuple[int, ...]], dict[str, list[float]]]:
    """A llama model (``llama_gqa``) whose token embeddings and output norm are not zero, so that llama-server's
    rank pooling (``--reranking``: the last token's hidden state, its first element as the score) gives each text
    a score of its own: its last byte's embedding, through layers that add nothing."""
    meta, tensors = llama_gqa(layers=layers)
    embedding = [((token * 37 + dim * 11) % 23 - 11) / 7 for token in range(VOCAB) for dim in range(EMBD)]
    return meta, tensors, {"token_embd.weight": embedding, "output_norm.weight": [1.0] * EMBD}


def qwen3(layers: int = 3, heads: int = 4, kv_heads: int = 2, head: int = 48) -> tuple[dict, dict]:
    """src/models/qwen3.cpp: a stated head size (``key_length``) unlike embedding / heads, and Q/K norms."""
    meta = _base("qwen3", layers, **{"attention.head_count": heads, "attention.head_count_kv": kv_heads,
                                     "attention.key_length": head, "attention.value_length": head})  # fmt: skip
    tensors = _top()
    for i in range(layers):
        tensors |= _attention(i, heads, kv_heads, head, head) | _ffn(i)
        tensors |= {f"blk.{i}.attn_q_norm.weight": (head,), f"blk.{i}.attn_k_norm.weight": (head,)}
    return meta, tensors


def gemma3(layers: int = 7, heads: int = 4, kv_heads: int = 2, head: int = 32, window: int = 128) -> tuple[dict, dict]:
    """src/models/gemma3.cpp: sliding-window layers (five of six by default) and post-norms."""
    meta = _base("gemma3", layers, **{"attention.head_count": heads, "attention.head_count_kv": kv_heads,
                                      "attention.key_length": head, "attention.value_length": head,
                                      "attention.sliding_window": window})  # fmt: skip
    tensors = _top()
    for i in range(layers):
        tensors |= _attention(i, heads, kv_heads, head, head) | _ffn(i)
        tensors |= {
            f"blk.{i}.attn_q_norm.weight": (head,), f"blk.{i}.attn_k_norm.weight": (head,),
            f"blk.{i}.post_attention_norm.weight": (EMBD,), f"blk.{i}.post_ffw_norm.weight": (EMBD,),
        }  # fmt: skip
    return meta, tensors


def deepseek2(layers: int = 3, heads: int = 4, *, mla: bool = True) -> tuple[dict, dict]:
    """src/models/deepseek2.cpp, every layer dense (``leading_dense_block_count``). With ``mla``, as current
    conversions write it: one KV head of kv_lora_rank + rope, value kv_lora_rank, the per-head sizes under
    ``key_length_mla`` / ``value_length_mla``, and split K/V up-projections. Without: an older conversion, heads
    stated at their decompressed sizes and one ``attn_kv_b``."""
    q_rank, kv_rank, rope, nope, value = 32, 64, 16, 32, 32
    keys: dict[str, Any] = {
        "attention.head_count": heads, "leading_dense_block_count": layers, "attention.q_lora_rank": q_rank,
        "attention.kv_lora_rank": kv_rank, "rope.dimension_count": rope, "expert_feed_forward_length": FF,
        "expert_shared_count": 0,
    }  # fmt: skip
    if mla:
        keys |= {"attention.head_count_kv": 1, "attention.key_length": kv_rank + rope,
                 "attention.value_length": kv_rank, "attention.key_length_mla": nope + rope,
                 "attention.value_length_mla": value}  # fmt: skip
    else:
        keys |= {"attention.head_count_kv": heads, "attention.key_length": nope + rope, "attention.value_length": value}
    meta = _base("deepseek2", layers, **keys)
    tensors = _top()
    for i in range(layers):
        tensors |= {
            f"blk.{i}.attn_norm.weight": (EMBD,),
            f"blk.{i}.attn_q_a_norm.weight": (q_rank,),
            f"blk.{i}.attn_kv_a_norm.weight": (kv_rank,),
            f"blk.{i}.attn_q_a.weight": (EMBD, q_rank),
            f"blk.{i}.attn_q_b.weight": (q_rank, heads * (nope + rope)),
            f"blk.{i}.attn_kv_a_mqa.weight": (EMBD, kv_rank + rope),
            f"blk.{i}.attn_output.weight": (heads * value, EMBD),
        }
        if mla:
            tensors[f"blk.{i}.attn_k_b.weight"] = (nope, kv_rank, heads)
            tensors[f"blk.{i}.attn_v_b.weight"] = (kv_rank, value, heads)
        else:
            tensors[f"blk.{i}.attn_kv_b.weight"] = (kv_rank, heads * (nope + value))
        tensors |= _ffn(i)
    return meta, tensors


def granitehybrid(kv_heads: list[int] | None = None, heads: int = 4) -> tuple[dict, dict]:
    """src/models/granite-hybrid.cpp: Mamba-2 layers where the per-layer ``head_count_kv`` is 0, attention
    elsewhere. Mamba-2 needs inner = 2 x embedding."""
    kv_heads = kv_heads or [0, 2, 0, 0, 2]
    inner, state, groups, ssm_heads, conv = 2 * EMBD, 128, 1, 4, 4
    meta = _base("granitehybrid", len(kv_heads), **{
        "attention.head_count": heads, "attention.head_count_kv": kv_heads, "ssm.conv_kernel": conv,
        "ssm.inner_size": inner, "ssm.state_size": state, "ssm.time_step_rank": ssm_heads, "ssm.group_count": groups,
    })  # fmt: skip
    head = EMBD // heads
    tensors = _top()
    for i, n in enumerate(kv_heads):
        if n:
            tensors |= _attention(i, heads, n, head, head)
        else:
            tensors |= {
                f"blk.{i}.attn_norm.weight": (EMBD,),
                f"blk.{i}.ssm_in.weight": (EMBD, 2 * inner + 2 * groups * state + ssm_heads),
                f"blk.{i}.ssm_conv1d.weight": (conv, inner + 2 * groups * state),
                f"blk.{i}.ssm_conv1d.bias": (inner + 2 * groups * state,),  # optional to load, added by the graph
                f"blk.{i}.ssm_dt.bias": (ssm_heads,),
                f"blk.{i}.ssm_a": (1, ssm_heads),
                f"blk.{i}.ssm_d": (1, ssm_heads),
                f"blk.{i}.ssm_norm.weight": (inner // groups, groups),
                f"blk.{i}.ssm_out.weight": (inner, EMBD),
            }
        tensors |= _ffn(i)
    return meta, tensors


def qwen35(layers: int = 8, heads: int = 4, kv_heads: int = 2, head: int = 32) -> tuple[dict, dict]:
    """src/models/qwen35.cpp: Gated DeltaNet (recurrent) layers and, every fourth (llama.cpp's default when the GGUF
    states no ``full_attention_interval``, as here), gated attention; dense feed-forward, post-attention norms."""
    state, groups, v_heads, conv = 32, 2, 4, 4
    key_dim, value_dim = state * groups, state * v_heads
    meta = _base("qwen35", layers, **{
        "attention.head_count": heads, "attention.head_count_kv": kv_heads, "attention.key_length": head,
        "attention.value_length": head, "rope.dimension_count": 16, "rope.dimension_sections": [3, 3, 2, 0],
        "ssm.conv_kernel": conv, "ssm.inner_size": value_dim, "ssm.state_size": state,
        "ssm.time_step_rank": v_heads, "ssm.group_count": groups,
    })  # fmt: skip
    tensors = _top()
    for i in range(layers):
        tensors |= {f"blk.{i}.attn_norm.weight": (EMBD,), f"blk.{i}.post_attention_norm.weight": (EMBD,)}
        if (i + 1) % 4 == 0:
            tensors |= {
                f"blk.{i}.attn_q.weight": (EMBD, heads * head * 2),  # the query and its gate
                f"blk.{i}.attn_k.weight": (EMBD, kv_heads * head),
                f"blk.{i}.attn_v.weight": (EMBD, kv_heads * head),
                f"blk.{i}.attn_output.weight": (heads * head, EMBD),
                f"blk.{i}.attn_q_norm.weight": (head,),
                f"blk.{i}.attn_k_norm.weight": (head,),
            }
        else:
            tensors |= {
                f"blk.{i}.attn_qkv.weight": (EMBD, key_dim * 2 + value_dim),
                f"blk.{i}.attn_gate.weight": (EMBD, value_dim),
                f"blk.{i}.ssm_conv1d.weight": (conv, key_dim * 2 + value_dim),
                f"blk.{i}.ssm_dt.bias": (v_heads,),
                f"blk.{i}.ssm_a": (v_heads,),
                f"blk.{i}.ssm_beta.weight": (EMBD, v_heads),
                f"blk.{i}.ssm_alpha.weight": (EMBD, v_heads),
                f"blk.{i}.ssm_norm.weight": (state,),
                f"blk.{i}.ssm_out.weight": (value_dim, EMBD),
            }
        tensors |= {name: shape for name, shape in _ffn(i).items() if "ffn_norm" not in name}
    return meta, tensors


def gpt_oss(layers: int = 4, heads: int = 4, kv_heads: int = 2, head: int = 32, window: int = 128) -> tuple[dict, dict]:
    """src/models/openai-moe.cpp (``gpt-oss``): every other layer slides, attention sinks, a mixture of experts (two
    here, one used) with biases, and an output matrix of its own."""
    experts = 2
    meta = _base("gpt-oss", layers, **{
        "attention.head_count": heads, "attention.head_count_kv": kv_heads, "attention.key_length": head,
        "attention.value_length": head, "rope.dimension_count": head, "attention.sliding_window": window,
        "expert_count": experts, "expert_used_count": 1, "expert_feed_forward_length": FF,
    })  # fmt: skip
    tensors = _top() | {"output.weight": (EMBD, VOCAB)}
    for i in range(layers):
        tensors |= _attention(i, heads, kv_heads, head, head) | {
            f"blk.{i}.post_attention_norm.weight": (EMBD,),
            f"blk.{i}.attn_output.bias": (EMBD,),
            f"blk.{i}.attn_sinks.weight": (heads,),
            f"blk.{i}.ffn_gate_inp.weight": (EMBD, experts),
            f"blk.{i}.ffn_gate_inp.bias": (experts,),
            f"blk.{i}.ffn_gate_exps.weight": (EMBD, FF, experts),
            f"blk.{i}.ffn_gate_exps.bias": (FF, experts),
            f"blk.{i}.ffn_down_exps.weight": (FF, EMBD, experts),
            f"blk.{i}.ffn_down_exps.bias": (EMBD, experts),
            f"blk.{i}.ffn_up_exps.weight": (EMBD, FF, experts),
            f"blk.{i}.ffn_up_exps.bias": (FF, experts),
        }
    return meta, tensors


def llama4(layers: int = 5, heads: int = 4, kv_heads: int = 2, **keys: Any) -> tuple[dict, dict]:
    """src/models/llama4.cpp, dense (``interleave_moe_layer_step`` 0, though it must state experts): chunked
    attention, three layers of four, in chunks of 8192 whatever the GGUF says (its ``sliding_window`` 0: none)."""
    meta = _base("llama4", layers, **{
        "attention.head_count": heads, "attention.head_count_kv": kv_heads, "expert_count": 2,
        "expert_used_count": 1, "expert_feed_forward_length": FF, "interleave_moe_layer_step": 0, **keys,
    })  # fmt: skip
    head = EMBD // heads
    tensors = _top()
    for i in range(layers):
        tensors |= _attention(i, heads, kv_heads, head, head) | _ffn(i)
    return meta, tensors


def glm4moe(layers: int = 4, nextn: int = 1, heads: int = 4, kv_heads: int = 2) -> tuple[dict, dict]:
    """src/models/glm4-moe.cpp, every layer dense (``leading_dense_block_count``): ``block_count`` includes the
    ``nextn_predict_layers`` NextN/MTP layers at its end, whose tensors a trunk-only conversion leaves out (the
    loader then marks them not required). ``post_attention_norm`` is the pre-FFN norm; no ``ffn_norm``."""
    meta = _base("glm4moe", layers + nextn, **{
        "attention.head_count": heads, "attention.head_count_kv": kv_heads, "expert_count": 2,
        "expert_used_count": 1, "expert_feed_forward_length": FF, "expert_shared_count": 0,
        "leading_dense_block_count": layers + nextn, "nextn_predict_layers": nextn,
    })  # fmt: skip
    head = EMBD // heads
    tensors = _top()
    for i in range(layers):
        tensors |= _attention(i, heads, kv_heads, head, head) | {f"blk.{i}.post_attention_norm.weight": (EMBD,)}
        tensors |= {name: shape for name, shape in _ffn(i).items() if "ffn_norm" not in name}
    return meta, tensors


def _post_norm_block(i: int, heads: int, kv_heads: int, head: int) -> dict[str, tuple[int, ...]]:
    """exaone4's block: no pre-norms, post-norms after attention and feed-forward, Q/K norms."""
    block = {k: v for k, v in _attention(i, heads, kv_heads, head, head).items() if "attn_norm" not in k}
    block |= {k: v for k, v in _ffn(i).items() if "ffn_norm" not in k}
    return block | {
        f"blk.{i}.post_attention_norm.weight": (EMBD,), f"blk.{i}.post_ffw_norm.weight": (EMBD,),
        f"blk.{i}.attn_q_norm.weight": (head,), f"blk.{i}.attn_k_norm.weight": (head,),
    }  # fmt: skip


def exaone4(layers: int = 64, heads: int = 4, kv_heads: int = 1, **keys: Any) -> tuple[dict, dict]:
    """src/models/exaone4.cpp: with 64 layers (the 32B) three of four slide over 4096 tokens unless the GGUF states
    another window; with any other count none slide."""
    meta = _base("exaone4", layers, **{"attention.head_count": heads, "attention.head_count_kv": kv_heads, **keys})
    head = EMBD // heads
    tensors = _top()
    for i in range(layers):
        tensors |= _post_norm_block(i, heads, kv_heads, head)
    return meta, tensors


def cohere2(layers: int = 5, heads: int = 4, kv_heads: int = 2, window: int = 128) -> tuple[dict, dict]:
    """src/models/cohere2.cpp: three of four layers slide (``sliding_window`` required); one norm per block, the
    output tied to the embeddings."""
    meta = _base("cohere2", layers, **{"attention.head_count": heads, "attention.head_count_kv": kv_heads,
                                       "attention.sliding_window": window, "attention.layer_norm_epsilon": 1e-5,
                                       "logit_scale": 1.0})  # fmt: skip
    head = EMBD // heads
    tensors = _top()
    for i in range(layers):
        tensors |= _attention(i, heads, kv_heads, head, head)
        tensors |= {k: v for k, v in _ffn(i).items() if "ffn_norm" not in k}
    return meta, tensors


def lfm2(kv_heads: list[int] | None = None, heads: int = 4, l_cache: int = 3, **keys: Any) -> tuple[dict, dict]:
    """src/models/lfm2.cpp: short-convolution layers where the per-layer ``head_count_kv`` is 0, attention (with
    Q/K norms) elsewhere, all dense; the output norm is named ``token_embd_norm``. With a ``sliding_window`` every
    attention layer slides."""
    kv_heads = kv_heads or [0, 2, 0, 2, 0]
    meta = _base("lfm2", len(kv_heads), **{"attention.head_count": heads, "attention.head_count_kv": kv_heads,
                                           "shortconv.l_cache": l_cache, **keys})  # fmt: skip
    head = EMBD // heads
    tensors: dict[str, tuple[int, ...]] = {"token_embd.weight": (EMBD, VOCAB), "token_embd_norm.weight": (EMBD,)}
    for i, n in enumerate(kv_heads):
        tensors |= _ffn(i)
        if n:
            tensors |= _attention(i, heads, n, head, head)
            tensors |= {f"blk.{i}.attn_q_norm.weight": (head,), f"blk.{i}.attn_k_norm.weight": (head,)}
        else:
            tensors |= {
                f"blk.{i}.attn_norm.weight": (EMBD,),
                f"blk.{i}.shortconv.conv.weight": (l_cache, EMBD),
                f"blk.{i}.shortconv.in_proj.weight": (EMBD, 3 * EMBD),
                f"blk.{i}.shortconv.out_proj.weight": (EMBD, EMBD),
            }
    return meta, tensors
