"""The AMD and Apple GPU modules' parsers against the vendor tools' recorded outputs (tests/data/gpus/README.md names
the source of each), and ``gpus()`` combining vendor modules. Pure: no GPU, no tool, no database."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from monitoring import gpus as gpu_seam
from monitoring.collectors import Unavailable
from monitoring.gpus import amd, apple
from monitoring.gpus.reading import GpuReading

DATA = Path(__file__).parent / "data" / "gpus"
MIB = 1024 * 1024


def _load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


# --- amd-smi ----------------------------------------------------------------------------------------------------


def test_amd_smi_process_list_attributes_memory_to_the_pid() -> None:
    """``amd-smi process --json`` from ROCm/amdsmi CHANGELOG.md (commit 0ceca28f, "amd_smi_lib for ROCm 6.2.0",
    "Fixed multiple processes not being registered"): GPU 0 runs TransferBench (pid 420157) and rvs (pid 420315),
    each ``mem_usage {"value": 0, "unit": "B"}``. A listed pid holds 0 bytes (not None); an unlisted pid, nothing."""
    processes = _load("amd-smi-process.json")
    assert amd.amd_smi_process_memory(processes, 420157) == {0: 0.0}
    assert amd.amd_smi_process_memory(processes, 420315) == {0: 0.0}
    assert amd.amd_smi_process_memory(processes, 999) == {}
    assert amd.amd_smi_process_memory(processes, None) == {}


def test_amd_smi_power_in_watts_and_na_memory() -> None:
    """``amd-smi metric -p --json`` from ROCm/amdsmi CHANGELOG.md (commit 0ceca28f, "amd_smi_lib for ROCm 6.1.0",
    "Added units of measure to JSON output"): socket_power ``{"value": 10, "unit": "W"}``, no mem_usage section."""
    (gpu,) = amd.parse_amd_smi(_load("amd-smi-metric-power.json"), processes=_load("amd-smi-process.json"), pid=420157)
    assert gpu.vendor == "amd" and gpu.index == 0 and gpu.name == "AMD GPU 0"
    assert gpu.power_w == 10.0
    assert gpu.memory_total_bytes is None and gpu.memory_used_bytes is None
    assert gpu.utilization_pct is None and gpu.temperature_c is None
    assert gpu.process_memory_bytes == 0.0
    assert gpu.unified is False


def test_amd_smi_gpu_data_wrapper_and_units() -> None:
    """ROCm 6.4+ wraps the per-GPU list as ``{"gpu_data": [...]}``; both shapes parse alike. The figures here are
    the recorded CHANGELOG's (10 W), under the newer wrapper."""
    wrapped = {"gpu_data": _load("amd-smi-metric-power.json")}
    assert amd.parse_amd_smi(wrapped) == amd.parse_amd_smi(_load("amd-smi-metric-power.json"))


def test_amd_smi_unit_conversions() -> None:
    """amd-smi's "MB" is MiB: the CLI prints ``bytes // (1024*1024)`` as "MB" (ROCm/amdsmi
    amdsmi_cli/amdsmi_commands.py, mem_usage). 196592 MB is the MI300X TOTAL_VRAM in ROCm/amdsmi CHANGELOG.md
    ("amd_smi_lib for ROCm 7.1.0"); the process memory unit is "B"."""
    assert amd._bytes({"value": 196592, "unit": "MB"}) == 196592 * MIB == 206_141_652_992
    assert amd._bytes({"value": 283, "unit": "MB"}) == 296_747_008
    assert amd._bytes({"value": 0, "unit": "B"}) == 0.0
    assert amd._bytes("N/A") is None and amd._bytes({"value": "N/A", "unit": "MB"}) is None
    assert amd._watts({"value": 140, "unit": "W"}) == 140.0
    assert amd._watts({"value": 140_000_000, "unit": "uW"}) == pytest.approx(140.0)
    assert amd._watts("N/A") is None
    # the all-ones sentinel amdsmi gives for an unsupported field (ROCm/rocm-systems#5036)
    assert amd._small(65535) is None and amd._small({"value": 37, "unit": "°C"}) == 37.0
    assert amd._celsius(37) == 37.0 and amd._celsius(37000) == 37.0  # °C from the CLI, millidegrees per the README


