"""RigDash's KV figures against the real llama-server, per architecture family (inference/backends/kv_layers.py,
monitoring/decode.py ``kv_allocated_bytes``).

Each case writes a tiny GGUF (tests/tiny_gguf.py), starts the llama-server RigDash runs (``llama_server_command``)
on it with a context and a slot count, and reads the cache llama.cpp logs as it allocates it, one line per cache:

    llama_kv_cache: size =    2.25 MiB (  1024 cells,   4 layers,  3/3 seqs), K (f16):    1.12 MiB, V (f16): ...
    llama_memory_recurrent: size =    0.14 MiB (     2 cells,   3 layers,  2 seqs  0 rs_seq), R (f32): ...

RigDash's figure comes from the GGUF's metadata as RigDash reads it. Cells per sequence, layers and sequences must
match exactly; bytes within 0.005 MiB per line, because llama.cpp prints MiB with two decimals (the byte count
itself is not logged). Each case is sized so that a wrong rule (a cell padding, a layer counted or not, a V cache
that is not there) moves a line by far more than that.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.backends.base import ModelArchitecture
from inference.backends.gguf import architecture_from_metadata, read_metadata
from monitoring import decode
from rigdash.launcher import Stack, free_port, llama_server_command, wait_http
from tests import tiny_gguf

MIB = 1024 * 1024
PRINTED = 0.005 * MIB + 1  # half the last printed digit of "%7.2f MiB" (and a byte: a tie prints either way)

KV_LINE = re.compile(
    r"llama_kv_cache: size = +(?P<mib>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers, +"
    r"(?P<seqs>\d+)/(?P<streams>\d+) seqs\), K \((?P<k_type>\w+)\): +(?P<k>[\d.]+) MiB, V \((?P<v_type>\w+)\): +"
    r"(?P<v>[\d.]+) MiB"
)
RS_LINE = re.compile(
    r"llama_memory_recurrent: size = +(?P<mib>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers, +"
    r"(?P<seqs>\d+) seqs +(?P<rs_seq>\d+) rs_seq\)"
)


@pytest.fixture
def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Start llama-server on a GGUF with ``-c ctx -np slots`` (one thread: the cache does not depend on it), wait
    until it answers, and return its log."""
    stack = Stack()
    monkeypatch.setenv("LLAMA_THREADS", "1")
    monkeypatch.setenv("LLAMA_THREADS_BATCH", "1")

    def start(model: Path, *, ctx: int, slots: int, extra: tuple[str, ...] = ()) -> str:
        monkeypatch.setenv("LLAMA_MODEL_PATH", str(model))
        port, log = free_port(), tmp_path / f"{model.stem}-{ctx}-{slots}.log"
        # -lv 4: llama.cpp's own info lines, the cache's among them (Ollama starts it so too, for its accounting).
        command = llama_server_command(port=port, slots=slots, ctx=ctx, extra=("-lv", "4", *extra))
        proc = stack.start("llama-server", command, log_path=log)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60, proc=proc)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"llama-server did not load {model.name}: {exc}\n{log.read_text()[-3000:]}") from exc
        finally:
            stack.stop()
        return log.read_text()

    yield start
    stack.stop()


def _model(tmp_path: Path, name: str, built: tuple[dict[str, Any], dict[str, tuple[int, ...]]]) -> Path:
    return tiny_gguf.write_gguf(tmp_path / f"{name}.gguf", *built)


