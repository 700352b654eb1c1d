"""AMD GPUs (ROCm): the ``amdsmi`` Python library where it imports, else ``amd-smi ... --json``, else
``rocm-smi --json``.

Every parser here is pure (the library's dicts or the tools' JSON in, ``GpuReading`` out) so it is tested against the
tools' recorded outputs (tests/data/gpus/README.md); ``read()`` alone touches the host. Units, as the tools give them:

- amd-smi JSON wraps a figure as ``{"value": 196592, "unit": "MB"}`` (ROCm 6.1 added the units; before it, and in
  some fields still, a bare number) and says ``"N/A"`` for what it cannot read. Its "MB" is MiB: the CLI computes
  ``bytes // (1024*1024)`` and labels it "MB" (ROCm/amdsmi amdsmi_cli/amdsmi_commands.py, ``mem_usage``). Newer
  releases (ROCm 6.4+) put the per-GPU list under ``{"gpu_data": [...]}``; older ones print the list itself.
- rocm-smi JSON gives every figure as a string: bytes for memory (``"VRAM Total Memory (B)": "21458059264"``), watts,
  °C and percent in the key's name.
- the amdsmi library gives memory totals/usage in bytes, ``amdsmi_get_gpu_vram_usage`` in MB (MiB), power in W,
  temperature in °C (its README says millidegrees; the CLI prints the same number as °C, so a figure over 1000 is
  read as millidegrees).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from monitoring.collectors import Unavailable
from monitoring.gpus.reading import GpuReading, peak_bandwidth_gbs

VENDOR = "amd"
RETRY_AFTER_S = 60.0  # a tool that is not there now is not there a second later: look again once a minute
TIMEOUT_S = 2.0
_failed: tuple[float, str] | None = None  # when every AMD reader last failed, and why
_library_started = False

MIB = 1024 * 1024
_BYTES_PER_UNIT = {"B": 1, "KB": 1024, "KIB": 1024, "MB": MIB, "MIB": MIB, "GB": 1024**3, "GIB": 1024**3}
_WATTS_PER_UNIT = {"W": 1.0, "MW": 1e-3, "UW": 1e-6, "µW": 1e-6}
# What amd-smi and the library print where a sensor does not answer: "N/A", or the all-ones of the field's width
# (rocm-systems#5036: vram_max_bandwidth reads 18446744073709551615). No percent, °C or watt figure reaches 65535.
_SENTINEL_FLOOR = 0xFFFF

# Memory types an APU's carve-out is reported as: the host's own DRAM. A discrete card reports GDDRx or HBMx.
_SYSTEM_MEMORY_TYPES = re.compile(r"^(LP)?DDR\d*$")
# Transfers per reported memory clock, per memory type: the factor that turns amd-smi's max memory clock x bus width
# into the published peak (MI250X HBM2e 1600 MHz x 2 x 8192 bit = 3.2 TB/s; MI300X HBM3 1300 MHz x 4 x 8192 bit =
# 5.3 TB/s; RX 7900 XTX GDDR6 1250 MHz x 16 x 384 bit = 960 GB/s). Other types: no figure rather than a wrong one.
_TRANSFERS_PER_CLOCK = {"HBM2": 2, "HBM2E": 2, "HBM3": 4, "HBM3E": 4, "GDDR6": 16}


# --- units ------------------------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """A bare figure: a number, a numeric string, or the ``value`` of amd-smi's ``{"value", "unit"}``; None for
    "N/A", an empty string, or anything else the tool prints where it has no figure."""
    if isinstance(value, Mapping):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*\(?(-?\d+(?:\.\d+)?)\s*[A-Za-z%°µ/]*\)?\s*", value)
        return float(match.group(1)) if match else None
    return None


def _unit(value: Any, default: str) -> str:
    unit = value.get("unit") if isinstance(value, Mapping) else None
    return str(unit).strip() if unit else default


def _bytes(value: Any, default_unit: str = "B") -> float | None:
    """Bytes from a figure in B/KB/MB/GB (1024-based, as amd-smi computes them)."""
    number = _number(value)
    if number is None:
        return None
    factor = _BYTES_PER_UNIT.get(_unit(value, default_unit).upper())
    return number * factor if factor is not None else None


def _watts(value: Any, default_unit: str = "W") -> float | None:
    """Watts from a figure in W, mW or uW (the library's older power fields are microwatts)."""
    number = _number(value)
    unit = _unit(value, default_unit)
    factor = _WATTS_PER_UNIT.get(unit) or _WATTS_PER_UNIT.get(unit.upper())
    if number is None or factor is None or number * factor >= _SENTINEL_FLOOR:
        return None
    return number * factor


def _small(value: Any) -> float | None:
    """A percent or a temperature: None where the tool printed N/A or an all-ones sentinel."""
    number = _number(value)
    return None if number is None or number >= _SENTINEL_FLOOR else number


def _celsius(value: Any) -> float | None:
    number = _number(value)
    if number is None or number >= _SENTINEL_FLOOR * 1000:
        return None
    return number / 1000.0 if number > 1000 else number  # the library's README says millidegrees; the CLI says °C


def _first(*values: float | None) -> float | None:
    return next((value for value in values if value is not None), None)


# --- memory policy ----------------------------------------------------------------------------------------------


def is_unified(*, vram_type: str | None, vram_total: float | None, gtt_total: float | None) -> bool:
    """Whether the device is an APU sharing the host's memory. Signals, strongest first: the VRAM type amd-smi reports
    is the host's DRAM (DDRx/LPDDRx; a discrete card says GDDRx or HBMx); else the VRAM is a small carve-out (at most
    2 GiB) with a larger GTT pool, the layout amd-smi itself treats as an APU (ROCm/rocm-systems#1967: 512 MB VRAM,
    13649 MB GTT on a Radeon 780M-class APU)."""
    if vram_type and _SYSTEM_MEMORY_TYPES.match(vram_type.strip().upper()):
        return True
    return bool(vram_total and gtt_total and vram_total <= 2 * 1024**3 and gtt_total > vram_total)


def _memory(
    unified: bool, vram: tuple[float | None, float | None], gtt: tuple[float | None, float | None]
) -> tuple[float | None, float | None]:
    """Total and used bytes. A discrete card: its VRAM. An APU: the larger of its two pools, the one the kernel
    allocates from (kernel commit 759e764f7d58) and the one amd-smi shows since ROCm/rocm-systems#1967."""
    if unified and gtt[0] and (not vram[0] or gtt[0] > vram[0]):
        return gtt
    return vram


def _peak_bandwidth(
    vram_type: str | None, memory_clock_max_mhz: float | None, bus_width_bits: float | None, via: str
) -> tuple[float | None, str]:
    transfers = _TRANSFERS_PER_CLOCK.get((vram_type or "").strip().upper())
    if transfers is None:
        return None, ""
    peak = peak_bandwidth_gbs(
        memory_clock_mhz=memory_clock_max_mhz, bus_width_bits=bus_width_bits, transfers_per_clock=transfers
    )
    if peak is None:
        return None, ""
    return peak, f"max memory clock x bus width x {transfers} transfers/clock for {vram_type.upper()} ({via})"  # type: ignore[union-attr]


# --- amd-smi CLI JSON -------------------------------------------------------------------------------------------


def _per_gpu(document: Any) -> dict[int, Mapping[str, Any]]:
    """amd-smi's per-GPU entries by GPU index: a list (ROCm 6.0-6.3) or ``{"gpu_data": [...]}`` (ROCm 6.4+)."""
    if isinstance(document, Mapping):
        document = document.get("gpu_data", [])
    entries: dict[int, Mapping[str, Any]] = {}
    for entry in document or []:
        if isinstance(entry, Mapping) and _number(entry.get("gpu")) is not None:
            entries[int(_number(entry.get("gpu")) or 0)] = entry
    return entries


def _section(entry: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    value = entry.get(name) if entry else None
    return value if isinstance(value, Mapping) else {}


def amd_smi_process_memory(processes: Any, pid: int | None) -> dict[int, float]:
    """Bytes each GPU holds for ``pid``, from ``amd-smi process --json``: ``memory_usage.vram_mem`` where the tool
    gives it, else ``mem_usage`` (both ``{"value", "unit": "B"}``). GPUs that list no such pid are left out."""
    found: dict[int, float] = {}
    if pid is None:
        return found
    for index, entry in _per_gpu(processes).items():
        listed = entry.get("process_list")
        for item in listed if isinstance(listed, list) else []:
            info = item.get("process_info", item) if isinstance(item, Mapping) else None
            if not isinstance(info, Mapping) or _number(info.get("pid")) != pid:
                continue
            usage = info.get("memory_usage")
            vram = _bytes(usage.get("vram_mem")) if isinstance(usage, Mapping) else None
            held = _first(vram, _bytes(info.get("mem_usage")), _bytes(info.get("mem")))
            if held is not None:
                found[index] = found.get(index, 0.0) + held
    return found


def parse_amd_smi(metric: Any, static: Any = None, processes: Any = None, pid: int | None = None) -> list[GpuReading]:
    """Readings from ``amd-smi metric --json`` (with ``static --json`` for the name, PCI address and VRAM type, and
    ``process --json`` for ``pid``'s memory). A GPU in ``static`` alone still gets a reading, its figures None."""
    metrics, statics = _per_gpu(metric), _per_gpu(static)
    held = amd_smi_process_memory(processes, pid)
    readings = []
    for index in sorted(set(metrics) | set(statics)):
        entry, fixed = metrics.get(index), statics.get(index)
        usage, power, temperature = _section(entry, "usage"), _section(entry, "power"), _section(entry, "temperature")
        memory, vram_info = _section(entry, "mem_usage"), _section(fixed, "vram")
        vram_type = vram_info.get("type") if isinstance(vram_info.get("type"), str) else None
        vram = (_bytes(memory.get("total_vram"), "MB"), _bytes(memory.get("used_vram"), "MB"))
        if vram[0] is None:  # a metric without mem_usage: the size static knows
            vram = (_bytes(vram_info.get("size"), "MB"), vram[1])
        gtt = (_bytes(memory.get("total_gtt"), "MB"), _bytes(memory.get("used_gtt"), "MB"))
        unified = is_unified(vram_type=vram_type, vram_total=vram[0], gtt_total=gtt[0])
        total, used = _memory(unified, vram, gtt)
        clock = _section(_section(entry, "clock"), "mem_0") or _section(_section(fixed, "clock"), "mem")
        bandwidth, source = _peak_bandwidth(
            vram_type, _number(clock.get("max_clk")), _number(vram_info.get("bit_width")), "amd-smi"
        )
        asic, board, bus = _section(fixed, "asic"), _section(fixed, "board"), _section(fixed, "bus")
        name = asic.get("market_name") or board.get("product_name") or f"AMD GPU {index}"
        readings.append(
            GpuReading(
                vendor=VENDOR,
                index=index,
                name=str(name),
                memory_total_bytes=total,
                memory_used_bytes=used,
                utilization_pct=_small(usage.get("gfx_activity")),
                utilization_memory_pct=_small(usage.get("umc_activity")),
                power_w=_first(_watts(power.get("socket_power")), _watts(power.get("average_socket_power"))),
                temperature_c=_first(_celsius(temperature.get("hotspot")), _celsius(temperature.get("edge"))),
                memory_bandwidth_gbs=bandwidth,
                bandwidth_source=source,
                unified=unified,
                process_memory_bytes=held.get(index),
                device_id=str(bus.get("bdf") or ""),
            )
        )
    return readings


# --- rocm-smi JSON ----------------------------------------------------------------------------------------------

_CARD = re.compile(r"^card(\d+)$")


def _key(fields: Mapping[str, Any], *names: str) -> Any:
    """The first of ``names`` present, case-insensitively (rocm-smi renamed "Card series" to "Card Series")."""
    lowered = {str(key).lower(): value for key, value in fields.items()}
    return next((lowered[name.lower()] for name in names if name.lower() in lowered), None)


def parse_rocm_smi(document: Mapping[str, Any]) -> list[GpuReading]:
    """Readings from ``rocm-smi --showmeminfo vram gtt --showuse --showmemuse --showpower --showtemp
    --showproductname --showbus --json``: one ``cardN`` object per GPU, every figure a string, bytes for memory.
    rocm-smi cannot attribute memory to one process per GPU, so ``process_memory_bytes`` stays None."""
    readings = []
    for card, fields in sorted(document.items(), key=lambda item: str(item[0])):
        match = _CARD.match(str(card))
        if not match or not isinstance(fields, Mapping):
            continue  # "system" and the like: not a GPU
        index = int(match.group(1))
        vram = (
            _number(_key(fields, "VRAM Total Memory (B)")),
            _number(_key(fields, "VRAM Total Used Memory (B)")),
        )
        gtt = (_number(_key(fields, "GTT Total Memory (B)")), _number(_key(fields, "GTT Total Used Memory (B)")))
        unified = is_unified(vram_type=None, vram_total=vram[0], gtt_total=gtt[0])
        total, used = _memory(unified, vram, gtt)
        power = _first(
            *(
                _watts(_key(fields, name))
                for name in (
                    "Current Socket Graphics Package Power (W)",
                    "Average Graphics Package Power (W)",
                    "Socket Graphics Package Power (W)",
                )
            )
        )
        temperature = _first(
            *(
                _celsius(_key(fields, name))
                for name in ("Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)")
            )
        )
        name = _key(fields, "Card Series", "Device Name", "Card Model") or f"AMD GPU {index}"
        readings.append(
            GpuReading(
                vendor=VENDOR,
                index=index,
                name=str(name),
                memory_total_bytes=total,
                memory_used_bytes=used,
                utilization_pct=_small(_key(fields, "GPU use (%)")),
                # "GPU memory use (%)" is the memory controller's busy percent (mem_busy_percent), not VRAM filled
                utilization_memory_pct=_small(_key(fields, "GPU memory use (%)", "GPU Memory Read/Write Activity (%)")),
                power_w=power,
                temperature_c=temperature,
                unified=unified,
                device_id=str(_key(fields, "PCI Bus") or ""),
            )
        )
    return readings


# --- the amdsmi library -----------------------------------------------------------------------------------------


def _call(function: Callable[..., Any] | None, *args: Any) -> Any:
    """The library's answer, or None where this GPU or this amdsmi version does not support the call."""
    if function is None:
        return None
    try:
        return function(*args)
    except Exception:  # amdsmi raises AmdSmiLibraryException (and friends) per unsupported metric
        return None


def _enum_name(library: Any, enum: str, value: Any) -> str | None:
    """The name of an amdsmi enum value (``vram_type`` 23 -> "HBM3"), stripped of its prefix."""
    if isinstance(value, str):
        return value
    names = getattr(getattr(library, "amdsmi_wrapper", None), f"{enum}__enumvalues", None)
    name = names.get(value) if isinstance(names, Mapping) else None
    return re.sub(r"^AMDSMI_VRAM_TYPE_+", "", name).replace("_", "") if isinstance(name, str) else None


def parse_amdsmi_library(library: Any, pid: int | None) -> list[GpuReading]:
    """Readings through the ``amdsmi`` Python library (already initialised): bytes from
    ``amdsmi_get_gpu_memory_total/usage`` (MiB from ``amdsmi_get_gpu_vram_usage`` where those fail), activity,
    socket power, hotspot (else edge) temperature, the ASIC's market name, and ``pid``'s VRAM from the process list."""

    def get(name: str) -> Callable[..., Any] | None:
        function = getattr(library, name, None)
        return function if callable(function) else None

    memory_type = getattr(library, "AmdSmiMemoryType", None)
    temp_type = getattr(library, "AmdSmiTemperatureType", None)
    temp_metric = getattr(library, "AmdSmiTemperatureMetric", None)
    clock_type = getattr(library, "AmdSmiClkType", None)
    readings = []
    for index, handle in enumerate(library.amdsmi_get_processor_handles()):
        vram: tuple[float | None, float | None] = (None, None)
        gtt: tuple[float | None, float | None] = (None, None)
        if memory_type is not None:
            vram = (
                _number(_call(get("amdsmi_get_gpu_memory_total"), handle, memory_type.VRAM)),
                _number(_call(get("amdsmi_get_gpu_memory_usage"), handle, memory_type.VRAM)),
            )
            gtt = (
                _number(_call(get("amdsmi_get_gpu_memory_total"), handle, memory_type.GTT)),
                _number(_call(get("amdsmi_get_gpu_memory_usage"), handle, memory_type.GTT)),
            )
        if vram[0] is None:
            usage = _call(get("amdsmi_get_gpu_vram_usage"), handle) or {}
            vram = (_bytes(usage.get("vram_total"), "MB"), _bytes(usage.get("vram_used"), "MB"))
        vram_info = _call(get("amdsmi_get_gpu_vram_info"), handle) or {}
        vram_type = _enum_name(library, "amdsmi_vram_type_t", vram_info.get("vram_type"))
        unified = is_unified(vram_type=vram_type, vram_total=vram[0], gtt_total=gtt[0])
        total, used = _memory(unified, vram, gtt)
        activity = _call(get("amdsmi_get_gpu_activity"), handle) or {}
        power = _call(get("amdsmi_get_power_info"), handle) or {}
        temperature = None
        if temp_type is not None and temp_metric is not None:
            for sensor in ("HOTSPOT", "EDGE"):
                if hasattr(temp_type, sensor):
                    reading = _call(
                        get("amdsmi_get_temp_metric"), handle, getattr(temp_type, sensor), temp_metric.CURRENT
                    )
                    temperature = _celsius(reading)
                    if temperature is not None:
                        break
        clock = _call(get("amdsmi_get_clock_info"), handle, clock_type.MEM) if clock_type is not None else None
        bandwidth, source = _peak_bandwidth(
            vram_type,
            _number((clock or {}).get("max_clk")),
            _number(vram_info.get("vram_bit_width")),
            "amdsmi",
        )
        asic = _call(get("amdsmi_get_gpu_asic_info"), handle) or {}
        board = _call(get("amdsmi_get_gpu_board_info"), handle) or {}
        name = asic.get("market_name") or board.get("product_name") or f"AMD GPU {index}"
        held = None
        if pid is not None:
            found = []
            for process in _call(get("amdsmi_get_gpu_process_list"), handle) or []:
                if not isinstance(process, Mapping) or _number(process.get("pid")) != pid:
                    continue
                usage_by_pool = process.get("memory_usage")
                vram_mem = _number(usage_by_pool.get("vram_mem")) if isinstance(usage_by_pool, Mapping) else None
                mem = _first(vram_mem, _number(process.get("mem")))
                if mem is not None:
                    found.append(mem)
            held = sum(found) if found else None
        readings.append(
            GpuReading(
                vendor=VENDOR,
                index=index,
                name=str(name),
                memory_total_bytes=total,
                memory_used_bytes=used,
                utilization_pct=_small(activity.get("gfx_activity")),
                utilization_memory_pct=_small(activity.get("umc_activity")),
                power_w=_first(_watts(power.get("current_socket_power")), _watts(power.get("average_socket_power"))),
                temperature_c=temperature,
                memory_bandwidth_gbs=bandwidth,
                bandwidth_source=source,
                unified=unified,
                process_memory_bytes=held,
                device_id=str(_call(get("amdsmi_get_gpu_device_bdf"), handle) or ""),
            )
        )
    return readings


# --- reading the host -------------------------------------------------------------------------------------------


def _run_json(argv: Iterable[str]) -> Any:
    """A tool's JSON; amd-smi may print a warning line before it, so parsing starts at the first bracket."""
    completed = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    text = completed.stdout
    starts = [position for position in (text.find("["), text.find("{")) if position >= 0]
    if not starts:
        raise ValueError("no JSON in the output")
    return json.loads(text[min(starts) :])


def _library(pid: int | None) -> list[GpuReading]:
    global _library_started
    import amdsmi  # optional: only hosts with ROCm have it

    if not _library_started:
        amdsmi.amdsmi_init()
        _library_started = True
    return parse_amdsmi_library(amdsmi, pid)


def _amd_smi(pid: int | None) -> list[GpuReading]:
    metric = _run_json(["amd-smi", "metric", "--json"])
    try:
        static = _run_json(["amd-smi", "static", "--json"])
    except (OSError, subprocess.SubprocessError, ValueError):
        static = None
    processes = None
    if pid is not None:
        try:
            processes = _run_json(["amd-smi", "process", "--json"])
        except (OSError, subprocess.SubprocessError, ValueError):
            processes = None
    return parse_amd_smi(metric, static, processes, pid)


def _rocm_smi(pid: int | None) -> list[GpuReading]:
    document = _run_json(
        [
            "rocm-smi",
            "--showmeminfo",
            "vram",
            "gtt",
            "--showuse",
            "--showmemuse",
            "--showpower",
            "--showtemp",
            "--showproductname",
            "--showbus",
            "--json",
        ]
    )
    return parse_rocm_smi(document if isinstance(document, Mapping) else {})


def read(pid: int | None = None) -> list[GpuReading]:
    """Every AMD GPU on this host, from the first reader that answers; raises ``Unavailable`` (and does not look
    again for a minute) where none does."""
    global _failed
    if _failed and time.monotonic() - _failed[0] < RETRY_AFTER_S:
        raise Unavailable(_failed[1])
    why = []
    try:
        readings = _library(pid)
        if readings:
            _failed = None
            return readings
        why.append("amdsmi found no GPU")
    except ImportError:
        why.append("amdsmi is not installed")
    except Exception as exc:  # amdsmi_init raises AmdSmiLibraryException without a driver
        why.append(f"amdsmi could not start ({exc})")
    for tool, reader in (("amd-smi", _amd_smi), ("rocm-smi", _rocm_smi)):
        if shutil.which(tool) is None:
            why.append(f"{tool} is not on PATH")
            continue
        try:
            readings = reader(pid)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            why.append(f"{tool} failed ({exc.__class__.__name__})")
            continue
        if readings:
            _failed = None
            return readings
        why.append(f"{tool} found no GPU")
    _failed = (time.monotonic(), "; ".join(why))
    raise Unavailable(_failed[1])
