"""On a GPU machine: the memory bandwidth RigDash's NVML collector reports (memory clock x bus width, the theoretical
peak the roofline uses for a GPU rig) beside what the GPU really moves (torch: a device-to-device copy, read and
write counted, and a reduction that only reads). Prints one JSON object and ends with BANDWIDTH CHECK PASSED or FAILED.

    python3 scripts/gpu-check/bandwidth_check.py        (from the repository root; needs nvidia-ml-py and torch)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from monitoring.gpus import nvidia  # the repository root is on the path now


def measured_gbs(gib: int = 4, rounds: int = 20) -> dict[str, float]:
    import torch

    n = gib * 1024**3 // 4
    src = torch.ones(n, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
        src.sum()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(rounds):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    copy_s = start.elapsed_time(end) / 1000 / rounds
    start.record()
    for _ in range(rounds):
        src.sum()
    end.record()
    torch.cuda.synchronize()
    read_s = start.elapsed_time(end) / 1000 / rounds
    nbytes = src.numel() * 4
    return {"copy_read_write_gbs": round(2 * nbytes / copy_s / 1e9, 1), "sum_read_gbs": round(nbytes / read_s / 1e9, 1)}


def main() -> int:
    started = time.monotonic()
    readings = [reading.as_dict() for reading in nvidia.read()]
    pynvml = nvidia._nvml()
    raw = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        raw.append(
            {
                "max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                "bus_width_bits": pynvml.nvmlDeviceGetMemoryBusWidth(handle),
                "driver": pynvml.nvmlSystemGetDriverVersion(),
            }
        )
    result = {"collector": readings, "raw": raw, "measured": measured_gbs(), "seconds": 0.0}
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=1, default=str))
    peak = readings[0].get("memory_bandwidth_gbs")
    best = max(result["measured"].values())
    ok = bool(peak) and 0.5 * peak <= best <= 1.05 * peak
    print(f"peak {peak} GB/s from NVML; measured best {best} GB/s ({best / peak:.0%} of peak)" if peak else "no peak")
    print("BANDWIDTH CHECK PASSED" if ok else "BANDWIDTH CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
