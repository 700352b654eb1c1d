"""KV rules of the families llama-server cannot load as a tiny generated GGUF here (their tensor sets are too
involved: gemma3n's AltUp and per-layer embeddings, gemma4's, smallthinker's and cohere2moe's experts), checked
against the numbers llama.cpp b11434's source implies. The families it loads are in tests/test_kv_llama_server.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from inference.backends.kv_layers import layers_from_metadata
from monitoring import decode


def _meta(arch: str, layers: int, **keys: Any) -> dict[str, Any]:
    return {
        "general.architecture": arch,
        f"{arch}.block_count": layers,
        f"{arch}.embedding_length": 64,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        **{f"{arch}.{k}": v for k, v in keys.items()},
    }


def test_gemma3n_only_the_first_20_layers_own_a_cache():
    """src/models/gemma3n.cpp: ``n_layer_kv_from_start = 20``; llama_hparams::has_kv is false past it, and
    create_memory's ``reuse`` points those layers at layer 18 (sliding) or 19 (full). Pattern: four of five slide."""
    layers = layers_from_metadata(_meta("gemma3n", 30, **{"attention.sliding_window": 512}))
    assert [bool(layer.kv_heads) for layer in layers] == [True] * 20 + [False] * 10
    assert [bool(layer.window) for layer in layers[:10]] == [True] * 4 + [False] + [True] * 4 + [False]


def test_gemma4_shared_kv_layers_allocate_none():
    """src/models/gemma4.cpp: ``n_layer_kv_from_start = n_layer_all - attention.shared_kv_layers``; the sliding
    pattern only from the GGUF's list, with its own head sizes (``key_length_swa``)."""
    pattern = [True, True, True, True, False] * 7
    meta = _meta("gemma4", 35, **{
        "attention.sliding_window": 512, "attention.sliding_window_pattern": pattern, "attention.shared_kv_layers": 15,
        "attention.key_length": 512, "attention.value_length": 512, "attention.key_length_swa": 256,
        "attention.value_length_swa": 256,
    })  # fmt: skip
    layers = layers_from_metadata(meta)
    assert sum(1 for layer in layers if layer.kv_heads) == 20
    assert [layer.key_dim for layer in layers[:5]] == [256] * 4 + [512]
    with pytest.raises(ValueError, match="pattern"):
        layers_from_metadata(_meta("gemma4", 5, **{"attention.sliding_window": 512}))


def test_smallthinker_window_is_4096_dense_first_and_only_when_stated():
    """src/models/smallthinker.cpp: a stated window above 0 turns on SWA at 4096 (the stated value is overwritten),
    ``load_swa_pattern(ml, 4, true)``: layer 0 of each four is full."""
    layers = layers_from_metadata(_meta("smallthinker", 8, **{"attention.sliding_window": 100}))
    assert [layer.window for layer in layers] == [0, 4096, 4096, 4096] * 2
    assert not any(layer.window for layer in layers_from_metadata(_meta("smallthinker", 8)))


def test_cohere2moe_and_laguna_are_dense_first():
    for arch in ("cohere2moe", "laguna"):
        layers = layers_from_metadata(_meta(arch, 5, **{"attention.sliding_window": 128}))
        assert [layer.window for layer in layers] == [0, 128, 128, 128, 0], arch


def test_gemma2_default_window_and_families_without_swa():
    """gemma2.cpp: 4096 when the GGUF states none. phi3.cpp turns a stated window off; a family with no SWA rule
    (qwen2, llama) ignores the key; a pattern of 0 makes every layer slide (set_swa_pattern)."""
    assert [layer.window for layer in layers_from_metadata(_meta("gemma2", 4))] == [4096, 0, 4096, 0]
    for arch in ("phi3", "qwen2", "llama"):
        layers = layers_from_metadata(_meta(arch, 4, **{"attention.sliding_window": 128}))
        assert not any(layer.window for layer in layers), arch
    every = _meta("cohere2", 4, **{"attention.sliding_window": 128, "attention.sliding_window_pattern": 0})
    assert all(layer.window for layer in layers_from_metadata(every))


def test_hybrid_nextn_layer_has_neither_cache_nor_state():
    """qwen3next with an MTP layer: create_memory's filter_attn and filter_recr both require ``il < n_layer()``."""
    meta = _meta("qwen3next", 9, **{
        "nextn_predict_layers": 1, "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 32,
        "ssm.group_count": 2,
    })  # fmt: skip
    layers = layers_from_metadata(meta)
    assert [bool(layer.kv_heads) for layer in layers] == [False, False, False, True] * 2 + [False]
    assert [bool(layer.state_bytes) for layer in layers] == [True, True, True, False] * 2 + [False]


def test_gemma3_27b_at_8k_sliding_layers_hold_1536_cells():
    """gemma3 27B's geometry (62 layers, 16 KV heads of 128, window 1024) at 8,192 tokens, one slot: the 52 sliding
    layers hold 1024 + 512 = 1536 cells, the 10 full ones 8192 (llama_kv_cache_iswa)."""
    meta = _meta("gemma3", 62, **{
        "embedding_length": 5376, "attention.head_count": 32, "attention.head_count_kv": 16,
        "attention.key_length": 128, "attention.value_length": 128, "attention.sliding_window": 1024,
    })  # fmt: skip
    from inference.backends.base import ModelArchitecture

    arch = ModelArchitecture("gemma3", 62, 32, 16, 5376, 131072, 128, 128, layers=layers_from_metadata(meta))
    per_cell = 16 * 256 * 2
    assert decode.kv_allocated_bytes(arch, 8192) == (10 * 8192 + 52 * 1536) * per_cell


def test_falcon_h1_every_layer_has_attention_and_a_state():
    """create_memory: falcon-h1's filter_attn and filter_recr are both true for every layer."""
    meta = _meta("falcon-h1", 3, **{"ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
                                    "ssm.group_count": 1})  # fmt: skip
    layers = layers_from_metadata(meta)
    assert all(layer.kv_heads == 2 for layer in layers)
    assert {layer.state_bytes for layer in layers} == {(3 * (128 + 2 * 16) + 16 * 128) * 4}


def test_rwkv_state_and_lfm2moe_without_sliding():
    """llama_hparams::n_embd_r/n_embd_s for RWKV: token_shift_count (2) x embedding + embedding x wkv.head_size,
    f32. lfm2moe.cpp sets no swa_type (unlike lfm2.cpp)."""
    rwkv = layers_from_metadata(_meta("rwkv6", 2, **{"wkv.head_size": 16}))
    assert [layer.state_bytes for layer in rwkv] == [(2 * 64 + 64 * 16) * 4] * 2
    assert not any(layer.kv_heads for layer in rwkv)
    moe = _meta("lfm2moe", 3, **{"attention.head_count_kv": [0, 2, 0], "attention.sliding_window": 128,
                                 "shortconv.l_cache": 3})  # fmt: skip
    assert [(layer.kv_heads, layer.window) for layer in layers_from_metadata(moe)] == [(0, 0), (2, 0), (0, 0)]
