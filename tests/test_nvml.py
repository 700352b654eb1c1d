"""The NVIDIA GPU reader's memory figures (monitoring/gpus/nvidia.py), against a stand-in for ``pynvml``: this
machine has no GPU, so NVML is mocked.

The stand-in answers with the figures a real idle H200 gave on 2026-12-04 (driver 580.159.04, nvidia-ml-py 13.610):
v1 ``used`` 644,939,776 bytes, all of it the driver's reservation, where v2 says used 0 and reserved 644,939,776 (and
nvidia-smi showed 0 MiB). The same collector read that GPU for real then (docs/monitoring.md, "On a real GPU"). Its
memory: maximum clock 3201 MHz, bus 6016 bits (scripts/gpu-check/bandwidth_check.py on an H200, same driver).
"""

from __future__ import annotations

import re
import sys
import types
from typing import Any

import pytest

from monitoring.gpus import nvidia
from monitoring.prometheus import render
from monitoring.sampling import RigSampler

TOTAL, RESERVED = 150_754_820_096, 644_939_776
MEM_CLOCK_MAX_MHZ, BUS_WIDTH_BITS = 3201, 6016
MEMORY_V2 = 0x2000028  # pynvml's nvmlMemory_v2


class NVMLError(Exception):
    pass


def _fake_pynvml(
    *,
    has_v2: bool = True,
    driver_knows_v2: bool = True,
    used: int = 0,
    processes: dict[int, int | None] | None = None,
    knows_bus_width: bool = True,
) -> types.ModuleType:
    fake = types.ModuleType("pynvml")
    ns = types.SimpleNamespace

    def memory_info(handle: Any, version: int | None = None) -> Any:
        if version is None:  # v1: the reservation counts as used
            return ns(total=TOTAL, free=TOTAL - used - RESERVED, used=used + RESERVED)
        if not driver_knows_v2:
            raise NVMLError("Function Not Found")
        assert version == MEMORY_V2
        return ns(total=TOTAL, reserved=RESERVED, free=TOTAL - used - RESERVED, used=used)

    def bus_width(handle: Any) -> int:
        if not knows_bus_width:
            raise NVMLError("Not Supported")
        return BUS_WIDTH_BITS

    fake.__dict__.update(
        NVMLError=NVMLError,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_MEM=2,
        nvmlDeviceGetMaxClockInfo=lambda handle, clock: MEM_CLOCK_MAX_MHZ if clock == 2 else 1980,
        nvmlDeviceGetMemoryBusWidth=bus_width,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: ("handle", index),
        nvmlDeviceGetMemoryInfo=memory_info,
        nvmlDeviceGetUtilizationRates=lambda handle: ns(gpu=100, memory=25),
        nvmlDeviceGetName=lambda handle: "NVIDIA H200",
        nvmlDeviceGetPowerUsage=lambda handle: 690_000,
        nvmlDeviceGetTemperature=lambda handle, sensor: 55,
        nvmlDeviceGetComputeRunningProcesses=lambda handle: [
            ns(pid=pid, usedGpuMemory=memory) for pid, memory in (processes or {}).items()
        ],
    )
    if has_v2:
        fake.nvmlMemory_v2 = MEMORY_V2
    return fake


def _rows() -> list[dict[str, Any]]:
    return [reading.as_dict() for reading in nvidia.read()]


def _process_vram(pid: int) -> float | None:
    held = [r.process_memory_bytes for r in nvidia.read(pid) if r.process_memory_bytes is not None]
    return sum(held) if held else None


@pytest.fixture
def fake_nvml(monkeypatch):
    def install(**kwargs: Any) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(**kwargs))
        monkeypatch.setattr(nvidia, "_initialised", False)
        monkeypatch.setattr(nvidia, "_failed", None)

    return install


def test_used_memory_leaves_out_what_the_driver_reserves_as_nvidia_smi_does(fake_nvml):
    fake_nvml(has_v2=True, driver_knows_v2=True)
    (gpu,) = _rows()
    assert gpu["memory_used_bytes"] == 0  # idle: nothing of a process's
    assert gpu["memory_reserved_bytes"] == RESERVED
    assert gpu["memory_total_bytes"] == TOTAL
    fake_nvml(has_v2=True, driver_knows_v2=True, used=9_238_806_528)  # the device check's 8 GiB and its context
    assert _rows()[0]["memory_used_bytes"] == 9_238_806_528


