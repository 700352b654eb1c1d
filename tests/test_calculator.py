"""The decode calculator's arithmetic against worked examples: what llama-server logs, published file sizes, and
hand-computed spill, prefill, energy and reading-pace figures. Pure functions: no database, no network."""

from __future__ import annotations

import itertools
import math

import pytest

from inference.backends.base import ModelArchitecture
from monitoring.calculator import forms as calculator_forms
from monitoring.calculator import model as calc
from monitoring.calculator import presets as calculator_presets

GIB = 2**30
SMOLLM2 = calculator_presets.MODELS["smollm2-135m"].arch
LLAMA2_7B_PARAMS = calculator_presets.MODELS["llama-2-7b"].params


def _hw(**kw):
    base = {"fast": calc.Tier(8 * GIB, 100e9), "slow": calc.Tier(64 * GIB, 10e9), "link_bytes_s": 5e9}
    return calc.Hardware(**{**base, **kw})


# -- KV cache ------------------------------------------------------------------------------------------------------


def test_smollm2_kv_is_what_llama_server_logs():
    """llama-server logs a 90.00 MiB KV buffer for SmolLM2-135M at f16 and 4,096 tokens (tests/test_monitoring_kv.py
    reads it from the real server): 2 x 30 layers x 3 KV heads x 64 x 2 bytes = 23,040 bytes a token."""
    per_token = calc.kv_bytes_per_token(SMOLLM2, "f16")
    assert per_token == 23_040
    assert calc.kv_bytes(per_token=per_token, context_tokens=4096, sessions=1) / 2**20 == 90.00
    # Four sessions of 1,024 tokens hold what one of 4,096 does.
    assert calc.kv_bytes(per_token=per_token, context_tokens=1024, sessions=4) == 90 * 2**20


@pytest.mark.parametrize(
    ("kv_type", "per_token", "ctx", "logged_mib"),
    [("q8_0", 23_040 * 34 / 32 / 2, 2048, 23.91), ("q4_0", 23_040 * 18 / 32 / 2, 2048, 12.66)],
)
def test_quantised_kv_element_sizes(kv_type, per_token, ctx, logged_mib):
    """q8_0 keeps 34 bytes per 32 elements, q4_0 18 per 32 (ggml's block layouts); q8_0 at 2,048 tokens is the
    23.91 MiB llama-server logs."""
    assert calc.kv_bytes_per_token(SMOLLM2, kv_type) == pytest.approx(per_token)
    assert calc.kv_bytes(per_token=per_token, context_tokens=ctx, sessions=1) / 2**20 == pytest.approx(
        logged_mib, abs=0.005
    )


def test_kv_uses_the_stated_head_dim_and_gqa():
    """Llama 3.1 8B: 32 layers, 8 KV heads of 128: 128 KiB a token at f16 (a quarter of Llama 2 7B's 32 KV heads)."""
    llama3 = calculator_presets.MODELS["llama-3.1-8b"].arch
    llama2 = calculator_presets.MODELS["llama-2-7b"].arch
    assert calc.kv_bytes_per_token(llama3, "f16") == 131_072
    assert calc.kv_bytes_per_token(llama2, "f16") == 4 * 131_072
    qwen = calculator_presets.MODELS["qwen2.5-7b"].arch
    assert calc.kv_bytes_per_token(qwen, "f16") == 2 * 28 * 4 * 128 * 2


def test_kv_refuses_unknown_types_and_impossible_geometry():
    with pytest.raises(ValueError, match="unknown KV cache type"):
        calc.kv_bytes_per_token(SMOLLM2, "q3_k")
    broken = ModelArchitecture(arch="x", block_count=0, head_count=9, head_count_kv=3, embedding_length=576)
    with pytest.raises(ValueError, match="layers"):
        calc.kv_bytes_per_token(broken, "f16")
    with pytest.raises(ValueError, match="sessions"):
        calc.kv_bytes(per_token=1.0, context_tokens=10, sessions=0)
    with pytest.raises(ValueError, match="context_tokens"):
        calc.kv_bytes(per_token=1.0, context_tokens=-1, sessions=1)


# -- weights -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("quant", "published_gib"), [("q4_0", 3.56), ("q8_0", 6.67), ("f16", 12.55)])
def test_llama2_7b_weights_match_the_published_file_sizes(quant, published_gib):
    """Llama 2 7B (6,738,415,616 parameters, its model card's 7B) as llama.cpp's llama-bench prints its GGUF files in
    the project's Apple Silicon benchmark (discussion 4167) and every llama-bench table since: Q4_0 3.56 GiB, Q8_0
    6.67 GiB, F16 12.55 GiB. Parameters x bits per weight lands within 1 %: the real Q4_0 file keeps its output
    tensor in q6_K and its norms in f32."""
    computed = calc.weight_bytes(params=LLAMA2_7B_PARAMS, quant=quant) / GIB
    assert computed == pytest.approx(published_gib, rel=0.01)
    assert computed <= published_gib + 0.005  # never more than the file: the extras only add


