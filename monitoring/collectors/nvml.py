"""GPU memory, utilisation, power and temperature through NVML (``nvidia-ml-py``, imported as pynvml).

On a machine without an NVIDIA driver ``nvmlInit`` raises: that is reported as "no GPU", not an error.
"""

from __future__ import annotations

from typing import Any

from monitoring.collectors import Unavailable

_initialised = False


def _nvml() -> Any:
    global _initialised
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - it is a dependency
        raise Unavailable("nvidia-ml-py is not installed") from exc
    if not _initialised:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise Unavailable(f"no GPU: NVML could not start ({exc})") from exc
        _initialised = True
    return pynvml


def gpus() -> list[dict[str, Any]]:
    nvml = _nvml()
    try:
        readings = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilisation = nvml.nvmlDeviceGetUtilizationRates(handle)
            name = nvml.nvmlDeviceGetName(handle)
            readings.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_used_bytes": float(memory.used),
                    "memory_total_bytes": float(memory.total),
                    "utilization_gpu_pct": float(utilisation.gpu),
                    "utilization_memory_pct": float(utilisation.memory),
                    "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    "temperature_c": float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                }
            )
        return readings
    except nvml.NVMLError as exc:
        raise Unavailable(f"NVML reading failed: {exc}") from exc
