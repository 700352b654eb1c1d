"""Apple Silicon's GPU through ``macmon pipe -s 1 --soc-info`` (https://github.com/vladkens/macmon), which runs
WITHOUT root: it reads the same IOReport counters ``powermetrics`` does through a private API, and prints one JSON
sample. ``powermetrics`` needs root, so RigDash does not use it; a host without macmon gets ``Unavailable`` saying
``brew install macmon``.

Memory is unified, always: the GPU's memory is the host's RAM, so total and used are macmon's ``ram_total`` /
``ram_usage`` (bytes; ``sysctl -n hw.memsize`` where macmon gives no total). Power in watts, temperature in °C.
Utilisation is ``gpu_active_ratio`` (macmon >= 0.8: the share of the interval the GPU was busy, like NVML's), else
the ratio in ``gpu_usage: [MHz, ratio]`` (macmon <= 0.7; frequency-scaled). The peak bandwidth is Apple's published
figure for the chip (``sysctl -n machdep.cpu.brand_string``, or macmon's ``soc.chip_name``).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from monitoring.collectors import Unavailable
from monitoring.gpus.reading import GpuReading

VENDOR = "apple"
RETRY_AFTER_S = 60.0
TIMEOUT_S = 3.0  # macmon samples for its interval (-i, ms) before it prints
_failed: tuple[float, str] | None = None

# Apple's published unified-memory bandwidth, GB/s, per chip (Apple's newsroom announcements and the Macs' tech-spec
# pages; the M4 family's figures also checked against coverage of the M4 Max announcement).
# A chip sold with two bandwidths is keyed by GPU cores: the variant is not in the brand string.
PUBLISHED_BANDWIDTH_GBS: dict[str, float] = {
    "M1": 68.25,
    "M1 Pro": 200.0,
    "M1 Max": 400.0,
    "M1 Ultra": 800.0,
    "M2": 100.0,
    "M2 Pro": 200.0,
    "M2 Max": 400.0,
    "M2 Ultra": 800.0,
    "M3": 100.0,
    "M3 Pro": 150.0,
    "M3 Ultra": 819.0,
    "M4": 120.0,
    "M4 Pro": 273.0,
}
PUBLISHED_BANDWIDTH_BY_GPU_CORES: dict[str, dict[int, float]] = {
    "M3 Max": {30: 300.0, 40: 400.0},  # 14-core CPU / 30-core GPU; 16-core CPU / 40-core GPU
    "M4 Max": {32: 410.0, 40: 546.0},  # 14-core CPU / 32-core GPU; 16-core CPU / 40-core GPU
}


def chip_of(brand: str) -> str:
    """ "Apple M3 Max" -> "M3 Max"."""
    return brand.strip().removeprefix("Apple").strip()


def published_bandwidth(chip: str, gpu_cores: int | None = None) -> tuple[float | None, str]:
    """Apple's figure for ``chip`` and the source to show; None where the chip (or its variant) is not known."""
    if chip in PUBLISHED_BANDWIDTH_GBS:
        return PUBLISHED_BANDWIDTH_GBS[chip], f"Apple's published figure for {chip}"
    variants = PUBLISHED_BANDWIDTH_BY_GPU_CORES.get(chip, {})
    if gpu_cores in variants:
        return variants[gpu_cores], f"Apple's published figure for {chip} ({gpu_cores}-core GPU)"  # type: ignore[index]
    return None, ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _section(sample: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = sample.get(name)
    return value if isinstance(value, Mapping) else {}


def parse_macmon(
    sample: Mapping[str, Any], *, chip: str = "", memory_total_bytes: float | None = None
) -> list[GpuReading]:
    """The one GPU of an Apple Silicon Mac from one ``macmon pipe`` sample. ``chip``: the brand string's chip where
    macmon's ``soc`` (``--soc-info``) does not name it; ``memory_total_bytes``: ``hw.memsize`` where macmon gives no
    ``ram_total``."""
    memory, soc, temp = _section(sample, "memory"), _section(sample, "soc"), _section(sample, "temp")
    chip = chip_of(str(soc.get("chip_name") or chip))
    active = _number(sample.get("gpu_active_ratio"))
    if active is None:
        legacy = sample.get("gpu_usage")
        active = _number(legacy[1]) if isinstance(legacy, list) and len(legacy) == 2 else None
    gpu_cores = soc.get("gpu_cores")
    bandwidth, source = published_bandwidth(chip, gpu_cores if isinstance(gpu_cores, int) else None)
    temperature = _number(temp.get("gpu_temp_avg"))
    return [
        GpuReading(
            vendor=VENDOR,
            index=0,
            name=f"Apple {chip} GPU" if chip else "Apple Silicon GPU",
            memory_total_bytes=_number(memory.get("ram_total")) or memory_total_bytes,
            memory_used_bytes=_number(memory.get("ram_usage")),
            utilization_pct=active * 100.0 if active is not None else None,
            power_w=_number(sample.get("gpu_power")),
            temperature_c=temperature if temperature else None,  # macmon prints 0 where the SMC has no GPU sensor
            memory_bandwidth_gbs=bandwidth,
            bandwidth_source=source,
            unified=True,
        )
    ]


def _sysctl(name: str) -> str:
    return subprocess.run(
        ["sysctl", "-n", name], capture_output=True, text=True, timeout=TIMEOUT_S, check=True
    ).stdout.strip()


def _macmon() -> Mapping[str, Any]:
    for argv in (["macmon", "pipe", "-s", "1", "-i", "500", "--soc-info"], ["macmon", "pipe", "-s", "1", "-i", "500"]):
        try:  # --soc-info came with macmon 0.5; an older one refuses it
            out = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=True).stdout
        except subprocess.CalledProcessError:
            continue
        lines = [line for line in out.splitlines() if line.strip().startswith("{")]
        if lines:
            document = json.loads(lines[-1])
            if isinstance(document, Mapping):
                return document
    raise ValueError("macmon printed no sample")


def read(pid: int | None = None) -> list[GpuReading]:
    """The Mac's GPU; ``Unavailable`` off macOS or without macmon. ``pid`` is not used: unified memory has no
    per-process GPU share to attribute, so ``process_memory_bytes`` stays None."""
    global _failed
    if platform.system() != "Darwin":
        raise Unavailable("not macOS")
    if _failed and time.monotonic() - _failed[0] < RETRY_AFTER_S:
        raise Unavailable(_failed[1])
    if shutil.which("macmon") is None:
        _failed = (time.monotonic(), "macmon is not installed (brew install macmon; it needs no sudo)")
        raise Unavailable(_failed[1])
    try:
        sample = _macmon()
        chip = _sysctl("machdep.cpu.brand_string")
        total = float(_sysctl("hw.memsize"))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        _failed = (time.monotonic(), f"macmon could not read ({exc.__class__.__name__})")
        raise Unavailable(_failed[1]) from exc
    _failed = None
    return parse_macmon(sample, chip=chip, memory_total_bytes=total)
