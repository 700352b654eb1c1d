"""KV-cache arithmetic against what llama.cpp itself allocates for the same model, context and cache type."""

from __future__ import annotations

import asyncio
import re

import pytest

from inference.backends.base import ModelArchitecture
from inference.backends.llamacpp import LlamaCppBackend
from monitoring import decode
from tests.conftest import LOG_DIR, Stack, free_port, llama_server_command, wait_http

pytestmark = pytest.mark.llama


@pytest.mark.parametrize(("cache_type", "ctx"), [("f16", 4096), ("q8_0", 2048)])
def test_kv_bytes_match_the_kv_buffer_llama_server_logs(cache_type, ctx):
    port = free_port()
    log_path = LOG_DIR / f"llama-kv-{cache_type}.log"
    log_path.unlink(missing_ok=True)
    stack = Stack()
    extra = ["-lv", "4", "-ctk", cache_type, "-ctv", cache_type]
    if cache_type != "f16":
        extra += ["-fa", "on"]  # a quantised V cache needs flash attention
    proc = stack.start("llama-kv", llama_server_command(port=port, slots=1, ctx=ctx, extra=extra), log_path=log_path)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", timeout_s=60, proc=proc)
        arch = asyncio.run(LlamaCppBackend(url).model_architecture(""))
    finally:
        stack.stop()
    logged = re.search(r"KV buffer size\s*=\s*([\d.]+) MiB", log_path.read_text())
    assert logged, "llama-server did not log its KV buffer size"
    computed_mib = decode.kv_bytes_per_token(arch, cache_type) * ctx / 2**20
    assert computed_mib == pytest.approx(float(logged.group(1)), abs=0.01)


def test_smollm2_geometry_from_its_gguf_file(llama_url):
    arch = asyncio.run(LlamaCppBackend(llama_url).model_architecture(""))
    assert (arch.arch, arch.block_count, arch.head_count, arch.head_count_kv, arch.embedding_length) == (
        "llama", 30, 9, 3, 576,
    )  # fmt: skip
    assert decode.kv_bytes_per_token(arch) == 23_040  # 2 x 30 x 3 x 64 x 2


def test_kv_arithmetic_uses_key_length_when_given_and_refuses_unknown_types():
    arch = ModelArchitecture(arch="x", block_count=2, head_count=4, head_count_kv=2, embedding_length=512,
                             key_length=192, value_length=128)  # fmt: skip
    assert decode.kv_bytes_per_token(arch, "f16") == 2 * 2 * (192 + 128) * 2
    assert decode.kv_bytes_per_token(arch, "q4_0") == 2 * 2 * (192 + 128) * 18 / 32
    with pytest.raises(ValueError, match="unknown KV cache type"):
        decode.kv_bytes_per_token(arch, "q3_k")


def test_percentiles_and_rates():
    assert decode.percentile([], 50) is None
    assert decode.percentile([5.0], 99) == 5.0
    assert decode.percentile([1, 2, 3, 4], 50) == 2.5
    assert decode.percentile(list(range(101)), 95) == 95
    assert decode.rate_from_counters(10, 40, 2.0) == 15
    assert decode.rate_from_counters(40, 10, 2.0) is None  # the counter went back: a restart
    assert decode.decode_bound_tps(bandwidth_bytes_s=30e9, weight_bytes=100e6) == pytest.approx(300)
