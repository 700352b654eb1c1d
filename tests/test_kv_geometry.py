"""KV geometry per layer, worked examples per architecture family (inference/backends/kv_layers.py,
monitoring/decode.py). The metadata dicts carry the real models' GGUF figures; each expected figure is worked out
in its comment from the backends' rules (llama.cpp's cache as allocated; Ollama's GraphSize where it agrees).
Ollama's /api/show runs against the replay (tests/ollama_replay.py), which blanks long lists unless verbose."""

from __future__ import annotations

import asyncio

import pytest

from inference.backends.gguf import architecture_from_metadata, read_metadata
from inference.backends.ollama import OllamaBackend
from monitoring import decode
from tests.ollama_replay import ReplayModel, ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.tiny_gguf import write_gguf

F16 = 2


def _arch(arch: str, **keys: object):
    return architecture_from_metadata({"general.architecture": arch, **{f"{arch}.{k}": v for k, v in keys.items()}})


def test_plain_gqa_llama_is_every_layer_every_token():
    smollm2 = _arch("llama", block_count=30, **{"attention.head_count": 9, "attention.head_count_kv": 3},
                    embedding_length=576)  # fmt: skip
    assert decode.kv_bytes_per_token(smollm2) == 30 * 3 * (64 + 64) * F16 == 23_040
    assert decode.kv_bytes(smollm2, 4096, parallel=2) == 23_040 * 4096 * 2


def test_qwen3next_has_attention_every_fourth_layer_and_recurrent_state_elsewhere():
    arch = _arch(
        "qwen3next", block_count=48, embedding_length=2048, full_attention_interval=4,
        **{"attention.head_count": 16, "attention.head_count_kv": 2, "attention.key_length": 256,
           "attention.value_length": 256, "ssm.conv_kernel": 4, "ssm.inner_size": 4096, "ssm.state_size": 128,
           "ssm.group_count": 16},
    )  # fmt: skip
    per_token = 12 * 2 * (256 + 256) * F16  # 12 of 48 layers attend
    assert decode.kv_bytes_per_token(arch) == per_token == 24_576
    uniform = 48 * 2 * (256 + 256) * F16
    assert uniform / per_token == 4  # what every layer counted as attention overstated
    state = ((4 - 1) * (4096 + 2 * 16 * 128) + 128 * 4096) * 4  # f32, per recurrent layer and sequence
    assert decode.kv_bytes(arch, 1000) == per_token * 1000 + 36 * state


def test_per_layer_head_count_kv_list_with_recurrent_layers():
    # A hybrid (granitehybrid, jamba style): a per-layer list, 0 where the layer is Mamba.
    heads_kv = [0, 0, 0, 8, 0, 0, 0, 8, 0, 0]
    arch = _arch("granitehybrid", block_count=10, embedding_length=1536,
                 **{"attention.head_count": 12, "attention.head_count_kv": heads_kv})  # fmt: skip
    assert arch.head_count_kv == 8 and sum(1 for layer in arch.layers if layer.kv_heads) == 2
    assert decode.kv_bytes_per_token(arch) == 2 * 8 * (128 + 128) * F16


def test_recurrent_layers_as_llama_cpp_picks_them():
    ssm = {"ssm.conv_kernel": 4, "ssm.inner_size": 256, "ssm.state_size": 16, "ssm.group_count": 1}
    # nemotron-h: a block with neither KV heads nor a feed-forward is Mamba; one with a feed-forward only is an MLP.
    arch = _arch("nemotron_h", block_count=4, embedding_length=128,
                 **{"attention.head_count": 4, "attention.head_count_kv": [0, 2, 0, 0],
                    "feed_forward_length": [0, 0, 512, 0], **ssm})  # fmt: skip
    assert [(layer.kv_heads, bool(layer.state_bytes)) for layer in arch.layers] == [
        (0, True),
        (2, False),
        (0, False),
        (0, True),
    ]
    # qwen3.5 without full_attention_interval: llama.cpp's default of 4; attention.recurrent_layers overrides it.
    qwen = {"attention.head_count": 4, "attention.head_count_kv": 2, **ssm}
    assert [layer.kv_heads for layer in _arch("qwen35", block_count=4, embedding_length=128, **qwen).layers] == [
        0,
        0,
        0,
        2,
    ]
    listed = _arch("qwen35", block_count=4, embedding_length=128, **qwen,
                   **{"attention.recurrent_layers": [True, False, True, False]})  # fmt: skip
    assert [layer.kv_heads for layer in listed.layers] == [0, 2, 0, 2]