def test_apu_signal() -> None:
    """The unified flag: a system-DRAM VRAM type, or a <= 2 GiB carve-out with a larger GTT pool. 512 MB VRAM and
    13649 MB GTT are the APU of ROCm/rocm-systems#1967 (``amd-smi metric -m``); on it the GTT pool is reported."""
    vram, gtt = (512 * MIB, 489 * MIB), (13649 * MIB, 964 * MIB)
    assert amd.is_unified(vram_type=None, vram_total=vram[0], gtt_total=gtt[0])
    assert amd._memory(True, vram, gtt) == gtt
    assert amd.is_unified(vram_type="LPDDR5", vram_total=96 * 1024**3, gtt_total=None)
    assert not amd.is_unified(vram_type="HBM3", vram_total=196592 * MIB, gtt_total=None)
    # a discrete card whose GTT (host aperture) is larger than its VRAM is still discrete
    assert not amd.is_unified(vram_type="GDDR6", vram_total=21458059264, gtt_total=32 * 1024**3)
    assert not amd.is_unified(vram_type=None, vram_total=21458059264, gtt_total=32 * 1024**3)


def test_amd_peak_bandwidth_per_memory_type() -> None:
    """Max memory clock x bus width x the type's transfers per clock gives the published peaks: MI300X (HBM3, 1300
    MHz, 8192 bit) 5.3 TB/s; a type without a known factor gives no figure."""
    assert amd._peak_bandwidth("HBM3", 1300, 8192, "amd-smi") == (
        5324.8,
        "max memory clock x bus width x 4 transfers/clock for HBM3 (amd-smi)",
    )
    assert amd._peak_bandwidth("GDDR6", 1250, 384, "amd-smi")[0] == 960.0
    assert amd._peak_bandwidth("GDDR7", 1250, 384, "amd-smi") == (None, "")
    assert amd._peak_bandwidth("HBM3", None, 8192, "amd-smi") == (None, "")


# --- rocm-smi ---------------------------------------------------------------------------------------------------


def test_rocm_smi_bytes_from_strings() -> None:
    """``rocm-smi --showproductname --showuse --showmeminfo vram --json`` on a Radeon RX 7900 XT, as posted in
    marimo-team/marimo#9237 (verbatim): VRAM bytes as strings, 21458059264 total and 27856896 used."""
    (gpu,) = amd.parse_rocm_smi(_load("rocm-smi-rx7900xt.json"))
    assert gpu.name == "Radeon RX 7900 XT" and gpu.index == 0
    assert gpu.memory_total_bytes == 21_458_059_264.0
    assert gpu.memory_used_bytes == 27_856_896.0
    assert gpu.utilization_pct == 0.0
    assert gpu.power_w is None and gpu.temperature_c is None
    assert gpu.unified is False and gpu.process_memory_bytes is None


def test_rocm_smi_two_gpus_with_na() -> None:
    """``rocm-smi --json --showmemuse`` on two RX 6800s (ROCM-SMI 1.4.1), from ROCm/rocm_smi_lib PR #120's
    description ("Before the change"): two cards, "Memory Activity" N/A, no memory sizes."""
    readings = amd.parse_rocm_smi(_load("rocm-smi-2x-rx6800-memuse.json"))
    assert [gpu.index for gpu in readings] == [0, 1]
    assert all(gpu.utilization_memory_pct == 0.0 for gpu in readings)
    assert all(gpu.memory_total_bytes is None and gpu.utilization_pct is None for gpu in readings)
    assert [gpu.name for gpu in readings] == ["AMD GPU 0", "AMD GPU 1"]


def test_rocm_smi_apu_power_and_temperature() -> None:
    """``rocm-smi --json`` on a Radeon 780M APU (Phoenix3; rocm-smi-lib 6.2.4), from
    sebhildebrandt/systeminformation PR #960, trimmed after "PFP firmware version": power 7.222 W as a string,
    edge temperature 31.0 °C, GPU use 19 %, PCI bus 0000:C4:00.0. It carries no memory sizes, so no unified signal."""
    (gpu,) = amd.parse_rocm_smi(_load("rocm-smi-780m-trimmed.json"))
    assert gpu.name == "Phoenix3"
    assert gpu.power_w == 7.222
    assert gpu.temperature_c == 31.0
    assert gpu.utilization_pct == 19.0
    assert gpu.device_id == "0000:C4:00.0"
    assert gpu.memory_total_bytes is None and gpu.unified is False


# --- the amdsmi library -----------------------------------------------------------------------------------------