@pytest.mark.parametrize("has_v2, driver_knows_v2", [(False, False), (True, False)])
def test_without_v2_the_v1_figure_is_kept_and_nothing_is_called_reserved(fake_nvml, has_v2, driver_knows_v2):
    """An nvidia-ml-py without nvmlMemory_v2, or a driver that refuses it: the old figure, not an error."""
    fake_nvml(has_v2=has_v2, driver_knows_v2=driver_knows_v2)
    (gpu,) = _rows()
    assert gpu["memory_used_bytes"] == RESERVED
    assert gpu["memory_reserved_bytes"] == 0
    assert gpu["name"] == "NVIDIA H200" and gpu["power_w"] == 690.0


def test_the_reservation_is_exported_beside_used_memory():
    rig = {"name": "box", "model": "m", "up": True, "turns_by_user": {},
           "series": {"gpu0_memory_used_bytes": 0.0, "gpu0_memory_reserved_bytes": float(RESERVED)}}  # fmt: skip
    text = render([rig])
    assert 'rigdash_gpu_memory_reserved_bytes{gpu="0",model="m",rig="box"} 6.44939776e+08' in text
    assert 'rigdash_gpu_memory_used_bytes{gpu="0",model="m",rig="box"} 0.0' in text


def test_a_process_vram_is_what_nvml_attributes_to_its_pid(fake_nvml):
    fake_nvml(processes={488: 9_229_565_952, 77: 1024, 99: None})  # 99: NVML cannot tell (WDDM, MIG)
    assert _process_vram(488) == 9_229_565_952
    assert _process_vram(99) is None
    assert _process_vram(12345) is None


MIB = 2**20


def _placement(rig: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    import asyncio

    sample = asyncio.run(RigSampler(rig=rig, bandwidth_gbs=25.0).take())
    return sample.detail["placement"], sample.series


@pytest.mark.llama
@pytest.mark.django_db
@pytest.mark.parametrize(
    "vram_mib, spill, label",
    [
        (50, True, r"llama.cpp: its process holds 0.05 GiB of VRAM, less than the 0.09 GiB of weights: at least 0.04"),
        (692, None, r"llama.cpp: its process holds 0.68 GiB of VRAM for 0.09 GiB of weights \(CUDA context included"),
        (None, None, r"GPU present: layer split not reported by llama-server \(NVML attributes no VRAM to its proc"),
    ],
)
def test_the_real_llama_servers_vram_by_pid_bounds_where_its_weights_are(fake_nvml, rig, vram_mib, spill, label):
    """The sampler finds the real llama-server by its port, as it does for its resident memory; NVML (mocked: no GPU
    here) attributes VRAM to that pid. Less VRAM than its 98 MB of weights means some are in system RAM; 692 MiB, what
    a CUDA llama-server held on an H200 for this model cut to 6 blocks, cannot tell the split."""
    from monitoring.collectors import host

    port = int(rig.base_url.rsplit(":", 1)[1])
    pid = host.find_listening_pid(port)
    assert pid is not None
    fake_nvml(processes={} if vram_mib is None else {pid: vram_mib * MIB, pid + 1: 10 * 2**30})
    placement, series = _placement(rig)
    assert placement["spill"] is spill
    assert re.match(label, placement["label"]), placement["label"]
    if vram_mib is None:
        assert "backend_vram_bytes" not in series
    else:
        assert series["backend_vram_bytes"] == vram_mib * MIB


def test_a_gpus_peak_bandwidth_is_its_memory_clock_times_its_bus_width(fake_nvml):
    """4,814 GB/s for the H200's readings: its spec sheet says 4.8 TB/s, and torch measured 4,358 GB/s reading and
    4,272 copying there (91 % and 89 % of the peak)."""
    fake_nvml()
    (gpu,) = _rows()
    assert nvidia.memory_bandwidth(sys.modules["pynvml"], None)["memory_bus_width_bits"] == 6016
    assert gpu["bandwidth_source"] == "memory clock x bus width (NVML peak)"
    assert gpu["memory_bandwidth_gbs"] == pytest.approx(3201e6 * 2 * 6016 / 8 / 1e9, abs=0.1) == 4814.3


def test_a_driver_that_does_not_say_its_bus_width_leaves_the_peak_unknown(fake_nvml):
    fake_nvml(knows_bus_width=False)
    (gpu,) = _rows()
    assert gpu["memory_bandwidth_gbs"] is None and gpu["memory_used_bytes"] == 0  # the rest is still read
    assert gpu["bandwidth_source"] == ""
