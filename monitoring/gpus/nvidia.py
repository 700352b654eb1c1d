"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as pynvml).

https://docs.nvidia.com/deploy/nvml-api/ — on a machine without an NVIDIA driver ``nvmlInit`` raises: that is
"no NVIDIA GPU", not an error.
"""

from __future__ import annotations

import time
from typing import Any

from monitoring.collectors import Unavailable
from monitoring.gpus.reading import GpuReading, peak_bandwidth_gbs

VENDOR = "nvidia"
_initialised = False
_failed: tuple[float, str] | None = None  # when NVML last failed to start, and why
RETRY_AFTER_S = 60.0  # a driver that is not there now is not there a second later: retry once a minute


def _nvml() -> Any:
    global _initialised, _failed
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - it is a dependency
        raise Unavailable("nvidia-ml-py is not installed") from exc
    if not _initialised:
        if _failed and time.monotonic() - _failed[0] < RETRY_AFTER_S:
            raise Unavailable(_failed[1])
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _failed = (time.monotonic(), f"NVML could not start ({exc})")
            raise Unavailable(_failed[1]) from exc
        _initialised, _failed = True, None
    return pynvml


def _memory(nvml: Any, handle: Any) -> tuple[float, float, float]:
    """Used, total and reserved bytes. NVML's v1 ``used`` counts what the driver reserves for itself as used (an
    idle GPU shows hundreds of MiB used where nvidia-smi shows none); v2 reports the reservation apart, as
    nvidia-smi does (docs/monitoring.md, "On a real GPU"). A driver or nvidia-ml-py without v2 gets the v1 figure,
    reserved 0."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return float(memory.used), float(memory.total), float(memory.reserved)
        except nvml.NVMLError:  # a driver older than v2 answers FUNCTION_NOT_FOUND or ARGUMENT_VERSION_MISMATCH
            pass
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return float(memory.used), float(memory.total), 0.0


def memory_bandwidth(nvml: Any, handle: Any) -> dict[str, float | None]:
    """The GPU's theoretical peak memory bandwidth from the memory clock's maximum (MHz) and the bus width (bits).
    None where NVML does not say (an older driver, a vGPU)."""
    try:
        clock_mhz = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))
        bus_bits = float(nvml.nvmlDeviceGetMemoryBusWidth(handle))
    except (nvml.NVMLError, AttributeError):
        return {"memory_clock_max_mhz": None, "memory_bus_width_bits": None, "memory_bandwidth_gbs": None}
    return {
        "memory_clock_max_mhz": clock_mhz,
        "memory_bus_width_bits": bus_bits,
        "memory_bandwidth_gbs": peak_bandwidth_gbs(memory_clock_mhz=clock_mhz, bus_width_bits=bus_bits),
    }


def _process_memory(nvml: Any, handle: Any, pid: int | None) -> float | None:
    """Bytes NVML attributes to ``pid``'s compute contexts on this device (its CUDA context included); None where it
    attributes none to that pid: a backend on the CPU, one whose pid NVML sees under another number (a container of
    its own), or a driver that cannot tell (``usedGpuMemory`` None under WDDM or MIG)."""
    if pid is None:
        return None
    found = [
        float(process.usedGpuMemory)
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        if process.pid == pid and process.usedGpuMemory is not None
    ]
    return sum(found) if found else None


def _power_w(nvml: Any, handle: Any) -> float | None:
    try:
        return float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # milliwatts
    except nvml.NVMLError:  # some boards (and every MIG slice) do not report power
        return None


def read(pid: int | None = None) -> list[GpuReading]:
    """Every NVIDIA GPU on this host; raises ``Unavailable`` where NVML cannot start or read."""
    nvml = _nvml()
    try:
        readings = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            used, total, reserved = _memory(nvml, handle)
            utilisation = nvml.nvmlDeviceGetUtilizationRates(handle)
            name = nvml.nvmlDeviceGetName(handle)
            bandwidth = memory_bandwidth(nvml, handle)
            readings.append(
                GpuReading(
                    vendor=VENDOR,
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    memory_total_bytes=total,
                    memory_used_bytes=used,
                    memory_reserved_bytes=reserved,
                    utilization_pct=float(utilisation.gpu),
                    utilization_memory_pct=float(utilisation.memory),
                    power_w=_power_w(nvml, handle),
                    temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                    memory_bandwidth_gbs=bandwidth["memory_bandwidth_gbs"],
                    bandwidth_source="memory clock x bus width (NVML peak)"
                    if bandwidth["memory_bandwidth_gbs"]
                    else "",
                    process_memory_bytes=_process_memory(nvml, handle, pid),
                )
            )
        return readings
    except nvml.NVMLError as exc:
        raise Unavailable(f"NVML reading failed: {exc}") from exc
