"""Decode's core on a GPU: one step multiplies the weights by a vector per session. Times that (bf16, 8.6 GB of
"weights") for 1 to 1,024 sessions beside the calculator's bound, and reads the power while one session decodes.

    python3 scripts/gpu-check/decode_gemv.py [--gbs 4800 --tflops 989.5]   (the device tool; about 15 s on an H200)

The bound is monitoring/calculator.py's decode step with no KV cache: max(weight bytes / bandwidth, 2 x parameters x
sessions / FLOP/s), from the GPU's spec sheet (the defaults: the H200 preset). Needs PyTorch with CUDA, no RigDash.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import torch  # type: ignore[import-not-found]

N = 65_536  # a 65,536 x 65,536 bf16 matrix: 8.6 GB, far past the caches


def step_s(weights: torch.Tensor, sessions: int, repeats: int = 20) -> float:
    x = torch.randn(N, sessions, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        weights @ x
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        weights @ x
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / repeats / 1e3


def power_while_decoding(weights: torch.Tensor, seconds: float = 4.0) -> list[float]:
    """nvidia-smi's power draw every 100 ms while one session's steps run back to back."""
    log = Path(tempfile.mkstemp(suffix=".txt")[1])
    with log.open("w") as out:
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits", "-lms", "100"], stdout=out
        )
        x = torch.randn(N, 1, dtype=torch.bfloat16, device="cuda")
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for _ in range(100):
                weights @ x
            torch.cuda.synchronize()
        smi.terminate()
        smi.wait()
    return [float(line) for line in log.read_text().split() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gbs", type=float, default=4800.0, help="spec memory bandwidth, GB/s")
    parser.add_argument("--tflops", type=float, default=989.5, help="spec dense bf16 TFLOP/s")
    args = parser.parse_args()
    weights = torch.randn(N, N, dtype=torch.bfloat16, device="cuda")
    nbytes, params = weights.numel() * 2, weights.numel()
    name = torch.cuda.get_device_name()
    print(f"{name}: weights {nbytes / 1e9:.2f} GB; bound from {args.gbs} GB/s and {args.tflops} TFLOP/s")
    print("sessions  step ms  bound ms  rate of bound  read GB/s  TFLOP/s")
    for sessions in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        measured = step_s(weights, sessions)
        bound = max(nbytes / (args.gbs * 1e9), 2 * params * sessions / (args.tflops * 1e12))
        print(f"{sessions:8d} {measured * 1e3:8.3f} {bound * 1e3:9.3f} {bound / measured:14.2f}"
              f" {nbytes / measured / 1e9:10.0f} {2 * params * sessions / measured / 1e12:8.1f}")  # fmt: skip
    watts = sorted(power_while_decoding(weights))
    if watts:
        print(f"power while one session decodes: median {watts[len(watts) // 2]:.0f} W, max {watts[-1]:.0f} W")


if __name__ == "__main__":
    main()