def test_weight_bytes_by_quant_and_bad_input():
    assert calc.weight_bytes(params=1e9, quant="q4_0") == 1e9 * 4.5 / 8
    assert calc.weight_bytes(params=1e9, quant="Q8_0") == 1e9 * 8.5 / 8  # case as llama.cpp prints it
    assert calc.weight_bytes(params=1e9, quant="q4_k_m") == 1e9 * 4.84 / 8
    with pytest.raises(ValueError, match="unknown quantisation"):
        calc.weight_bytes(params=1e9, quant="q9_9")
    for bad in (0, -5, math.nan, math.inf):
        with pytest.raises(ValueError, match="params"):
            calc.weight_bytes(params=bad, quant="f16")


# -- memory and spill ----------------------------------------------------------------------------------------------


def test_a_footprint_that_fits_reads_everything_at_the_fast_rate():
    hw = _hw()
    placement = calc.place(4 * GIB, hw)
    assert placement.fits and placement.spilled_bytes == 0 and placement.spill_fraction == 0
    assert calc.decode_step_s(read_bytes=1e9, placement=placement, hw=hw) == pytest.approx(0.01)


def test_spill_is_read_at_the_slow_tier_or_the_link():
    """10 GiB into 8 GiB of 100 GB/s VRAM: 2 GiB (a fifth) spills to 10 GB/s RAM behind a 5 GB/s link.
    A step reading 10 GiB: 0.8 x 10 GiB / 100 GB/s + 0.2 x 10 GiB / 10 GB/s = 0.30065 s (3.33 tokens/s) with the
    spilled layers run on the CPU; over the link, 0.2 x 10 GiB / 5 GB/s instead: 0.51540 s."""
    read = 10 * GIB
    placement = calc.place(read, _hw())
    assert placement.spilled_bytes == 2 * GIB and placement.spill_fraction == pytest.approx(0.2)
    cpu = calc.decode_step_s(read_bytes=read, placement=placement, hw=_hw())
    assert cpu == pytest.approx(read * (0.8 / 100e9 + 0.2 / 10e9)) and cpu == pytest.approx(0.300647, abs=1e-6)
    link = calc.decode_step_s(read_bytes=read, placement=placement, hw=_hw(spill_read="link"))
    assert link == pytest.approx(0.515396, abs=1e-6)
    # A link faster than the RAM does not make the RAM faster.
    fast_link = calc.decode_step_s(read_bytes=read, placement=placement, hw=_hw(spill_read="link", link_bytes_s=64e9))
    assert fast_link == pytest.approx(cpu)


def test_what_fits_nowhere_has_no_rate():
    hw = _hw(slow=calc.Tier(1 * GIB, 10e9))
    placement = calc.place(10 * GIB, hw)
    assert not placement.fits and placement.short_bytes == 1 * GIB
    assert calc.decode_rate(weight_bytes=10 * GIB, kv_per_token=1.0, hw=hw, context_tokens=1, sessions=1) is None
    with pytest.raises(ValueError, match="does not fit"):
        calc.decode_step_s(read_bytes=1.0, placement=placement, hw=hw)
    alone = calc.Hardware(fast=calc.Tier(8 * GIB, 100e9))  # nothing to spill to
    assert not calc.place(8 * GIB + 1, alone).fits


def test_reserved_memory_is_not_the_models():
    hw = _hw(reserved_bytes=1 * GIB)
    assert hw.usable_fast_bytes == 7 * GIB
    assert calc.place(8 * GIB, hw).spilled_bytes == 1 * GIB


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fast": calc.Tier(8 * GIB, 0)}, "fast_bandwidth"),
        ({"fast": calc.Tier(-1, 100e9)}, "fast_capacity"),
        ({"slow": calc.Tier(8 * GIB, -1)}, "slow_bandwidth"),
        ({"link_bytes_s": 0}, "link_bandwidth"),
        ({"reserved_bytes": 8 * GIB}, "reserved"),
        ({"spill_read": "teleport"}, "spill_read"),
        ({"flops": math.inf}, "flops"),
        ({"power_w": -3}, "power_w"),
    ],
)
def test_impossible_hardware_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        _hw(**change)


# -- decode rates --------------------------------------------------------------------------------------------------