def _logged(log: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    kv = [m.groupdict() for m in KV_LINE.finditer(log)]
    rs = [m.groupdict() for m in RS_LINE.finditer(log)]
    assert kv or rs, f"no cache size line in the log:\n{log[-3000:]}"
    return kv, rs


def _expected_lines(
    arch: ModelArchitecture, tokens: int, parallel: int, cache_type: str = "f16", *, swa_full: bool = False
) -> list[tuple[int, int, float]]:
    """(cells per sequence, layers, bytes) for each KV cache llama.cpp makes: the full-attention one, then the
    sliding-window one (llama_kv_cache_iswa), for the layers that have attention."""
    lines = []
    iswa = any(layer.kv_heads and layer.window for layer in arch.layers)
    for sliding in (False, True):
        layers = [layer for layer in arch.layers if layer.kv_heads and bool(layer.window) == sliding]
        if not layers and not (iswa and not sliding):  # llama_kv_cache_iswa logs its full cache even when empty
            continue
        window = layers[0].window if layers else 0
        cells = decode.kv_cells(tokens, parallel=parallel, window=window, swa_full=swa_full)
        element = decode.KV_CACHE_TYPE_BYTES[cache_type]
        per_cell = sum(layer.kv_heads * (layer.key_dim + layer.value_dim) * element for layer in layers)
        lines.append((cells, len(layers), float(cells * parallel * per_cell)))
    return lines


def _check(
    model: Path, log: str, *, tokens: int, parallel: int, cache_type: str = "f16", swa_full: bool = False
) -> ModelArchitecture:
    arch = architecture_from_metadata(read_metadata(model))
    kv, rs = _logged(log)
    expected = _expected_lines(arch, tokens, parallel, cache_type, swa_full=swa_full)
    assert [(int(line["cells"]), int(line["layers"])) for line in kv] == [(c, n) for c, n, _ in expected]
    for line, (_, _, size) in zip(kv, expected, strict=True):
        assert (line["seqs"], line["streams"]) == (str(parallel), str(parallel))  # one stream per slot
        assert abs(float(line["mib"]) * MIB - size) <= PRINTED, (line, size / MIB)
    logged = sum(float(line["mib"]) for line in kv + rs) * MIB
    assert {line["k_type"] for line in kv} <= {cache_type}
    allocated = decode.kv_allocated_bytes(arch, tokens, cache_type, parallel=parallel, swa_full=swa_full)
    assert abs(allocated - logged) <= PRINTED * len(kv + rs), (allocated / MIB, logged / MIB)
    return arch


def test_gqa_llama_pads_each_slot_to_256_cells(tmp_path, serve):
    model = _model(tmp_path, "llama", tiny_gguf.llama_gqa(layers=4, heads=4, kv_heads=1))
    # -c 3000 -np 3: llama.cpp pads the context to 3072 and each slot's 1024 stays; 1000 unpadded would be wrong.
    log = serve(model, ctx=3000, slots=3)
    arch = _check(model, log, tokens=1000, parallel=3)
    assert decode.kv_cells(1000, parallel=3) == 1024
    assert decode.kv_bytes_per_token(arch) == 4 * 1 * (16 + 16) * 2


def test_qwen3_stated_head_size(tmp_path, serve):
    model = _model(tmp_path, "qwen3", tiny_gguf.qwen3(layers=3, heads=4, kv_heads=2, head=48))
    log = serve(model, ctx=4096, slots=2)
    arch = _check(model, log, tokens=2048, parallel=2)
    assert decode.kv_bytes_per_token(arch) == 3 * 2 * (48 + 48) * 2  # key_length, not 64 / 4


def test_q8_0_cache_is_34_bytes_a_block_of_32(tmp_path, serve):
    model = _model(tmp_path, "qwen3-q8", tiny_gguf.qwen3(layers=3, heads=4, kv_heads=2, head=64))
    log = serve(model, ctx=8192, slots=1, extra=("-ctk", "q8_0", "-ctv", "q8_0"))
    arch = _check(model, log, tokens=8192, parallel=1, cache_type="q8_0")
    assert decode.kv_bytes_per_token(arch, "q8_0") == 3 * 2 * (64 + 64) * 34 / 32


def test_gemma3_sliding_layers_hold_window_plus_batch_padded(tmp_path, serve):
    model = _model(tmp_path, "gemma3", tiny_gguf.gemma3(layers=7, window=128))
    log = serve(model, ctx=8192, slots=2)
    arch = _check(model, log, tokens=4096, parallel=2)
    assert [layer.window for layer in arch.layers] == [128] * 5 + [0] + [128]  # layer 6 of each 6 is global
    # The sliding cache: 128 + 512 = 640 cells, padded to 768, per slot.
    assert decode.kv_cells(4096, parallel=2, window=128) == 768


def test_gpt_oss_slides_every_other_layer(tmp_path, serve):
    model = _model(tmp_path, "gpt-oss", tiny_gguf.gpt_oss(layers=4, window=128))
    log = serve(model, ctx=8192, slots=2)
    arch = _check(model, log, tokens=4096, parallel=2)
    assert [layer.window for layer in arch.layers] == [128, 0, 128, 0]


def test_deepseek2_mla_caches_k_only(tmp_path, serve):
    model = _model(tmp_path, "deepseek2-mla", tiny_gguf.deepseek2(layers=3, mla=True))
    log = serve(model, ctx=4096, slots=1)
    kv, _ = _logged(log)
    assert float(kv[0]["v"]) == 0  # V is a view of the compressed K
    arch = _check(model, log, tokens=4096, parallel=1)
    assert decode.kv_bytes_per_token(arch) == 3 * 1 * (64 + 16) * 2  # kv_lora_rank + rope, one head


def test_deepseek2_without_mla_keys_is_cached_as_multi_head(tmp_path, serve):
    model = _model(tmp_path, "deepseek2-mha", tiny_gguf.deepseek2(layers=3, mla=False))
    log = serve(model, ctx=4096, slots=1)
    arch = _check(model, log, tokens=4096, parallel=1)
    assert decode.kv_bytes_per_token(arch) == 3 * 4 * (48 + 32) * 2


def test_granite_hybrid_attention_layers_and_recurrent_state(tmp_path, serve):
    model = _model(tmp_path, "granitehybrid", tiny_gguf.granitehybrid(kv_heads=[0, 2, 0, 0, 2]))
    log = serve(model, ctx=4096, slots=2)
    arch = _check(model, log, tokens=2048, parallel=2)
    _, rs = _logged(log)
    assert [int(line["cells"]) for line in rs] == [2]  # one state per slot (its "layers" counts every layer)
    state = sum(layer.state_bytes for layer in arch.layers) * 2
    assert abs(float(rs[0]["mib"]) * MIB - state) <= PRINTED


def test_qwen35_attends_every_fourth_layer_by_default(tmp_path, serve):
    model = _model(tmp_path, "qwen35", tiny_gguf.qwen35(layers=8))  # no full_attention_interval in the GGUF
    log = serve(model, ctx=4096, slots=2)
    arch = _check(model, log, tokens=2048, parallel=2)
    assert [bool(layer.kv_heads) for layer in arch.layers] == [False, False, False, True] * 2
    _, rs = _logged(log)
    state = sum(layer.state_bytes for layer in arch.layers) * 2
    assert [int(line["cells"]) for line in rs] == [2] and abs(float(rs[0]["mib"]) * MIB - state) <= PRINTED


def test_gemma3_swa_full_gives_sliding_layers_the_whole_context(tmp_path, serve):
    """``--swa-full`` (llama_kv_cache_iswa: ``size_swa = size_base``): the sliding cache as large as the full one."""
    model = _model(tmp_path, "gemma3-full", tiny_gguf.gemma3(layers=7, window=128))
    log = serve(model, ctx=4096, slots=2, extra=("--swa-full",))
    _check(model, log, tokens=2048, parallel=2, swa_full=True)
    kv, _ = _logged(log)
    assert [int(line["cells"]) for line in kv] == [2048, 2048]


def test_llama4_chunked_layers_hold_one_chunk_of_8192_plus_batch(tmp_path, serve):
    """llama4 (src/models/llama4.cpp): chunked attention in three layers of four, chunks of 8192 whatever the GGUF's
    ``sliding_window`` says; cached as a window of 8192 (8192 + 512 = 8704 cells a slot, against 16384)."""
    model = _model(tmp_path, "llama4", tiny_gguf.llama4(layers=5, **{"attention.sliding_window": 64}))
    log = serve(model, ctx=32768, slots=2)
    arch = _check(model, log, tokens=16384, parallel=2)
    assert [layer.window for layer in arch.layers] == [8192, 8192, 8192, 0, 8192]
    assert decode.kv_cells(16384, parallel=2, window=8192) == 8704  # already a multiple of 256


def test_llama4_sliding_window_0_turns_chunking_off(tmp_path):
    """Source numbers only: llama-server aborts on such a model (llama-graph.cpp:194, ``f_attn_temp_scale`` is set
    only with chunking, and no GGUF key sets it), so the rule is src/models/llama4.cpp's: a stated 0 is no SWA."""
    model = _model(tmp_path, "llama4-dense", tiny_gguf.llama4(layers=4, **{"attention.sliding_window": 0}))
    arch = architecture_from_metadata(read_metadata(model))
    assert not any(layer.window for layer in arch.layers)
    assert decode.kv_allocated_bytes(arch, 4096) == 4 * 4096 * 2 * (16 + 16) * 2


def test_glm4moe_nextn_layer_has_no_cache(tmp_path, serve):
    """glm4moe with one NextN/MTP layer (``nextn_predict_layers`` 1 of ``block_count`` 5): llama_model::create_memory
    filters it out of the main context's cache (``il < n_layer()``): 4 layers logged."""
    model = _model(tmp_path, "glm4moe", tiny_gguf.glm4moe(layers=4, nextn=1))
    log = serve(model, ctx=4096, slots=2)
    arch = _check(model, log, tokens=2048, parallel=2)
    assert [bool(layer.kv_heads) for layer in arch.layers] == [True] * 4 + [False]
    kv, _ = _logged(log)
    assert [int(line["layers"]) for line in kv] == [4]


def test_exaone4_32b_slides_three_of_four_over_4096(tmp_path, serve):
    """exaone4 (src/models/exaone4.cpp): the 64-layer 32B slides three layers of four over 4096 tokens by default."""
    model = _model(tmp_path, "exaone4", tiny_gguf.exaone4(layers=64))
    log = serve(model, ctx=8192, slots=1)
    arch = _check(model, log, tokens=8192, parallel=1)
    assert sum(1 for layer in arch.layers if layer.window == 4096) == 48
    kv, _ = _logged(log)
    assert [(int(line["cells"]), int(line["layers"])) for line in kv] == [(8192, 16), (4608, 48)]


def test_exaone4_other_sizes_do_not_slide(tmp_path, serve):
    model = _model(tmp_path, "exaone4-small", tiny_gguf.exaone4(layers=6, **{"attention.sliding_window": 128}))
    log = serve(model, ctx=4096, slots=1)
    arch = _check(model, log, tokens=4096, parallel=1)
    assert not any(layer.window for layer in arch.layers)


def test_cohere2_slides_three_of_four(tmp_path, serve):
    model = _model(tmp_path, "cohere2", tiny_gguf.cohere2(layers=5, window=128))
    log = serve(model, ctx=8192, slots=2)
    arch = _check(model, log, tokens=4096, parallel=2)
    assert [layer.window for layer in arch.layers] == [128, 128, 128, 0, 128]


@pytest.mark.parametrize("window", [0, 128])
def test_lfm2_short_convolution_state_and_sliding_attention(tmp_path, serve, window):
    """lfm2 (src/models/lfm2.cpp): layers with 0 KV heads keep a short-convolution state of (l_cache - 1) x
    embedding f32 a slot (llama_hparams::n_embd_r); with a ``sliding_window`` every attention layer slides
    (llama_memory_hybrid_iswa)."""
    keys = {"attention.sliding_window": window} if window else {}
    model = _model(tmp_path, f"lfm2-{window}", tiny_gguf.lfm2(kv_heads=[0, 2, 0, 2, 0], l_cache=3, **keys))
    log = serve(model, ctx=8192, slots=2)
    arch = _check(model, log, tokens=4096, parallel=2)
    assert [layer.window for layer in arch.layers] == [0, window, 0, window, 0]
    _, rs = _logged(log)
    state = sum(layer.state_bytes for layer in arch.layers) * 2
    assert state == 3 * 64 * 2 * 4 * 2 and abs(float(rs[0]["mib"]) * MIB - state) <= PRINTED
