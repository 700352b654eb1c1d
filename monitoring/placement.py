"""Where a rig's weights live and which memory bandwidth its decode runs at: pure rules over GPU readings.

Per memory kind (docs/monitoring.md, "Where the weights are"):
- discrete GPUs: the memory their tools attribute to the backend's process bounds the split: less than the weights
  means some weights are in system RAM (spilled), which decode then reads at system RAM's speed;
- unified memory (Apple Silicon, AMD APUs, Intel iGPUs): the GPU reads the same RAM as the CPU, so nothing spills;
- no GPU: weights and KV cache in system RAM.
The roofline's bandwidth comes from the GPUs that hold the process's memory. A model split by layers across GPUs
(llama.cpp's and Ollama's default) passes each token through every GPU in turn, so their times add: the effective
bandwidth is the bytes held over the sum of each GPU's bytes / bandwidth.
"""

from __future__ import annotations

from typing import Any

GIB = 1024**3
TOOLS = {"nvidia": "NVML", "amd": "amdsmi", "apple": "macOS", "intel": "xpu-smi"}


def gpu_tool(gpus: list[dict[str, Any]]) -> str:
    """The vendor tools that read these GPUs, for messages ("NVML attributes no VRAM to its process")."""
    return " / ".join(dict.fromkeys(TOOLS.get(g.get("vendor", ""), g.get("vendor", "the GPU tool")) for g in gpus))


def process_gpu_bytes(gpus: list[dict[str, Any]]) -> float | None:
    """The memory every GPU together holds for the backend's process; None where no GPU attributes any to it."""
    held = [g["process_memory_bytes"] for g in gpus if g.get("process_memory_bytes") is not None]
    return float(sum(held)) if held else None


def all_unified(gpus: list[dict[str, Any]]) -> bool:
    return bool(gpus) and all(g.get("unified") for g in gpus)


def unified_placement(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    names = ", ".join(dict.fromkeys(str(g.get("name", "GPU")) for g in gpus))
    return {
        "vram_fraction": None,
        "spill": False,
        "memory_kind": "unified",
        "label": f"Unified memory ({names}): the GPU reads the same RAM as the CPU, so the weights never spill",
    }


def process_placement(
    gpus: list[dict[str, Any]], *, weight_bytes: float | None, server: str, label: str, why_unseen: str
) -> dict[str, Any]:
    """Where a backend's weights are, bounded by the GPU memory attributed to its process (discrete GPUs)."""
    unknown: dict[str, Any] = {"vram_fraction": None, "spill": None, "memory_kind": "discrete"}
    vram = process_gpu_bytes(gpus)
    if vram is None:
        why = why_unseen or f"{gpu_tool(gpus)} attributes no VRAM to its process"
        return {**unknown, "label": f"GPU present: layer split not reported by {server} ({why})", "why": why}
    split = _split(gpus)
    if weight_bytes and vram < weight_bytes:
        return {
            **unknown,
            "spill": True,
            "label": f"{label}: its process holds {vram / GIB:.2f} GiB of VRAM{split}, less than the"
            f" {weight_bytes / GIB:.2f} GiB of weights: at least {(weight_bytes - vram) / GIB:.2f} GiB of them in"
            " system RAM",
        }
    of_weights = f" for {weight_bytes / GIB:.2f} GiB of weights" if weight_bytes else ""
    return {
        **unknown,
        "label": f"{label}: its process holds {vram / GIB:.2f} GiB of VRAM{split}{of_weights} ({_runtime(gpus)}"
        " context included; the layer split is not reported)",
    }


def _runtime(gpus: list[dict[str, Any]]) -> str:
    """The GPU runtime whose context a process's GPU memory includes."""
    vendors = {str(g.get("vendor", "")) for g in gpus}
    return {"nvidia": "CUDA", "amd": "HIP"}.get(vendors.pop(), "GPU") if len(vendors) == 1 else "GPU"


def _split(gpus: list[dict[str, Any]]) -> str:
    holding = [g for g in gpus if g.get("process_memory_bytes")]
    if len(holding) < 2:
        return ""
    return " (" + ", ".join(f"GPU {g['index']}: {g['process_memory_bytes'] / GIB:.2f} GiB" for g in holding) + ")"


def gpu_bandwidth(gpus: list[dict[str, Any]], *, weights_on_gpu: bool) -> dict[str, Any] | None:
    """The bandwidth decode runs at on the GPUs that hold the backend's memory (weighted as their times add), or
    None where no GPU with a known peak holds it. ``weights_on_gpu``: the backend says its weights are mostly in
    VRAM but no GPU attributes memory to its process; each GPU's used memory stands for what it holds then."""
    peaks = [g for g in gpus if g.get("memory_bandwidth_gbs")]
    holding = [(g, float(g["process_memory_bytes"])) for g in peaks if g.get("process_memory_bytes")]
    if not holding and weights_on_gpu:
        holding = [(g, float(g.get("memory_used_bytes") or 0.0)) for g in peaks]
        holding = [(g, held) for g, held in holding if held > 0] or [(g, 1.0) for g in peaks[:1]]
    if not holding:
        return None
    if len(holding) == 1:
        gpu = holding[0][0]
        source = gpu.get("bandwidth_source") or "its peak"
        return {"gbs": gpu["memory_bandwidth_gbs"], "source": f"{gpu['name']}: {source}"}
    total = sum(held for _, held in holding)
    seconds = sum(held / (float(g["memory_bandwidth_gbs"]) * 1e9) for g, held in holding)
    names = ", ".join(f"GPU {g['index']} {g['name']} {held / total:.0%}" for g, held in holding)
    return {
        "gbs": round(total / seconds / 1e9, 1),
        "source": f"{len(holding)} GPUs by the share of the process's memory each holds ({names}); a layer split"
        " reads them in turn, so their times add",
    }


def power_w(gpus: list[dict[str, Any]]) -> float | None:
    """The power drawn by the GPUs that hold the backend's memory (all GPUs, where none is attributed any); None
    where no GPU reports power."""
    holding = [g for g in gpus if g.get("process_memory_bytes")] or gpus
    watts = [float(g["power_w"]) for g in holding if g.get("power_w") is not None]
    return sum(watts) if watts else None
