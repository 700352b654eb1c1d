"""System memory and the backend process's resident memory, through psutil (the no-GPU view)."""

from __future__ import annotations

from typing import Any

import psutil

from monitoring.collectors import Unavailable


def host_memory() -> dict[str, float]:
    try:
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
    except (OSError, RuntimeError) as exc:
        raise Unavailable(f"psutil could not read memory: {exc!r}") from exc
    return {
        "total_bytes": float(memory.total),
        "used_bytes": float(memory.total - memory.available),
        "available_bytes": float(memory.available),
        "swap_used_bytes": float(swap.used),
    }


def find_listening_pid(port: int) -> int | None:
    """The local process listening on ``port`` (RigDash runs on the rig's host), if any."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return int(conn.pid)
    except (psutil.AccessDenied, OSError):
        return None
    return None


def process_memory(pid: int) -> dict[str, Any]:
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            return {"pid": pid, "name": process.name(), "rss_bytes": float(process.memory_info().rss)}
    except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
        raise Unavailable(f"cannot read process {pid}: {exc!r}") from exc