def test_amdsmi_library_path() -> None:
    """The library path, against a stand-in whose answers have the shapes ROCm/amdsmi py-interface/README.md
    documents (``amdsmi_get_gpu_activity`` percents or "N/A", ``amdsmi_get_power_info`` socket power,
    ``amdsmi_get_gpu_process_list`` dicts with ``pid``, ``mem``, ``memory_usage.vram_mem``). Figures: the MI300X of
    ROCm/amdsmi CHANGELOG.md, ROCm 7.1.0 (196592 MB VRAM, 283 MB used, 140 W, hotspot 37 °C); the pid 2427396 is
    that CHANGELOG's rvs process. Two handles: the second answers N/A and raises for everything else."""

    class LibraryError(Exception):
        pass

    memory_type = types.SimpleNamespace(VRAM=0, GTT=2)

    def unsupported(*args: Any) -> Any:
        raise LibraryError("AMDSMI_STATUS_NOT_SUPPORTED")

    def memory_total(handle: str, kind: int) -> int:
        if handle != "gpu0":
            raise LibraryError("not supported")
        return 196592 * MIB if kind == memory_type.VRAM else 0

    def memory_usage(handle: str, kind: int) -> int:
        if handle != "gpu0":
            raise LibraryError("not supported")
        return 283 * MIB if kind == memory_type.VRAM else 0

    library = types.SimpleNamespace(
        AmdSmiMemoryType=memory_type,
        AmdSmiTemperatureType=types.SimpleNamespace(HOTSPOT=1, EDGE=0),
        AmdSmiTemperatureMetric=types.SimpleNamespace(CURRENT=0),
        amdsmi_get_processor_handles=lambda: ["gpu0", "gpu1"],
        amdsmi_get_gpu_memory_total=memory_total,
        amdsmi_get_gpu_memory_usage=memory_usage,
        amdsmi_get_gpu_vram_usage=unsupported,
        amdsmi_get_gpu_activity=lambda h: (
            {"gfx_activity": 0, "umc_activity": 0, "mm_activity": "N/A"}
            if h == "gpu0"
            else {"gfx_activity": "N/A", "umc_activity": "N/A", "mm_activity": "N/A"}
        ),
        amdsmi_get_power_info=lambda h: (
            {"current_socket_power": 140, "average_socket_power": "N/A"}
            if h == "gpu0"
            else {"current_socket_power": "N/A", "average_socket_power": "N/A"}
        ),
        amdsmi_get_temp_metric=lambda h, sensor, metric: 37 if h == "gpu0" and sensor == 1 else unsupported(),
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI300X"} if h == "gpu0" else unsupported(),
        amdsmi_get_gpu_device_bdf=lambda h: "0000:0c:00.0" if h == "gpu0" else "0000:22:00.0",
        amdsmi_get_gpu_process_list=lambda h: (
            [
                {
                    "name": "rvs",
                    "pid": 2427396,
                    "mem": 2 * 1024**3,
                    "memory_usage": {"gtt_mem": 2 * MIB, "cpu_mem": 0, "vram_mem": 2 * 1024**3},
                }
            ]
            if h == "gpu0"
            else []
        ),
    )
    first, second = amd.parse_amdsmi_library(library, 2427396)
    assert first == GpuReading(
        vendor="amd",
        index=0,
        name="AMD Instinct MI300X",
        memory_total_bytes=206_141_652_992.0,
        memory_used_bytes=296_747_008.0,
        utilization_pct=0.0,
        utilization_memory_pct=0.0,
        power_w=140.0,
        temperature_c=37.0,
        process_memory_bytes=2 * 1024**3,
        device_id="0000:0c:00.0",
    )
    assert second.name == "AMD GPU 1" and second.device_id == "0000:22:00.0"
    assert second.memory_total_bytes is None and second.power_w is None and second.utilization_pct is None
    assert second.temperature_c is None and second.process_memory_bytes is None


def test_amd_read_caches_absence(monkeypatch: pytest.MonkeyPatch) -> None:
    """No amdsmi, no amd-smi, no rocm-smi: ``Unavailable`` saying so, and no second look within the minute."""
    monkeypatch.setattr(amd, "_failed", None)
    looked: list[str] = []

    def no_library(pid: int | None) -> list[GpuReading]:
        looked.append("amdsmi")
        raise ImportError

    monkeypatch.setattr(amd, "_library", no_library)
    monkeypatch.setattr(amd.shutil, "which", lambda tool: None)
    with pytest.raises(Unavailable, match="amdsmi is not installed; amd-smi is not on PATH; rocm-smi is not on PATH"):
        amd.read()
    with pytest.raises(Unavailable):
        amd.read()
    assert looked == ["amdsmi"]


# --- Apple Silicon ----------------------------------------------------------------------------------------------


def test_macmon_v08_sample() -> None:
    """``macmon pipe`` JSON from vladkens/macmon readme.md (commit 6919d778, "Output format"; its // comments and
    trailing commas dropped so it parses): ram 25769803776 / 20985479168 bytes, gpu_power 0.017451683 W,
    gpu_active_ratio 0.09, gpu_temp_avg 36.95167 °C."""
    (gpu,) = apple.parse_macmon(_load("macmon-v0.8.json"), chip="Apple M3 Pro")
    assert gpu.vendor == "apple" and gpu.index == 0 and gpu.name == "Apple M3 Pro GPU"
    assert gpu.unified is True
    assert gpu.memory_total_bytes == 25_769_803_776.0
    assert gpu.memory_used_bytes == 20_985_479_168.0
    assert gpu.utilization_pct == pytest.approx(9.0)
    assert gpu.power_w == pytest.approx(0.017451683)
    assert gpu.temperature_c == pytest.approx(36.95167)
    assert gpu.memory_bandwidth_gbs == 150.0
    assert gpu.bandwidth_source == "Apple's published figure for M3 Pro"
    assert gpu.process_memory_bytes is None


