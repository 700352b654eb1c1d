"""Presets for the decode calculator: models, accelerators and CPUs, system RAM, links. Each names its source.

A preset only fills the calculator's fields; every figure stays editable. Capacities are GiB (what a GPU's "24 GB"
means), bandwidths GB/s (10^9 bytes/s, as spec sheets give them), compute dense FP16 tensor TFLOP/s for GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.backends.base import ModelArchitecture
from inference.backends.kv_layers import layers_from_metadata


@dataclass(frozen=True)
class ModelPreset:
    label: str
    arch: ModelArchitecture
    params: int
    source: str

    def fields(self) -> dict[str, Any]:
        head_dim = self.arch.key_length or self.arch.embedding_length // self.arch.head_count
        layers = self.arch.layers
        windows = {layer.window for layer in layers if layer.kv_heads and layer.window}
        states = {layer.state_bytes for layer in layers if not layer.kv_heads and layer.state_bytes}
        return {
            "layers": self.arch.block_count,
            "heads": self.arch.head_count,
            "kv_heads": self.arch.head_count_kv,
            "embd": self.arch.embedding_length,
            "head_dim": head_dim,
            "sliding_layers": sum(1 for layer in layers if layer.kv_heads and layer.window) or None,
            "window": max(windows, default=None),
            "recurrent_layers": sum(1 for layer in layers if not layer.kv_heads) or None,
            "state_mib": round(max(states) / 2**20, 6) if states else None,
            "params_b": self.params / 1e9,
            "weight_gib": None,
        }


@dataclass(frozen=True)
class DevicePreset:
    """The fast tier: a GPU's VRAM, a CPU's RAM, or unified memory. ``host`` is the slow-tier preset that goes
    with it by default ("none": nothing to spill to)."""

    label: str
    kind: str
    capacity_gib: float
    bandwidth_gbs: float
    tflops: float
    power_w: float
    source: str
    host: str = "ddr5-2ch"
    reserved_gib: float = 0.0

    def fields(self) -> dict[str, Any]:
        return {
            "vram_gib": self.capacity_gib,
            "vram_gbs": self.bandwidth_gbs,
            "tflops": self.tflops,
            "watts": self.power_w,
            "reserved_gib": self.reserved_gib,
        }


@dataclass(frozen=True)
class HostPreset:
    label: str
    capacity_gib: float
    bandwidth_gbs: float
    source: str

    def fields(self) -> dict[str, Any]:
        return {"ram_gib": self.capacity_gib, "ram_gbs": self.bandwidth_gbs}


@dataclass(frozen=True)
class LinkPreset:
    label: str
    bandwidth_gbs: float
    source: str

    def fields(self) -> dict[str, Any]:
        return {"link_gbs": self.bandwidth_gbs}


def _arch(
    layers: int, heads: int, kv_heads: int, embd: int, ctx: int, head_dim: int | None = None
) -> ModelArchitecture:
    return ModelArchitecture(
        arch="llama",
        block_count=layers,
        head_count=heads,
        head_count_kv=kv_heads,
        embedding_length=embd,
        context_length=ctx,
        key_length=head_dim,
        value_length=head_dim,
    )


def _from_gguf_keys(arch: str, ctx: int, **keys: Any) -> ModelArchitecture:
    """A model's geometry as its GGUF states it, each layer's cache by llama.cpp's rules (kv_layers.py)."""
    meta = {"general.architecture": arch, **{f"{arch}.{key}": value for key, value in keys.items()}}
    layers = layers_from_metadata(meta)
    return ModelArchitecture(
        arch=arch,
        block_count=keys["block_count"],
        head_count=keys["attention.head_count"],
        head_count_kv=keys["attention.head_count_kv"],
        embedding_length=keys["embedding_length"],
        context_length=ctx,
        key_length=keys.get("attention.key_length"),
        value_length=keys.get("attention.value_length"),
        layers=layers,
    )


