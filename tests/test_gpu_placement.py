"""Where the weights are and which bandwidth decode runs at, per memory kind and across several GPUs
(monitoring/placement.py), and the sampler's per-GPU series and energy per token. No GPU runs here: the readings are
GpuReading values as the vendor modules return them (each module is tested against recorded outputs in
tests/test_nvml.py and tests/test_gpu_vendors.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inference.models import Rig
from monitoring import gpus, placement
from monitoring.gpus import GpuReading, GpuSurvey
from monitoring.sampling import RigSampler

GIB = 1024**3


def _gpu(index: int, *, held_gib: float | None, gbs: float | None, power: float | None = 300.0, **extra: Any) -> dict:
    reading = GpuReading(
        vendor=extra.pop("vendor", "nvidia"), index=index, name=extra.pop("name", f"GPU{index}"),
        memory_total_bytes=80 * GIB, memory_used_bytes=(held_gib or 0) * GIB, power_w=power,
        memory_bandwidth_gbs=gbs, bandwidth_source="memory clock x bus width (NVML peak)" if gbs else "",
        process_memory_bytes=None if held_gib is None else held_gib * GIB, **extra,
    )  # fmt: skip
    return reading.as_dict()


def test_a_layer_split_across_two_gpus_runs_at_the_bytes_over_the_sum_of_each_gpus_time():
    """10 GiB at 1,000 GB/s and 30 GiB at 2,000 GB/s: a token reads both in turn, 40 / (10/1000 + 30/2000) = 1,600."""
    rows = [_gpu(0, held_gib=10, gbs=1000.0), _gpu(1, held_gib=30, gbs=2000.0), _gpu(2, held_gib=None, gbs=3000.0)]
    found = placement.gpu_bandwidth(rows, weights_on_gpu=False)
    assert found is not None and found["gbs"] == pytest.approx(1600.0)
    assert "2 GPUs" in found["source"] and "GPU 0 GPU0 25%" in found["source"] and "GPU 1 GPU1 75%" in found["source"]


def test_one_gpu_holding_the_weights_gives_its_own_peak_and_source():
    found = placement.gpu_bandwidth(
        [_gpu(0, held_gib=None, gbs=900.0), _gpu(1, held_gib=4, gbs=4814.3)], weights_on_gpu=False
    )
    assert found == {"gbs": 4814.3, "source": "GPU1: memory clock x bus width (NVML peak)"}


def test_no_gpu_with_a_known_peak_holding_memory_gives_no_gpu_bandwidth():
    assert placement.gpu_bandwidth([_gpu(0, held_gib=4, gbs=None)], weights_on_gpu=False) is None


def test_a_split_model_smaller_in_vram_than_its_weights_spills_and_names_each_gpus_share():
    rows = [_gpu(0, held_gib=2.5, gbs=1000.0), _gpu(1, held_gib=2.5, gbs=1000.0)]
    found = placement.process_placement(
        rows, weight_bytes=8 * GIB, server="llama-server", label="llama.cpp", why_unseen=""
    )
    assert found["spill"] is True and found["memory_kind"] == "discrete"
    assert "5.00 GiB of VRAM (GPU 0: 2.50 GiB, GPU 1: 2.50 GiB), less than the 8.00 GiB of weights" in found["label"]
    assert "at least 3.00 GiB of them in system RAM" in found["label"]


def test_unified_memory_never_spills_whatever_the_process_holds():
    rows = [_gpu(0, held_gib=0.1, gbs=400.0, vendor="apple", name="Apple M2 Max", unified=True)]
    assert placement.all_unified(rows)
    found = placement.unified_placement(rows)
    assert found["spill"] is False and found["memory_kind"] == "unified" and "Apple M2 Max" in found["label"]
    # A discrete GPU beside an APU: not all unified, so the process rule applies.
    assert not placement.all_unified([*rows, _gpu(1, held_gib=1, gbs=900.0)])


def test_power_counts_the_gpus_that_hold_the_process_and_is_unknown_where_none_reports_it():
    rows = [
        _gpu(0, held_gib=4, gbs=1.0, power=250.0),
        _gpu(1, held_gib=4, gbs=1.0, power=260.0),
        _gpu(2, held_gib=None, gbs=1.0, power=70.0),
    ]
    assert placement.power_w(rows) == 510.0
    assert placement.power_w([_gpu(0, held_gib=None, gbs=1.0, power=None)]) is None


def _survey(*readings: GpuReading) -> Any:
    return lambda pid=None: GpuSurvey(readings=list(readings), absent={"amd": "amd-smi not found"})


@pytest.mark.django_db
def test_a_sample_charts_every_gpu_and_the_energy_per_token(monkeypatch):
    """Two GPUs (mocked: no GPU here): a series per GPU, the backend's share of each, the roofline from both, and
    J/token from their power over the decode rate."""
    rig = Rig.objects.create(name="split", kind=Rig.Kind.OPENAI, base_url="http://127.0.0.1:9", queue="rig.split")
    readings = [
        GpuReading(vendor="amd", index=i, name=f"MI{i}", memory_total_bytes=64 * GIB, memory_used_bytes=20 * GIB,
                   power_w=200.0, memory_bandwidth_gbs=1600.0, bandwidth_source="max memory clock x bus width",
                   process_memory_bytes=20 * GIB)
        for i in range(2)
    ]  # fmt: skip
    monkeypatch.setattr(gpus, "gpus", _survey(*readings))
    sampler = RigSampler(rig=rig, bandwidth_gbs=25.0, local_host=True)
    sampler.monitor.weight_bytes = 30 * GIB
    sample = asyncio.run(sampler.read())
    assert [g["index"] for g in sample.detail["gpus"]] == [0, 1]
    assert sample.series["gpu1_memory_used_bytes"] == 20 * GIB and sample.series["gpu1_power_w"] == 200.0
    assert sample.detail["bandwidth"]["gbs"] == pytest.approx(1600.0)
    sample.series["decode_tps"] = 40.0
    sampler._energy(sample.series, sample.detail)
    assert sample.series["energy_j_per_token"] == pytest.approx(400.0 / 40.0)
    monkeypatch.setattr(gpus, "gpus", _survey())
    bare = asyncio.run(sampler.read())
    sampler._energy(bare.series, bare.detail)
    assert "energy_j_per_token" not in bare.series and "not measurable" in bare.detail["energy"]["error"]
    assert "amd: amd-smi not found" in bare.detail["sources"]["gpu"]["error"]
