"""GPU memory, utilisation, power and temperature through NVML (``nvidia-ml-py``, imported as pynvml).

On a machine without an NVIDIA driver ``nvmlInit`` raises: that is reported as "no GPU", not an error.
"""

from __future__ import annotations

import time
from typing import Any

from monitoring.collectors import Unavailable

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
            _failed = (time.monotonic(), f"no GPU: NVML could not start ({exc})")
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
    """The GPU's theoretical peak memory bandwidth: the memory clock's maximum (MHz) x 2 transfers a clock x the bus
    width (bytes), the figure GPU spec sheets give. None where NVML does not say (an older driver, a vGPU)."""
    try:
        clock_mhz = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))
        bus_bits = float(nvml.nvmlDeviceGetMemoryBusWidth(handle))
    except (nvml.NVMLError, AttributeError):
        return {"memory_clock_max_mhz": None, "memory_bus_width_bits": None, "memory_bandwidth_gbs": None}
    peak = clock_mhz * 1e6 * 2 * bus_bits / 8 / 1e9 if clock_mhz > 0 and bus_bits > 0 else None
    return {
        "memory_clock_max_mhz": clock_mhz,
        "memory_bus_width_bits": bus_bits,
        "memory_bandwidth_gbs": None if peak is None else round(peak, 1),
    }


def gpus() -> list[dict[str, Any]]:
    nvml = _nvml()
    try:
        readings = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            used, total, reserved = _memory(nvml, handle)
            utilisation = nvml.nvmlDeviceGetUtilizationRates(handle)
            name = nvml.nvmlDeviceGetName(handle)
            readings.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_used_bytes": used,
                    "memory_total_bytes": total,
                    "memory_reserved_bytes": reserved,
                    "utilization_gpu_pct": float(utilisation.gpu),
                    "utilization_memory_pct": float(utilisation.memory),
                    "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    "temperature_c": float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                    **memory_bandwidth(nvml, handle),
                }
            )
        return readings
    except nvml.NVMLError as exc:
        raise Unavailable(f"NVML reading failed: {exc}") from exc


def process_vram(pid: int) -> float | None:
    """Bytes of GPU memory NVML attributes to ``pid``'s compute contexts, every GPU together; None where it attributes
    none to that pid: a backend on the CPU, or one whose pid NVML sees under another number (a container of its own).

    The figure includes the process's CUDA context: llama-server serving a 6-block SmolLM2 on an H200 held 692 MiB
    with every layer offloaded and 534 MiB with none, where its model, KV cache and compute buffers were 105 and 14
    MiB (docs/monitoring.md, "On a real GPU")."""
    nvml = _nvml()
    found: list[float] = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == pid and process.usedGpuMemory is not None:  # None: not available (WDDM, MIG)
                    found.append(float(process.usedGpuMemory))
    except nvml.NVMLError as exc:
        raise Unavailable(f"NVML process reading failed: {exc}") from exc
    return sum(found) if found else None