def test_macmon_v07_sample_and_memsize_fallback() -> None:
    """``macmon pipe`` JSON of macmon 0.7 from vladkens/macmon readme.md (commit 432225ad, "chore: release v0.7.0";
    comments dropped): ``gpu_usage: [461, 0.021497859]`` is (MHz, ratio). Without ``ram_total`` the total is
    ``hw.memsize``."""
    sample = _load("macmon-v0.7.json")
    (gpu,) = apple.parse_macmon(sample, chip="Apple M1")
    assert gpu.utilization_pct == pytest.approx(2.1497859)
    assert gpu.memory_bandwidth_gbs == 68.25
    without_total = {**sample, "memory": {"ram_usage": 20985479168}}
    (gpu,) = apple.parse_macmon(without_total, chip="Apple M1", memory_total_bytes=17_179_869_184.0)
    assert gpu.memory_total_bytes == 17_179_869_184.0 and gpu.memory_used_bytes == 20_985_479_168.0


def test_apple_variant_bandwidth() -> None:
    """M4 Max: 410 GB/s with the 32-core GPU, 546 GB/s with the 40-core one; the variant is not in the brand string,
    so without macmon's ``soc.gpu_cores`` there is no figure rather than a guess."""
    sample = {**_load("macmon-v0.8.json"), "soc": {"chip_name": "Apple M4 Max", "gpu_cores": 40}}
    (gpu,) = apple.parse_macmon(sample)
    assert gpu.name == "Apple M4 Max GPU"
    assert (gpu.memory_bandwidth_gbs, gpu.bandwidth_source) == (
        546.0,
        "Apple's published figure for M4 Max (40-core GPU)",
    )
    assert apple.published_bandwidth("M4 Max", 32)[0] == 410.0
    assert apple.published_bandwidth("M4 Max") == (None, "")
    assert apple.published_bandwidth("M9") == (None, "")


def test_apple_off_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apple.platform, "system", lambda: "Linux")
    with pytest.raises(Unavailable, match="not macOS"):
        apple.read()


# --- gpus(): every vendor ---------------------------------------------------------------------------------------


def test_vendors_are_registered_in_order() -> None:
    assert [vendor.VENDOR for vendor in gpu_seam.VENDORS] == ["nvidia", "amd", "apple"]


def test_gpus_combines_vendors_and_records_absence(monkeypatch: pytest.MonkeyPatch) -> None:
    """One vendor answers (the recorded rocm-smi RX 7900 XT), the others are absent, each with its reason."""
    from monitoring.gpus import nvidia

    def absent(why: str) -> Any:
        def read(pid: int | None = None) -> list[GpuReading]:
            raise Unavailable(why)

        return read

    amd_readings = amd.parse_rocm_smi(_load("rocm-smi-rx7900xt.json"))
    monkeypatch.setattr(nvidia, "read", absent("NVML could not start (Driver Not Loaded)"))
    monkeypatch.setattr(amd, "read", lambda pid=None: amd_readings)
    monkeypatch.setattr(apple, "read", absent("not macOS"))
    survey = gpu_seam.gpus(pid=1234)
    assert survey.readings == amd_readings
    assert survey.absent == {"nvidia": "NVML could not start (Driver Not Loaded)", "apple": "not macOS"}

    mac = apple.parse_macmon(_load("macmon-v0.8.json"), chip="Apple M2")
    monkeypatch.setattr(apple, "read", lambda pid=None: mac)
    survey = gpu_seam.gpus()
    assert [(gpu.vendor, gpu.unified) for gpu in survey.readings] == [("amd", False), ("apple", True)]
    assert survey.absent == {"nvidia": "NVML could not start (Driver Not Loaded)"}

    monkeypatch.setattr(amd, "read", absent("amdsmi is not installed; amd-smi is not on PATH; rocm-smi is not on PATH"))
    monkeypatch.setattr(apple, "read", absent("not macOS"))
    survey = gpu_seam.gpus()
    assert survey.readings == []
    assert survey.why_none == (
        "no GPU found (nvidia: NVML could not start (Driver Not Loaded); "
        "amd: amdsmi is not installed; amd-smi is not on PATH; rocm-smi is not on PATH; apple: not macOS)"
    )
