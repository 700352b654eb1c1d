"""On a GPU machine: a CUDA llama-server, and what RigDash's collectors and NVML say of it.

usage: llama_check.py LLAMA_SERVER MODEL      (DRY=1: no GPU here; NVML's readings stand in as zeros)
For -ngl 99 (every layer), 3 and 0: start llama-server, read RigDash's llama.cpp collector (/slots, /metrics, /props),
its NVML collector and NVML's memory of llama-server's pid during a 400-token decode, and print llama-server's own
lines on offload and buffers (its log at verbosity 4).
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import types
import urllib.request
from typing import Any

sys.path.insert(0, os.getcwd())
for _name, _error in (("ollama", "ResponseError"), ("pydantic", "ValidationError")):
    try:  # imported by inference.backends.ollama, unused by these collectors, and not on the GPU machine
        __import__(_name)
    except ImportError:
        _stub = sys.modules[_name] = types.ModuleType(_name)
        setattr(_stub, _error, type(_error, (Exception,), {}))
from inference.backends import gguf  # noqa: E402
from inference.backends.llamacpp import metrics as llamacpp  # noqa: E402
from monitoring.gpus import nvidia  # noqa: E402

MIB = 1024**2
PORT = 18080
URL = f"http://127.0.0.1:{PORT}"
LOG_LINES = re.compile(r"offload|buffer size|CUDA0|llama_kv_cache: size|memory_breakdown|params_fit|n_ctx_slot")

DRY = bool(os.environ.get("DRY"))


def gpu_rows() -> list[dict[str, Any]]:
    if DRY:
        return [{"memory_used_bytes": 0.0, "utilization_gpu_pct": 0.0}]
    return [reading.as_dict() for reading in nvidia.read()]


def vram_of(pid: int) -> float | None:
    """What the sampler reads for the backend's pid: the memory every GPU attributes to it."""
    held = [] if DRY else [r.process_memory_bytes for r in nvidia.read(pid) if r.process_memory_bytes is not None]
    return sum(held) / MIB if held else None


def complete(body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(URL + "/completion", json.dumps(body).encode(), headers)  # noqa: S310 - loopback
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback
        return dict(json.loads(response.read()))


def wait_healthy(server: subprocess.Popen[bytes], log_path: str) -> None:
    for _ in range(240):
        try:
            with urllib.request.urlopen(URL + "/health", timeout=1) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    with open(log_path, errors="replace") as log:
        raise SystemExit(f"llama-server did not come up; its log:\n{log.read()[-3000:]}")


def check(binary: str, model: str, layers: int) -> None:
    log_path = os.path.join(tempfile.gettempdir(), f"llama-{layers}.log")
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [binary, "-m", model, "--host", "127.0.0.1", "--port", str(PORT), "-ngl", str(layers), "-c", "4096",
             "--parallel", "2", "--metrics", "--slots", "--no-warmup", "-lv", "4"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_healthy(server, log_path)
        idle_gpu, idle_own = gpu_rows()[0]["memory_used_bytes"] / MIB, vram_of(server.pid)
        result: dict[str, Any] = {}
        decode = threading.Thread(
            target=lambda: result.update(
                complete({"prompt": "Once upon a time", "n_predict": 400, "temperature": 0, "ignore_eos": True})
            )
        )
        decode.start()
        time.sleep(0.1)
        reading = asyncio.run(llamacpp.collect(URL))
        gpu = gpu_rows()[0]
        during = (gpu["memory_used_bytes"] / MIB, vram_of(server.pid), gpu["utilization_gpu_pct"])
        decode.join()
        timings = result.get("timings", {})
        print(f"\n===== -ngl {layers}")
        print(f"idle: GPU used {idle_gpu:.0f} MiB, llama-server's own (NVML, by pid) {idle_own} MiB")
        print(f"during the decode: GPU used, llama-server's own, utilisation % = {during}")
        print(
            f"decode: {timings.get('predicted_n')} tokens at {timings.get('predicted_per_second', 0):.1f} tok/s;"
            f" prompt {timings.get('prompt_per_second', 0):.1f} tok/s"
        )
        print("collector /slots (id, n_ctx, processing):", [(s.id, s.n_ctx, s.processing) for s in reading.slots])
        print("collector /metrics:", sorted(reading.metrics))
        print("collector /props:", {k: reading.props.get(k) for k in ("total_slots", "model_path", "build_info")})
        print("llama-server's log:")
        with open(log_path, errors="replace") as log:
            for line in [ln for ln in log.read().splitlines() if LOG_LINES.search(ln)][:40]:
                print("   ", line[:220])
    finally:
        server.terminate()
        server.wait(timeout=20)


def main() -> None:
    binary, model = sys.argv[1], sys.argv[2]
    print("RigDash's GGUF reader:", gguf.architecture_from_metadata(gguf.read_metadata(model)))
    for layers in (99, 3, 0):
        check(binary, model, layers)
    print("LLAMA CHECK DONE")


if __name__ == "__main__":
    main()
