"""A llama-server model's context before its server runs it: the slot context its command line sizes
(inference/backends/llamacpp/flags.py ``slot_context``, as the b11434 server sizes it), and the trained context a GGUF
file states (inference/backends/gguf.py ``trained_context``). tests/test_gateway_server_matrix.py checks both against
the real router: the figure before a load equals the server's own once loaded."""

from __future__ import annotations

import pytest

from inference.backends.gguf import trained_context
from inference.backends.llamacpp import flags as server_flags
from tests import tiny_gguf


@pytest.mark.parametrize(
    ("args", "trained", "tokens"),
    [
        (["-c", "2048"], 8192, 2048),  # -np auto: 4 slots over one unified cache, each seeing all of it
        (["--ctx-size", "2048", "--parallel", "2"], 8192, 1024),  # a split cache: each slot its share
        (["-c", "2048", "-np", "2", "--kv-unified"], 8192, 2048),
        (["-c", "2000"], 8192, 2048),  # padded to 256 cells (src/llama-context.cpp)
        (["-c", "3000", "-np", "3"], None, 1024),  # 3072 cells in all, 1024 a slot after padding
        (["-c", "4096"], 2048, 2048),  # never more than the model was trained with (n_ctx_slot)
        (["-c", "4096"], None, 4096),  # the file is not readable here: the command line's figure
        ([], 8192, 8192),  # no -c: the trained context
        (["-c", "0"], 8192, 8192),
        ([], None, None),  # no -c and no readable file: unknown, never guessed
        (["--kv-unified-per-slot", "1024", "-np", "2"], 8192, 1024),  # no -c: a pool of 2 x 1024
        (["-c", "8192", "--kv-unified-per-slot", "1024"], 8192, 1024),
    ],
)
def test_slot_context_from_the_command_line(args: list[str], trained: int | None, tokens: int | None) -> None:
    assert server_flags.slot_context(server_flags.parse(["llama-server", *args]), trained) == tokens


def test_trained_context_is_read_from_the_gguf_header(tmp_path) -> None:
    meta, tensors = tiny_gguf.llama_gqa(layers=2, kv_heads=1)
    path = tiny_gguf.write_gguf(tmp_path / "tiny.gguf", {**meta, "llama.context_length": 4096}, tensors)
    assert trained_context(path) == 4096
    assert trained_context(tmp_path / "missing.gguf") is None
    (tmp_path / "not.gguf").write_bytes(b"GGML" + bytes(64))
    assert trained_context(tmp_path / "not.gguf") is None
    other, tensors = tiny_gguf.llama_gqa(layers=2, kv_heads=1)
    del other["llama.context_length"]
    assert trained_context(tiny_gguf.write_gguf(tmp_path / "silent.gguf", other, tensors)) is None