HF = "config.json and parameter count on Hugging Face, "
# google/gemma-3-27b-it config.json (text_config): 62 layers, 32 heads, 16 KV heads of 128, hidden 5376, sliding
# window 1024 in five layers of six (llama.cpp src/models/gemma3.cpp: load_swa_pattern(ml, 6)).
GEMMA3_27B = _from_gguf_keys("gemma3", 131072, **{
    "block_count": 62, "embedding_length": 5376, "attention.head_count": 32, "attention.head_count_kv": 16,
    "attention.key_length": 128, "attention.value_length": 128, "attention.sliding_window": 1024,
})  # fmt: skip
# Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers, one of four full attention (16 heads, 2 KV heads of 256),
# the others Gated DeltaNet (conv kernel 4, 16 key heads of 128, 32 value heads of 128), as convert_hf_to_gguf.py
# writes them: ssm.state_size 128, ssm.group_count 16, ssm.time_step_rank 32, ssm.inner_size 32 x 128.
QWEN3_NEXT_80B = _from_gguf_keys("qwen3next", 262144, **{
    "block_count": 48, "embedding_length": 2048, "attention.head_count": 16, "attention.head_count_kv": 2,
    "attention.key_length": 256, "attention.value_length": 256, "full_attention_interval": 4,
    "ssm.conv_kernel": 4, "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32,
    "ssm.inner_size": 4096,
})  # fmt: skip
MODELS: dict[str, ModelPreset] = {
    "smollm2-135m": ModelPreset(
        "SmolLM2-135M-Instruct",
        _arch(30, 9, 3, 576, 8192),
        134_515_008,
        HF + "HuggingFaceTB/SmolLM2-135M-Instruct (the embedded rig's model)",
    ),
    "llama-2-7b": ModelPreset(
        "Llama 2 7B", _arch(32, 32, 32, 4096, 4096), 6_738_415_616, HF + "meta-llama/Llama-2-7b-hf"
    ),
    "llama-3.1-8b": ModelPreset(
        "Llama 3.1 8B", _arch(32, 32, 8, 4096, 131072), 8_030_261_248, HF + "meta-llama/Llama-3.1-8B"
    ),
    "qwen2.5-7b": ModelPreset("Qwen2.5 7B", _arch(28, 28, 4, 3584, 32768, 128), 7_615_616_512, HF + "Qwen/Qwen2.5-7B"),
    "llama-3.1-70b": ModelPreset(
        "Llama 3.1 70B", _arch(80, 64, 8, 8192, 131072), 70_553_706_496, HF + "meta-llama/Llama-3.1-70B"
    ),
    "gemma-3-27b": ModelPreset(
        "Gemma 3 27B (sliding window)",
        GEMMA3_27B,
        27_400_000_000,
        HF + "google/gemma-3-27b-it (27.4 B with its vision encoder); 52 of 62 layers slide over 1,024 tokens",
    ),
    "qwen3-next-80b": ModelPreset(
        "Qwen3-Next 80B-A3B (hybrid)",
        QWEN3_NEXT_80B,
        80_000_000_000,
        HF + "Qwen/Qwen3-Next-80B-A3B-Instruct (80 B, 3 B active: the calculator reads every weight each step); "
        "12 of 48 layers attend, 36 Gated DeltaNet layers keep a 2.1 MiB state a session",
    ),
}