def test_decode_is_bandwidth_over_bytes_read_and_sessions_share_the_weights():
    hw = calc.Hardware(fast=calc.Tier(80 * GIB, 1e12))
    alone = calc.decode_rate(weight_bytes=1e10, kv_per_token=1e5, hw=hw, context_tokens=10_000, sessions=1)
    assert alone.read_bytes == 1e10 + 1e9 and alone.per_session_tps == pytest.approx(1e12 / 1.1e10)
    four = calc.decode_rate(weight_bytes=1e10, kv_per_token=1e5, hw=hw, context_tokens=10_000, sessions=4)
    # One step reads the weights once and each session's 1 GB of KV: 14 GB, four tokens.
    assert four.read_bytes == 1.4e10
    assert four.total_tps == pytest.approx(4 * 1e12 / 1.4e10) and four.per_session_tps == pytest.approx(1e12 / 1.4e10)
    start = calc.decode_rate(
        weight_bytes=1e10, kv_per_token=1e5, hw=hw, context_tokens=10_000, sessions=1, context_in_use=0
    )
    assert start.per_session_tps == pytest.approx(100.0)


def test_prefill_and_ttft():
    """2 FLOPs a parameter a token: 1 B parameters x 1,000 tokens at 1 TFLOP/s = 2 s."""
    assert calc.prefill_s(params=1e9, prompt_tokens=1000, flops=1e12) == pytest.approx(2.0)
    assert calc.prefill_s(params=1e9, prompt_tokens=0, flops=1e12) == 0
    with pytest.raises(ValueError, match="flops"):
        calc.prefill_s(params=1e9, prompt_tokens=10, flops=0)


def test_most_sessions_and_contexts_that_fit():
    assert calc.max_sessions(capacity_bytes=24 * GIB, weight_bytes=4 * GIB, kv_per_session_bytes=2 * GIB) == 10
    assert calc.max_sessions(capacity_bytes=24 * GIB, weight_bytes=30 * GIB, kv_per_session_bytes=2 * GIB) == 0
    assert calc.max_context(capacity_bytes=1000, weight_bytes=400, kv_per_token=3, sessions=2) == 100


def test_energy_and_cost_per_million_tokens():
    """450 W at 100 tokens/s: 4.5 J a token, 4.5 MJ = 1.25 kWh a million; at 0.30 a kWh, 0.375."""
    energy = calc.energy_per_million(power_w=450, total_tps=100, price_per_kwh=0.30)
    assert energy.joules_per_million == pytest.approx(4.5e6)
    assert energy.kwh_per_million == pytest.approx(1.25)
    assert energy.cost_per_million == pytest.approx(0.375)
    assert calc.energy_per_million(power_w=450, total_tps=100).cost_per_million is None
    with pytest.raises(ValueError, match="price"):
        calc.energy_per_million(power_w=450, total_tps=100, price_per_kwh=-1)


def test_reading_pace_against_238_words_a_minute():
    assert round(calc.READING_TPS, 6) == round(238 / 60 * 4 / 3, 6)
    assert round(calc.READING_TPS, 3) == 5.289
    assert calc.reading_pace(calc.READING_TPS * 10) == pytest.approx(10)


# -- the whole prediction ------------------------------------------------------------------------------------------


def _smollm2_model():
    preset = calculator_presets.MODELS["smollm2-135m"]
    return calc.ModelSpec(preset.arch, preset.params, calc.weight_bytes(params=preset.params, quant="q8_0"))


def test_prediction_marks_where_the_cache_starts_to_spill():
    """SmolLM2 in q8_0 (142.9 MB) with 1 GiB of fast memory: 4 sessions at f16 take 92,160 bytes a token together,
    so up to (1 GiB - weights) / 92,160 = 10,100.04 -> 10,100 cells a session fit; llama.cpp pads each session's
    share to 256 cells, so 9,984 tokens (39 x 256) fit and 9,985 (10,240 cells) spill; at 4,096 tokens (94.4 MB a
    session) 9 sessions fit and the 10th spills."""
    model = _smollm2_model()
    hw = calc.Hardware(fast=calc.Tier(1 * GIB, 100e9), slow=calc.Tier(16 * GIB, 10e9), flops=1e12, power_w=100)
    work = calc.Workload(context_tokens=4096, sessions=4, prompt_tokens=512)
    p = calc.predict(model, hw, work, price_per_kwh=0.2)
    cells = math.floor((GIB - model.weight_bytes) / (4 * 23_040))
    assert p.spill_context == cells // 256 * 256 + 1 == 9_985
    assert p.spill_sessions == math.floor((GIB - model.weight_bytes) / (4096 * 23_040)) + 1 == 10
    assert p.placement.fits and p.placement.spilled_bytes == 0
    assert p.at_full_context.total_tps == pytest.approx(4 * 100e9 / (model.weight_bytes + 4 * 4096 * 23_040))
    assert p.at_prompt.per_session_tps > p.at_full_context.per_session_tps
    assert p.prefill_s == pytest.approx(2 * model.params * 512 / 1e12)
    assert p.ttft_s == pytest.approx(p.prefill_s + p.at_prompt.step_s)
    assert p.energy.joules_per_million == pytest.approx(100 / p.at_full_context.total_tps * 1e6)
    spilled = calc.predict(model, hw, calc.Workload(context_tokens=20_000, sessions=4, prompt_tokens=512))
    assert spilled.placement.spilled_bytes > 0
    assert spilled.at_full_context.per_session_tps < p.at_full_context.per_session_tps / 2


