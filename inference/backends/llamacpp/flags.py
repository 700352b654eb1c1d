"""How a llama-server was started, where RigDash can see it, and the KV cache layout that follows.

llama-server's API does not say whether its cache is unified (one pool of ``-c`` cells every slot shares, each slot
reporting the whole pool as its ``n_ctx``) or split (one stream per slot of ``-c / -np`` cells): both read the same
in ``/slots`` and ``/props``. The flags say it (tools/server, b11434):

- ``-kvu`` / ``--kv-unified`` (or ``LLAMA_ARG_KV_UNIFIED``): unified; ``--no-kv-unified``: split;
- neither, with no ``-np`` (or ``-np -1``): "n_parallel is set to auto, using n_parallel = 4 and kv_unified = true";
- neither, with ``-np N``: split.

Where the flags come from: in router mode each model's ``status.args`` in ``/models`` (the child's command line);
on the rig's host (the agent, or a server on loopback) the server process's own command line and environment under
``/proc``. Elsewhere the layout is llama-server's default, and the page says it was assumed.

The same flags give the context one slot will get (``slot_context``), for a router's model before it is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_PORT = 8080


@dataclass(frozen=True)
class ServerFlags:
    parallel: int | None = None  # -np; None or -1: auto
    kv_unified: bool | None = None  # -kvu / --no-kv-unified; None: not given
    port: int | None = None
    model_path: str = ""
    cache_type_k: str = ""
    ctx_size: int | None = None  # -c; None: not given; 0: the model's trained context
    ctx_per_slot: int | None = None  # --kv-unified-per-slot; None: not given

    @property
    def unified(self) -> bool:
        if self.kv_unified is not None:
            return self.kv_unified
        return self.parallel is None or self.parallel < 0  # -np auto: 4 slots over one unified cache


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _truthy(value: str) -> bool | None:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "on", "yes", "enabled"):
        return True
    if lowered in ("0", "false", "off", "no", "disabled"):
        return False
    return None


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ServerFlags:
    """The flags that size the cache, from a command line (and its environment's ``LLAMA_ARG_*``; the command line
    wins, as in llama.cpp's common/arg.cpp)."""
    env = env or {}
    parallel = _int(env["LLAMA_ARG_N_PARALLEL"]) if "LLAMA_ARG_N_PARALLEL" in env else None
    unified = _truthy(env["LLAMA_ARG_KV_UNIFIED"]) if "LLAMA_ARG_KV_UNIFIED" in env else None
    port = _int(env["LLAMA_ARG_PORT"]) if "LLAMA_ARG_PORT" in env else None
    model = env.get("LLAMA_ARG_MODEL", "")
    cache_type = env.get("LLAMA_ARG_CACHE_TYPE_K", "")
    ctx = _int(env["LLAMA_ARG_CTX_SIZE"]) if "LLAMA_ARG_CTX_SIZE" in env else None
    per_slot = _int(env["LLAMA_ARG_KV_UNIFIED_PER_SLOT"]) if "LLAMA_ARG_KV_UNIFIED_PER_SLOT" in env else None
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        takes = not eq
        if name in ("-np", "--parallel"):
            parallel = _int(value)
        elif name in ("--port",):
            port = _int(value)
        elif name in ("-m", "--model"):
            model = value
        elif name in ("-ctk", "--cache-type-k"):
            cache_type = value
        elif name in ("-c", "--ctx-size"):
            ctx = _int(value)
        elif name == "--kv-unified-per-slot":
            per_slot = _int(value)
        elif name in ("-kvu", "--kv-unified"):
            unified, takes = True, False
        elif name in ("-no-kvu", "--no-kv-unified"):
            unified, takes = False, False
        else:
            takes = False
        i += 2 if takes else 1
    return ServerFlags(parallel=parallel, kv_unified=unified, port=port, model_path=model, cache_type_k=cache_type,
                       ctx_size=ctx, ctx_per_slot=per_slot)  # fmt: skip


def _pad(n: int, to: int = 256) -> int:
    return (n + to - 1) // to * to


def slot_context(flags: ServerFlags, trained: int | None) -> int | None:
    """The context one slot gets from these flags, as the b11434 server sizes it: ``n_ctx`` is ``-c`` (0 or none: the
    model's ``trained`` context; with ``--kv-unified-per-slot N`` and no ``-c``, N per slot), padded to 256 cells; a
    split cache gives each slot its share, padded again (src/llama-context.cpp); a slot is capped at N and at the
    trained context (tools/server ``n_ctx_slot``). None where it rests on a trained context that is unknown. Without
    ``-c``, ``--fit`` (on by default) may start the server with less when the device's memory is short."""
    slots = flags.parallel if flags.parallel is not None and flags.parallel > 0 else 4
    per_slot = flags.ctx_per_slot if flags.ctx_per_slot is not None and flags.ctx_per_slot > 0 else None
    if flags.ctx_size:
        n_ctx: int | None = flags.ctx_size
    elif per_slot is not None and flags.ctx_size is None:
        n_ctx = slots * per_slot
    else:
        n_ctx = trained
    if n_ctx is None or n_ctx <= 0:
        return None
    n_ctx = _pad(n_ctx)
    seq = n_ctx if flags.unified else _pad(n_ctx // slots)
    caps = [cap for cap in (per_slot, trained) if cap is not None and cap > 0]
    return min([seq, *caps])


def _port_of(base_url: str) -> int:
    parsed = urlparse(base_url)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def local_process_flags(base_url: str, proc: Path = Path("/proc")) -> ServerFlags | None:
    """The flags of the llama-server process on this host that listens on ``base_url``'s port (its ``--port``, or
    8080), or None when none is found or its command line cannot be read."""
    port = _port_of(base_url)
    try:
        entries = [entry for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            argv = [part.decode("utf-8", "replace") for part in (entry / "cmdline").read_bytes().split(b"\0") if part]
        except OSError:
            continue
        if not argv or "llama-server" not in os.path.basename(argv[0]):
            continue
        env = _environ(entry)
        flags = parse(argv[1:], env)
        if (flags.port or DEFAULT_PORT) == port:
            return flags
    return None


def _environ(entry: Path) -> dict[str, str]:
    try:
        raw = (entry / "environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for part in raw.split(b"\0"):
        name, eq, value = part.decode("utf-8", "replace").partition("=")
        if eq and name.startswith("LLAMA_ARG_"):
            env[name] = value
    return env