# A CUDA context and llama.cpp's compute buffers: about half a GiB measured on an H200 (docs/monitoring.md).
CUDA_RESERVED_GIB = 0.6
NV = "NVIDIA spec sheet: "
DEVICES: dict[str, DevicePreset] = {
    "rtx-3090": DevicePreset(
        "NVIDIA RTX 3090",
        "gpu",
        24,
        936,
        71,
        350,
        NV + "GeForce RTX 3090 (936 GB/s GDDR6X, 350 W) and the Ampere GA102 whitepaper "
        "(71 TFLOP/s FP16 tensor, FP32 accumulate, dense)",
        reserved_gib=CUDA_RESERVED_GIB,
    ),
    "rtx-4090": DevicePreset(
        "NVIDIA RTX 4090",
        "gpu",
        24,
        1008,
        165.2,
        450,
        NV + "GeForce RTX 4090 (1,008 GB/s GDDR6X, 450 W) and the Ada Lovelace whitepaper "
        "(165.2 TFLOP/s FP16 tensor, FP32 accumulate, dense)",
        reserved_gib=CUDA_RESERVED_GIB,
    ),
    "a100-80gb": DevicePreset(
        "NVIDIA A100 80GB SXM",
        "gpu",
        80,
        2039,
        312,
        400,
        NV + "A100 datasheet (80 GB HBM2e, 2,039 GB/s, 312 TFLOP/s FP16 tensor dense, 400 W)",
        host="ddr4-8ch",
        reserved_gib=CUDA_RESERVED_GIB,
    ),
    "h100-sxm": DevicePreset(
        "NVIDIA H100 SXM",
        "gpu",
        80,
        3350,
        989.5,
        700,
        NV + "H100 datasheet (80 GB HBM3, 3.35 TB/s, 1,979 TFLOP/s FP16 tensor with sparsity, "
        "half that dense, up to 700 W)",
        host="ddr5-8ch",
        reserved_gib=CUDA_RESERVED_GIB,
    ),
    "h200": DevicePreset(
        "NVIDIA H200 SXM",
        "gpu",
        141,
        4800,
        989.5,
        700,
        NV + "H200 datasheet (141 GB HBM3e, 4.8 TB/s, 1,979 TFLOP/s FP16 tensor with sparsity, "
        "half that dense, up to 700 W)",
        host="ddr5-8ch",
        reserved_gib=CUDA_RESERVED_GIB,
    ),
    "m2-ultra": DevicePreset(
        "Apple M2 Ultra (unified memory)",
        "unified",
        192,
        800,
        27.2,
        370,
        "Apple newsroom, M2 Ultra (up to 192 GB unified memory at 800 GB/s); Mac Studio (2023) "
        "tech specs (370 W maximum continuous power); 27.2 TFLOP/s FP32 for the 76-core GPU is a "
        "third-party figure (76 cores x 128 ALUs x 2 x 1.398 GHz), Apple publishes none",
        host="none",
    ),
    "epyc-9654": DevicePreset(
        "AMD EPYC 9654 (CPU only)",
        "cpu",
        768,
        460.8,
        7.4,
        360,
        "AMD EPYC 9654 product page (12 channels DDR5-4800: 460.8 GB/s per socket, 360 W TDP); "
        "FP32 compute derived: 96 cores x 2.4 GHz x 32 FLOPs a cycle",
        host="none",
    ),
    "xeon-8480": DevicePreset(
        "Intel Xeon Platinum 8480+ (CPU only)",
        "cpu",
        512,
        307.2,
        7.2,
        350,
        "Intel ARK, Xeon Platinum 8480+ (8 channels DDR5-4800: 307.2 GB/s, 350 W TDP); FP32 "
        "compute derived: 56 cores x 2.0 GHz x 64 FLOPs a cycle (AVX-512, AMX not counted)",
        host="none",
    ),
    "ryzen-7950x": DevicePreset(
        "AMD Ryzen 9 7950X (CPU only)",
        "cpu",
        64,
        83.2,
        2.3,
        170,
        "AMD Ryzen 9 7950X product page (2 channels DDR5-5200: 83.2 GB/s, 170 W TDP); FP32 "
        "compute derived: 16 cores x 4.5 GHz x 32 FLOPs a cycle",
        host="none",
    ),
}

JEDEC = "JEDEC data rate x 8 bytes a channel x channels"
HOSTS: dict[str, HostPreset] = {
    "none": HostPreset("none (nothing to spill to)", 0, 0, "a CPU-only or unified-memory machine"),
    "ddr4-2ch": HostPreset("DDR4-3200, 2 channels, 64 GiB", 64, 51.2, JEDEC),
    "ddr5-2ch": HostPreset("DDR5-5600, 2 channels, 64 GiB", 64, 89.6, JEDEC),
    "ddr4-8ch": HostPreset("DDR4-3200, 8 channels, 512 GiB", 512, 204.8, JEDEC),
    "ddr5-8ch": HostPreset("DDR5-4800, 8 channels, 1 TiB", 1024, 307.2, JEDEC),
}

PCIE = "PCI-SIG: per direction, x16, 128b/130b encoding"
LINKS: dict[str, LinkPreset] = {
    "pcie3-x16": LinkPreset("PCIe 3.0 x16", 15.75, PCIE + " at 8 GT/s"),
    "pcie4-x16": LinkPreset("PCIe 4.0 x16", 31.5, PCIE + " at 16 GT/s"),
    "pcie5-x16": LinkPreset("PCIe 5.0 x16", 63.0, PCIE + " at 32 GT/s"),
    "nvlink-c2c": LinkPreset("NVLink-C2C (Grace Hopper)", 450.0, NV + "GH200 (900 GB/s both directions)"),
}


def as_json() -> dict[str, Any]:
    """Every preset's fields, label and source, for the page's script."""

    def group(presets: dict[str, Any]) -> dict[str, Any]:
        return {
            key: {
                "label": p.label,
                "source": p.source,
                "fields": p.fields(),
                **({"host": p.host} if isinstance(p, DevicePreset) else {}),
            }
            for key, p in presets.items()
        }

    return {"model": group(MODELS), "hw": group(DEVICES), "host": group(HOSTS), "link": group(LINKS)}
