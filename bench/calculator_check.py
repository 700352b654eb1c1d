"""The decode calculator's prediction against the embedded llama-server on this machine.

    python -m bench.calculator_check [--tokens 128] [--repeats 2]

Starts llama-server (scripts/build-llama-server's binary and model, 2 slots of 2,048 tokens), measures this host's
memory bandwidth with the sampler's probe, then decodes a reply alone and two at once, and prints llama-server's own
decode rate beside the calculator's bound for the same model, context and sessions. Needs LLAMA_SERVER_BIN and
LLAMA_MODEL_PATH (scripts/test and scripts/run export them).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from rigdash.launcher import Stack, free_port, llama_server_command, wait_http

SMOLLM2_PARAMS = 134_515_008
PROMPT = "Write a long story about a lighthouse keeper and a storm."


def _decode(url: str, tokens: int) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    timings: dict[str, Any] = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()["timings"]
    return timings


def _measure(url: str, *, sessions: int, tokens: int, repeats: int) -> tuple[float, float]:
    """Median decode tokens/s per session (llama-server's timings) and mean context while decoding."""
    rates, contexts = [], []
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        for _ in range(repeats):
            for timings in pool.map(lambda _: _decode(url, tokens), range(sessions)):
                rates.append(float(timings["predicted_per_second"]))
                contexts.append(timings["prompt_n"] + timings.get("cache_n", 0) + timings["predicted_n"] / 2)
    return statistics.median(rates), statistics.mean(contexts)


def main() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")
    django.setup()
    from inference.backends.gguf import architecture_from_metadata, read_metadata
    from monitoring.calculator import model as calc
    from monitoring.services import bandwidth_probe_gbs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still stops llama-server (finally)
    model_path = os.environ["LLAMA_MODEL_PATH"]
    arch = architecture_from_metadata(read_metadata(model_path))
    stack = Stack()
    port = free_port()
    log = Path(tempfile.gettempdir()) / "calculator-check-llama-server.log"
    proc = stack.start("llama-server", llama_server_command(port=port, slots=2, ctx=4096), log_path=log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", timeout_s=120, proc=proc)
        weight_bytes = float(httpx.get(f"{url}/v1/models").json()["data"][0]["meta"]["size"])
        bandwidth = bandwidth_probe_gbs()
        hw = calc.Hardware(fast=calc.Tier(64 * 2**30, bandwidth * 1e9))
        per_token = calc.kv_bytes_per_token(arch, "f16")
        print(f"bandwidth probe {bandwidth} GB/s; weights {weight_bytes / 2**20:.1f} MiB; KV {per_token:.0f} B/token")
        print("sessions  context  measured tok/s/session  bound tok/s/session  measured/bound")
        for sessions in (1, 2):
            measured, context = _measure(url, sessions=sessions, tokens=args.tokens, repeats=args.repeats)
            rate = calc.decode_rate(weight_bytes=weight_bytes, kv_per_token=per_token, hw=hw, context_tokens=2048,
                                    sessions=sessions, context_in_use=round(context))  # fmt: skip
            assert rate is not None
            print(f"{sessions:8d} {context:8.0f} {measured:23.1f} {rate.per_session_tps:20.1f}"
                  f" {measured / rate.per_session_tps:15.2f}")  # fmt: skip
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
