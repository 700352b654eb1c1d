"""Read a GGUF file's metadata (not its tensors): enough to know a model's KV-cache geometry.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md — magic "GGUF", version (u32),
tensor count (u64), metadata count (u64), then key (string) / value-type (u32) / value entries.
"""

from __future__ import annotations

import functools
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

from inference.backends.base import ModelArchitecture, positive_int
from inference.backends.kv_layers import layers_from_metadata

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise ValueError("truncated GGUF file")
    return struct.unpack(fmt, data)[0]


def _string(fh: BinaryIO) -> str:
    return bytes(fh.read(_read(fh, "<Q"))).decode("utf-8", "replace")


def _value(fh: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _read(fh, _SCALARS[kind])
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        item_kind, count = _read(fh, "<I"), _read(fh, "<Q")
        if not keep and item_kind in _SCALARS:  # skip big arrays (the tokenizer's) without parsing
            fh.seek(count * struct.calcsize(_SCALARS[item_kind]), 1)
            return None
        items = [_value(fh, item_kind, keep) for _ in range(count)]
        return items if keep else None
    raise ValueError(f"unknown GGUF value type {kind}")


def read_metadata(path: str | Path, *, prefixes: tuple[str, ...] = ("general.", "")) -> dict[str, Any]:
    """Scalar and string metadata of a GGUF file, and the arrays of numbers or booleans under the model's own keys
    (per-layer lists such as ``attention.head_count_kv``); other arrays (the tokenizer's) are skipped."""
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = _read(fh, "<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        _read(fh, "<Q")  # tensor count
        metadata: dict[str, Any] = {}
        for _ in range(_read(fh, "<Q")):
            key = _string(fh)
            kind = _read(fh, "<I")
            value = _value(fh, kind, keep=not key.startswith("tokenizer."))
            if value is not None:
                metadata[key] = value
        return metadata


def trained_context(path: str | Path) -> int | None:
    """The context a GGUF model was trained with (``<arch>.context_length``), or None where the file is not readable
    here or does not say. Kept per file version (path, size, mtime): a router's listing asks again every sample."""
    try:
        stat = os.stat(path)
        return _trained_context(str(path), stat.st_size, stat.st_mtime_ns)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


@functools.lru_cache(maxsize=256)
def _trained_context(path: str, size: int, mtime_ns: int) -> int | None:
    """Reads the metadata up to the key it needs: the architecture comes first in every GGUF writer's order, the
    tokenizer's large arrays last."""
    found: dict[str, Any] = {}
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF" or _read(fh, "<I") < 2:
            return None
        _read(fh, "<Q")  # tensor count
        for _ in range(_read(fh, "<Q")):
            key = _string(fh)
            value = _value(fh, _read(fh, "<I"), keep=False)
            if key == "general.architecture" or key.endswith(".context_length"):
                found[key] = value
            arch = found.get("general.architecture")
            if arch is not None and f"{arch}.context_length" in found:
                break
    value = found.get(f"{found.get('general.architecture')}.context_length")
    return positive_int(value)


def architecture_from_metadata(meta: dict[str, Any]) -> ModelArchitecture:
    """The KV-relevant ``<arch>.*`` keys (the same names Ollama's /api/show model_info uses), with the cache per
    layer (inference/backends/kv_layers.py). Per-layer lists give the largest value to the summary fields."""
    arch = str(meta["general.architecture"])

    def get(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    def most(value: Any) -> int:
        if isinstance(value, list):
            return max((int(v) for v in value), default=0)
        return int(value or 0)  # a recurrent-only model states no attention heads

    layers = layers_from_metadata(meta)
    head_count = most(get("attention.head_count"))
    return ModelArchitecture(
        arch=arch,
        block_count=int(get("block_count")),
        head_count=head_count,
        head_count_kv=max((layer.kv_heads for layer in layers), default=0),
        embedding_length=int(get("embedding_length")),
        context_length=int(get("context_length")) if get("context_length") else None,
        key_length=int(get("attention.key_length")) if get("attention.key_length") else None,
        value_length=int(get("attention.value_length")) if get("attention.value_length") else None,
        layers=layers,
    )