def test_gemma3_slides_five_layers_of_six():
    arch = _arch("gemma3", block_count=26, embedding_length=1152, context_length=32768,
                 **{"attention.head_count": 4, "attention.head_count_kv": 1, "attention.key_length": 256,
                    "attention.value_length": 256, "attention.sliding_window": 512})  # fmt: skip
    layer = 1 * (256 + 256) * F16  # bytes per token in one layer
    globals_ = [i for i, entry in enumerate(arch.layers) if not entry.window]
    assert globals_ == [5, 11, 17, 23]  # every sixth layer attends to everything (Ollama: (i+1) % 6 == 0)
    assert decode.kv_bytes_per_token(arch) == 4 * layer
    # 32k context: the 22 sliding layers hold the window plus one batch (Ollama: numParallel x window + batch).
    allocated = decode.kv_bytes(arch, 32768)
    assert allocated == 4 * layer * 32768 + 22 * layer * (512 + 512)
    assert 26 * layer * 32768 / allocated > 5  # counting every layer as global: over 5x too high


def test_gpt_oss_alternates_sliding_and_full_layers():
    arch = _arch("gpt-oss", block_count=24, embedding_length=2880,
                 **{"attention.head_count": 64, "attention.head_count_kv": 8, "attention.key_length": 64,
                    "attention.value_length": 64, "attention.sliding_window": 128})  # fmt: skip
    layer = 8 * (64 + 64) * F16
    assert [entry.window for entry in arch.layers[:4]] == [128, 0, 128, 0]
    assert decode.kv_bytes(arch, 8192, parallel=2) == 12 * layer * 8192 * 2 + 12 * layer * (128 * 2 + 512)


def test_deepseek2_mla_caches_one_compressed_head_k_only():
    # DeepSeek-V2-Lite as current conversions write it: one KV head of kv_lora_rank 512 + rope 64 (key_length), the
    # decompressed head sizes under *_mla. llama.cpp caches K only; V is a view of it.
    keys = {"attention.head_count": 16, "attention.head_count_kv": 1, "attention.key_length": 576,
            "attention.value_length": 512, "attention.key_length_mla": 192, "attention.value_length_mla": 128,
            "attention.kv_lora_rank": 512, "rope.dimension_count": 64}  # fmt: skip
    arch = _arch("deepseek2", block_count=27, embedding_length=2048, **keys)
    assert decode.kv_bytes_per_token(arch) == 27 * 1 * (512 + 64) * F16 == 31_104
    # An older conversion (no *_mla keys) states 16 heads of 192 + 128, and llama.cpp caches them as stated.
    old = {"attention.head_count": 16, "attention.head_count_kv": 16, "attention.key_length": 192,
           "attention.value_length": 128, "attention.kv_lora_rank": 512, "rope.dimension_count": 64}  # fmt: skip
    naive = decode.kv_bytes_per_token(_arch("deepseek2", block_count=27, embedding_length=2048, **old))
    assert naive == 27 * 16 * (192 + 128) * F16 and naive / decode.kv_bytes_per_token(arch) > 8


