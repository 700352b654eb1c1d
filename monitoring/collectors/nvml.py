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
