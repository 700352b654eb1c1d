"""The calculator's KV cache layer by layer, as llama.cpp allocates it (monitoring/calculator/model.py ``KVSizer``):
sliding-window and recurrent layers, max sessions and max context by search, the page's and the API's fields."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from django.test import Client

from inference.backends.base import LayerKV, ModelArchitecture
from monitoring.calculator import model as calc
from monitoring.calculator import presets

GIB = 2**30


def _flat(arch: ModelArchitecture) -> ModelArchitecture:
    """The same geometry with every layer full attention: what the calculator assumed before."""
    return ModelArchitecture(arch.arch, arch.block_count, arch.head_count, arch.head_count_kv, arch.embedding_length,
                             key_length=arch.key_length, value_length=arch.value_length)  # fmt: skip


def test_gemma3_27b_at_8k_is_sized_per_layer():
    """Gemma 3 27B, f16, 8,192 tokens, one session: 10 full layers x 8,192 cells + 52 sliding layers x (1,024 +
    512) cells, 16 KV heads x 256 x 2 bytes a cell = 1.234 GiB. All layers full was 3.875 GiB; the full-attention
    layers alone (what per_token x context gave for a rig's model read per layer) 0.625 GiB, half the real cache."""
    arch = presets.MODELS["gemma-3-27b"].arch
    sizer = calc.kv_sizer(arch, "f16")
    assert sizer.allocated(8192, 1) == (10 * 8192 + 52 * 1536) * 16 * 256 * 2 == 1.234375 * GIB
    assert calc.kv_bytes(per_token=calc.kv_bytes_per_token(_flat(arch), "f16"), context_tokens=8192, sessions=1) == (
        3.875 * GIB
    )
    assert calc.kv_bytes_per_token(arch, "f16") * 8192 == 0.625 * GIB
    # A decode step reads what the tokens in use hold: the sliding layers no more than their window and a batch.
    assert sizer.held(1000, 1) == 62 * 1000 * 16 * 256 * 2


def test_qwen3_next_hybrid_counts_its_recurrent_state():
    """Qwen3-Next 80B-A3B: 12 attention layers (2 KV heads of 256) and 36 Gated DeltaNet layers, each a state of
    (4 - 1) x (4,096 + 2 x 16 x 128) + 128 x 4,096 f32 = 2,195,456 bytes a session, whatever the context."""
    arch = presets.MODELS["qwen3-next-80b"].arch
    sizer = calc.kv_sizer(arch, "f16")
    state = 36 * 2_195_456
    assert sizer.allocated(8192, 2) == 2 * (12 * 8192 * 2 * 512 * 2 + state)
    assert sizer.allocated(8192, 1) < calc.kv_bytes(
        per_token=calc.kv_bytes_per_token(_flat(arch), "f16"), context_tokens=8192, sessions=1
    )


def test_max_context_and_sessions_by_search_match_the_allocation():
    arch = presets.MODELS["gemma-3-27b"].arch
    sizer = calc.kv_sizer(arch, "f16")
    weights, capacity = 15 * GIB, 24 * GIB
    context = calc.max_context_for(capacity_bytes=capacity, weight_bytes=weights, kv=sizer, sessions=2)
    assert sizer.allocated(context, 2) <= capacity - weights < sizer.allocated(context + 1, 2)
    sessions = calc.max_sessions_for(capacity_bytes=capacity, weight_bytes=weights, kv=sizer, context_tokens=8192)
    assert sizer.allocated(8192, sessions) <= capacity - weights < sizer.allocated(8192, sessions + 1)
    assert calc.max_context_for(capacity_bytes=GIB, weight_bytes=2 * GIB, kv=sizer, sessions=1) == 0


def test_a_cache_that_stops_growing_fits_any_context():
    mamba = ModelArchitecture("mamba", 4, 1, 1, 64, layers=(LayerKV(0, 0, 0, state_bytes=1000),) * 4)
    sizer = calc.KVSizer(mamba)
    assert calc.max_context_for(capacity_bytes=GIB, weight_bytes=1e6, kv=sizer, sessions=1) == calc.CONTEXT_LIMIT


@pytest.fixture
def client(owner):
    c = Client()
    c.force_login(owner)
    return c


def test_the_api_and_page_show_the_per_layer_cache(client):
    body = client.get(f"/api/calculator?{urlencode({'model': 'gemma-3-27b', 'context': 8192})}").json()
    assert body["inputs"]["sliding_layers"] == 52 and body["inputs"]["window"] == 1024
    assert body["result"]["kv_bytes"] == 1.234375 * GIB
    hybrid = client.get(f"/api/calculator?{urlencode({'model': 'qwen3-next-80b', 'context': 8192})}").json()
    assert hybrid["inputs"]["recurrent_layers"] == 36
    assert hybrid["result"]["kv_bytes"] == pytest.approx(12 * 8192 * 2048 + 36 * 2_195_456, abs=1)
    query = {"model": "custom", "layers": 4, "heads": 4, "kv_heads": 4, "embd": 256, "params_b": 1, "sliding_layers": 3}
    custom = client.get(f"/api/calculator?{urlencode(query)}")
    assert custom.status_code == 400 and "window" in custom.json()["error"]["fields"]
    page = client.get("/monitoring/calculator/?model=gemma-3-27b")
    assert page.status_code == 200 and b'name="sliding_layers"' in page.content


def test_a_rigs_layer_kinds_fill_the_fields():
    """Ollama's per-layer list and llama-server's counts (arch_summary) give the same fields; a NextN layer (no
    cache, no state) is not counted."""
    from monitoring.calculator.selectors import _layer_kinds

    rows = [[2, 32, 32, 128, 0]] * 5 + [[2, 32, 32, 0, 0], [0, 32, 32, 0, 0]]
    assert _layer_kinds({"block_count": 7, "layers": rows}) == {
        "layers": 6, "sliding_layers": 5, "window": 128, "recurrent_layers": None, "state_mib": None,
    }  # fmt: skip
    summary = {"block_count": 8, "attention_layers": 2, "sliding_layers": 0, "window": 0, "recurrent_layers": 6,
               "state_bytes": 2**20}  # fmt: skip
    assert _layer_kinds(summary) == {
        "layers": 8, "sliding_layers": None, "window": None, "recurrent_layers": 6, "state_mib": 1.0,
    }  # fmt: skip
    assert _layer_kinds({"block_count": 4}) == {}
