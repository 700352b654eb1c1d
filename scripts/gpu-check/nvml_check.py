"""On a GPU machine: RigDash's NVIDIA GPU reader (monitoring/gpus/nvidia.py) against what the GPU really holds.

Reads ``nvidia.read()`` idle, while a child process holds 8 GiB, while the child runs bf16 matrix products, and after it
exits; also NVML's per-process memory (can a backend's own VRAM be told by its pid?). Needs torch and nvidia-ml-py,
as the device machine's python3 has. Prints ``NVML CHECK PASSED`` or ``FAILED``.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.getcwd())
import pynvml

from monitoring.gpus import nvidia

GIB = 1024**3
HELD_GIB = 8
CHILD = rf"""
import sys, time, torch
x = torch.empty({HELD_GIB} * 1024**3, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
end = time.time() + 6
while time.time() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
print("done", flush=True)
sys.stdin.readline()
"""


def processes() -> dict[int, int | None]:
    """pid -> bytes, as NVML attributes compute memory to processes."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def memory_versions() -> dict[str, Any]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    out: dict[str, Any] = {"v1": {"total": v1.total, "free": v1.free, "used": v1.used}}
    try:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        out["v2"] = {"total": v2.total, "reserved": v2.reserved, "free": v2.free, "used": v2.used}
    except (AttributeError, pynvml.NVMLError) as exc:
        out["v2"] = repr(exc)
    return out


def gpu_rows() -> list[dict[str, Any]]:
    return [reading.as_dict() for reading in nvidia.read()]


def process_vram(pid: int) -> float | None:
    """What the sampler reads for a backend's pid: the memory every GPU attributes to it."""
    held = [r.process_memory_bytes for r in nvidia.read(pid) if r.process_memory_bytes is not None]
    return sum(held) if held else None


def main() -> int:
    pynvml.nvmlInit()
    print("driver", pynvml.nvmlSystemGetDriverVersion())
    started = time.perf_counter()
    idle = gpu_rows()
    print(f"first gpus() call: {1000 * (time.perf_counter() - started):.1f} ms")
    print("idle:", json.dumps(idle))
    print("idle NVML memory v1/v2:", memory_versions())
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    smi_used = float(smi.stdout.strip()) * 2**20
    print(f"used: the collector {idle[0]['memory_used_bytes'] / 2**20:.0f} MiB, nvidia-smi {smi_used / 2**20:.0f} MiB")
    costs = []
    for _ in range(50):
        started = time.perf_counter()
        gpu_rows()
        costs.append(time.perf_counter() - started)
    print(f"gpus() per call: median {1e3 * statistics.median(costs):.2f} ms, max {1e3 * max(costs):.2f} ms (50 calls)")

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    print("child:", child.stdout.readline().strip(), "pid", child.pid)
    held = gpu_rows()
    print(f"child holds {HELD_GIB} GiB:", json.dumps(held))
    rise = held[0]["memory_used_bytes"] - idle[0]["memory_used_bytes"]
    print(f"used rose by {rise / GIB:.3f} GiB (the tensor and the child's CUDA context)")
    print("NVML memory v1/v2:", memory_versions())
    print("NVML's processes (pid: bytes):", processes())
    own = process_vram(child.pid)  # what the sampler reads for a backend's pid
    print(f"process_vram(child): {own / GIB:.3f} GiB" if own else f"the child's pid is not attributed ({own})")
    child.stdin.write("go\n")
    child.stdin.flush()
    series = []
    started = time.time()
    while time.time() - started < 6.5:
        g = gpu_rows()[0]
        series.append(
            (round(time.time() - started, 1), g["utilization_gpu_pct"], round(g["power_w"]), g["temperature_c"])
        )
        time.sleep(0.5)
    print("under load (s, util %, W, C):", series)
    print("child:", child.stdout.readline().strip())
    child.stdin.write("bye\n")
    child.stdin.flush()
    child.wait(timeout=30)
    time.sleep(1.0)
    after = gpu_rows()
    print("after the child exited:", json.dumps(after))
    ok = (
        idle[0]["memory_total_bytes"] > 16 * GIB
        and abs(idle[0]["memory_used_bytes"] - smi_used) < 64 * 2**20
        and HELD_GIB * GIB < rise < (HELD_GIB + 2) * GIB
        and own is not None
        and HELD_GIB * GIB < own < (HELD_GIB + 2) * GIB
        and max(s[1] for s in series) > 50
        and abs(after[0]["memory_used_bytes"] - idle[0]["memory_used_bytes"]) < 0.1 * GIB
    )
    print("NVML CHECK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