def test_allocation_is_padded_as_llama_cpp_pads_it():
    # gpt-oss-20b's geometry, num_ctx 8192 x 2 sequences (Ollama starts llama-server with -c 16384 -np 2).
    arch = _arch("gpt-oss", block_count=24, embedding_length=2880,
                 **{"attention.head_count": 64, "attention.head_count_kv": 8, "attention.key_length": 64,
                    "attention.value_length": 64, "attention.sliding_window": 128})  # fmt: skip
    layer = 8 * (64 + 64) * F16
    assert decode.kv_cells(8192, parallel=2, window=128) == 768  # 128 + 512, padded to 256
    assert decode.kv_allocated_bytes(arch, 8192, parallel=2) == 12 * layer * 8192 * 2 + 12 * layer * 768 * 2
    assert decode.kv_cells(1000, parallel=3) == 1024  # -c 3000 -np 3: 3072 / 3
    assert decode.kv_cells(100) == 256 and decode.kv_cells(100, window=128) == 256  # the batch is no larger than -c


def test_mamba_has_no_per_token_cache():
    arch = _arch("mamba", block_count=24, embedding_length=768,
                 **{"ssm.conv_kernel": 4, "ssm.inner_size": 1536, "ssm.state_size": 16})  # fmt: skip
    assert decode.kv_bytes_per_token(arch) == 0
    assert decode.kv_bytes(arch, 100_000) == decode.kv_bytes(arch, 10) == 24 * (3 * 1536 + 16 * 1536) * 4


def test_ollama_passes_its_kv_cache_type_to_llama_server():
    # v0.30+: OLLAMA_KV_CACHE_TYPE goes to llama-server as is; flash attention "auto" is turned on for a quantized V.
    assert decode.ollama_kv_cache_type("") == "f16"
    assert decode.ollama_kv_cache_type("Q8_0") == "q8_0"
    assert decode.ollama_kv_cache_type("q5_1", flash_attention=True) == "q5_1"
    assert decode.ollama_kv_cache_type("f16", flash_attention=False) == "f16"
    with pytest.raises(ValueError, match="needs flash attention"):
        decode.ollama_kv_cache_type("q8_0", flash_attention=False)
    with pytest.raises(ValueError, match="unknown KV cache type"):
        decode.ollama_kv_cache_type("q3_k")


def test_ollama_show_is_asked_again_verbose_when_lists_are_blanked(ollama):
    info = {
        "general.architecture": "granitehybrid", "granitehybrid.block_count": 10,
        "granitehybrid.embedding_length": 1536, "granitehybrid.attention.head_count": 12,
        "granitehybrid.attention.head_count_kv": [0, 0, 0, 8, 0, 0, 0, 8, 0, 0],
    }  # fmt: skip
    ollama.models["granite4:tiny-h"] = ReplayModel(name="granite4:tiny-h", model_info=info)
    arch = asyncio.run(OllamaBackend(ollama.url).model_architecture("granite4:tiny-h"))
    assert [layer.kv_heads for layer in arch.layers] == info["granitehybrid.attention.head_count_kv"]
    shows = [body for method, path, body in ollama.requests if path == "/api/show"]
    assert [bool(body.get("verbose")) for body in shows] == [False, True]


def test_gguf_per_layer_arrays_are_read(tmp_path):
    path = tmp_path / "hybrid.gguf"
    write_gguf(path, {"general.architecture": "jamba", "jamba.block_count": 4, "jamba.embedding_length": 256,
                 "jamba.attention.head_count": 4, "jamba.attention.head_count_kv": [0, 2, 0, 0],
                 "tokenizer.ggml.token_type": [1, 1, 1]})  # fmt: skip
    meta = read_metadata(path)
    assert meta["jamba.attention.head_count_kv"] == [0, 2, 0, 0] and "tokenizer.ggml.token_type" not in meta
    assert decode.kv_bytes_per_token(architecture_from_metadata(meta)) == 2 * (64 + 64) * F16


def test_blanked_list_without_verbose_is_a_clear_error():
    with pytest.raises(ValueError, match="verbose"):
        _arch("qwen3next", block_count=2, embedding_length=64, **{"attention.head_count": 2,
                                                                  "attention.head_count_kv": []})  # fmt: skip
