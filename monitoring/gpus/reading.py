"""The one shape every GPU vendor module returns: a typed reading of one device (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class GpuReading:
    """One GPU as its vendor's tool sees it now. Sizes in bytes, power in watts, temperature in °C, bandwidth in GB/s
    (10^9 bytes/s); None where the vendor's tool does not say.

    ``unified``: the GPU has no memory of its own and shares the host's (Apple Silicon, an AMD APU, an Intel iGPU):
    weights there are never "spilled to system RAM", since they are already in it.
    ``process_memory_bytes``: what the device holds for the process asked about (the backend's), None where the tool
    cannot attribute memory to a process."""

    vendor: str  # "nvidia", "amd", "apple", "intel"
    index: int  # the vendor's own index of the device on this host
    name: str
    memory_total_bytes: float | None
    memory_used_bytes: float | None
    memory_reserved_bytes: float = 0.0  # held by the driver for itself, left out of ``memory_used_bytes``
    utilization_pct: float | None = None
    utilization_memory_pct: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    memory_bandwidth_gbs: float | None = None
    bandwidth_source: str = ""  # how the peak was found: "memory clock x bus width (NVML)", a published figure, ...
    unified: bool = False
    process_memory_bytes: float | None = None
    device_id: str = ""  # a stable id where the tool gives one: PCI bus id, UUID

    def as_dict(self) -> dict[str, Any]:
        """The reading as a sample's ``detail.gpus`` holds it (``utilization_gpu_pct`` is its older name there)."""
        values = asdict(self)
        values["utilization_gpu_pct"] = values["utilization_pct"]
        return values


def peak_bandwidth_gbs(
    *, memory_clock_mhz: float | None, bus_width_bits: float | None, transfers_per_clock: int = 2
) -> float | None:
    """A memory's theoretical peak: clock (MHz) x transfers per clock x bus width (bytes), the figure spec sheets give.
    ``transfers_per_clock`` is 2 for the clock NVML reports (its data rate is twice that clock); other tools' clocks
    differ by memory type (monitoring/gpus/amd.py)."""
    if not memory_clock_mhz or not bus_width_bits or memory_clock_mhz <= 0 or bus_width_bits <= 0:
        return None
    return round(memory_clock_mhz * 1e6 * transfers_per_clock * bus_width_bits / 8 / 1e9, 1)