def test_prediction_refuses_a_prompt_longer_than_the_context():
    hw = calc.Hardware(fast=calc.Tier(1 * GIB, 100e9))
    with pytest.raises(ValueError, match="prompt"):
        calc.predict(_smollm2_model(), hw, calc.Workload(context_tokens=100, sessions=1, prompt_tokens=101))


def test_curves_fall_with_context_and_rise_in_total_with_sessions():
    model = _smollm2_model()
    hw = calc.Hardware(fast=calc.Tier(1 * GIB, 100e9), slow=calc.Tier(16 * GIB, 10e9))
    work = calc.Workload(context_tokens=4096, sessions=4, prompt_tokens=512)
    contexts = calc.context_ladder(4096)
    assert contexts[0] == 128 and 4096 in contexts and contexts == sorted(contexts) and contexts[-1] == 4 * 4096
    rates = [r.per_session_tps for r in calc.curve(model, hw, work, contexts=contexts)]
    assert all(a > b for a, b in itertools.pairwise(rates))
    sessions = calc.sessions_ladder(4)
    assert sessions[0] == 1 and sessions == list(range(1, 17))
    totals = [r.total_tps for r in calc.curve(model, hw, work, sessions=sessions[:8])]
    assert all(a < b for a, b in itertools.pairwise(totals))
    assert 4096 in calc.sessions_ladder(4000) and calc.sessions_ladder(4000)[-1] == 4096


# -- presets -------------------------------------------------------------------------------------------------------


def test_every_preset_names_its_source_and_fills_only_form_fields():
    names = set(calculator_forms.CalculatorForm.base_fields)
    for group in (calculator_presets.MODELS, calculator_presets.DEVICES, calculator_presets.HOSTS,
                  calculator_presets.LINKS):  # fmt: skip
        for key, preset in group.items():
            assert preset.source, key
            assert set(preset.fields()) <= names, key
    for key, device in calculator_presets.DEVICES.items():
        assert device.host in calculator_presets.HOSTS, key
    assert calculator_presets.DEVICES["h200"].bandwidth_gbs == 4800
    assert calculator_presets.DEVICES["rtx-4090"].bandwidth_gbs == 1008


def test_ladders_stretch_to_show_the_spill_point_within_reason():
    assert calc.context_ladder(4096, marks=(30_000,))[-1] == math.ceil(30_000 * 1.25)
    assert 30_000 in calc.context_ladder(4096, marks=(30_000,))
    assert calc.context_ladder(4096, marks=(10**9, None))[-1] == 4 * 4096  # too far to show
    assert calc.sessions_ladder(1, marks=(19,))[-1] == 24 and 19 in calc.sessions_ladder(1, marks=(19,))


def test_many_sessions_make_decode_compute_bound():
    """1 B parameters at 10 TFLOP/s: a step of 1,000 sessions needs 2 TFLOPs, 0.2 s, where its 2 GB (weights once,
    no context) take 2 ms at 1 TB/s: the total stops at 5,000 tokens/s, not 500,000."""
    hw = calc.Hardware(fast=calc.Tier(80 * GIB, 1e12), flops=10e12)
    args = {"weight_bytes": 2e9, "kv_per_token": 1.0, "hw": hw, "context_tokens": 1, "context_in_use": 0}
    one = calc.decode_rate(**args, sessions=1, params=1e9)
    assert not one.compute_bound and one.per_session_tps == pytest.approx(500)
    many = calc.decode_rate(**args, sessions=1000, params=1e9)
    assert many.compute_bound and many.total_tps == pytest.approx(5000)
    assert calc.decode_rate(**args, sessions=1000).total_tps == pytest.approx(1000 * 500, rel=1e-3)  # no params


def test_with_nothing_to_spill_to_there_is_no_spill_point_only_a_limit():
    hw = calc.Hardware(fast=calc.Tier(1 * GIB, 100e9))
    p = calc.predict(_smollm2_model(), hw, calc.Workload(context_tokens=4096, sessions=4, prompt_tokens=512))
    assert p.spill_context is None and p.spill_sessions is None
    assert p.max_sessions_fast == p.max_sessions_total == 9
