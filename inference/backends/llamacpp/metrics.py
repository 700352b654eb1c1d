"""llama-server's own signals: /metrics (Prometheus text), /slots and /props.

https://github.com/ggml-org/llama.cpp/tree/master/tools/server — /metrics needs --metrics and /slots --slots.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from inference.backends import sse
from inference.backends.llamacpp.chat import tls_context, with_model
from inference.backends.monitor import Unavailable


def parse_prometheus(text: str, prefix: str = "llamacpp:") -> dict[str, float]:
    """``name value`` lines of the Prometheus text format, without the prefix (labels are not used here)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith(prefix) and "{" not in name:
            try:
                values[name[len(prefix) :]] = float(value)
            except ValueError:
                continue
    return values


@dataclass
class SlotReading:
    """One slot of ``/slots``. The prompt counters are None where the slot does not report them: a build whose
    ``/slots`` predates ``n_prompt_tokens``, ``n_prompt_tokens_processed`` and ``n_prompt_tokens_cache`` (such as
    b9093), or a slot that never ran a task."""

    id: int
    n_ctx: int
    processing: bool
    task: int | None = None
    prompt_tokens: int | None = 0
    prompt_processed: int | None = 0
    prompt_cached: int | None = 0
    decoded: int = 0

    @property
    def context_tokens(self) -> int | None:
        """Tokens in the slot's context: 0 while idle; None while it works and its prompt's tokens are not reported
        (its decoded tokens alone would understate it)."""
        if not self.processing:
            return 0
        if self.prompt_processed is None or self.prompt_cached is None:
            return None
        return self.prompt_cached + self.prompt_processed + self.decoded

    @property
    def phase(self) -> str:
        if not self.processing:
            return "idle"
        return "decoding" if self.decoded > 0 else "prompt"


def parse_slot(raw: dict[str, Any]) -> SlotReading:
    next_token = raw.get("next_token") or {}
    if isinstance(next_token, list):
        next_token = next_token[0] if next_token else {}
    return SlotReading(
        id=int(raw["id"]),
        n_ctx=int(raw.get("n_ctx") or 0),
        processing=bool(raw.get("is_processing")),
        task=raw.get("id_task"),
        prompt_tokens=_reported(raw, "n_prompt_tokens"),
        prompt_processed=_reported(raw, "n_prompt_tokens_processed"),
        prompt_cached=_reported(raw, "n_prompt_tokens_cache"),
        decoded=int(next_token.get("n_decoded") or 0),
    )


def _reported(raw: dict[str, Any], name: str) -> int | None:
    """A slot's counter, or None where the slot does not have it (not 0: an absent count is not an empty one)."""
    return None if raw.get(name) is None else int(raw[name])


class Refused(Unavailable):
    """The server answered, but not this endpoint (``/metrics`` without ``--metrics``, ``/slots`` with
    ``--no-slots``, a router that wants ``?model=``): that panel is missing, the server is not down."""


@dataclass
class LlamaCppReading:
    metrics: dict[str, float]
    slots: list[SlotReading]
    props: dict[str, Any] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # endpoint ("metrics", "slots", "props") -> why
    sleeping: bool = False  # --sleep-idle-seconds: the model is unloaded until a request wakes it

    @property
    def router(self) -> bool:
        """llama-server in router mode (``--models-dir`` / ``--models-preset``): no model of its own."""
        return self.props.get("role") == "router"


def props_reread(props: dict[str, Any]) -> bool:
    """Whether /props is read on every tick: a server that reports whether it sleeps (``is_sleeping``, b7000 on;
    /props answers without waking it) or a router; otherwise once, as it changes only when the server restarts."""
    return not props or "is_sleeping" in props or props.get("role") == "router"


async def collect(
    base_url: str,
    *,
    timeout_s: float = 0.8,
    props_cache: dict[str, Any] | None = None,
    metrics_cache: dict[str, float] | None = None,
    model: str | None = None,
    headers: dict[str, str] | None = None,
) -> LlamaCppReading:
    """Read /props (each tick where the server may sleep, see ``props_reread``), then /slots and /metrics unless
    the server sleeps (reading them would wake it: they go through its task queue), /metrics only without
    ``metrics_cache`` (its counters move only when a request ends). Every request is one the server answers between
    decode steps, so the sampler asks for as little as it can. The reads go through the lean client
    (``inference.backends.sse.get``), since the sampler makes them every second for as long as RigDash runs.
    ``model``: one model of a router (``?model=``), which must be loaded: a router loads a model it is asked about.

    Each endpoint counts on its own: one the server refuses is named in ``refused`` and the others still count;
    only a server that cannot be reached at all raises ``Unavailable``."""

    async def get(path: str) -> bytes:
        path = with_model(path, model)
        try:
            status, body = await sse.get(base_url, path, timeout_s=timeout_s, tls=tls_context(), headers=headers)
        except (OSError, TimeoutError, sse.ProtocolError) as exc:
            raise Unavailable(f"llama-server unreachable: {exc!r}") from exc
        if status != 200:
            raise Refused(f"llama-server {path} answered {status}")
        return body

    def parse_json(path: str, body: bytes) -> Any:
        try:
            return json.loads(body)
        except ValueError as exc:
            raise Refused(f"llama-server {path} answered something that is not JSON") from exc

    refused: dict[str, str] = {}
    props: dict[str, Any] = dict(props_cache or {})
    if props_reread(props):
        try:
            body = await get("/props")
        except Refused as exc:
            refused["props"] = str(exc)
        else:
            props = _json_object("/props", body, parse_json, refused, "props")
            props.pop("chat_template", None)
    if props.get("is_sleeping") is True:
        return LlamaCppReading(metrics=dict(metrics_cache or {}), slots=[], props=props, refused=refused, sleeping=True)
    if props.get("role") == "router":  # /slots and /metrics are per model (``?model=``): the monitor asks each
        return LlamaCppReading(metrics={}, slots=[], props=props, refused=refused)
    wanted = {"slots": get("/slots")}
    if metrics_cache is None:
        wanted["metrics"] = get("/metrics")
    bodies: dict[str, bytes] = {}
    for name, result in zip(wanted, await asyncio.gather(*wanted.values(), return_exceptions=True), strict=True):
        if isinstance(result, Refused):
            refused[name] = str(result)
        elif isinstance(result, BaseException):
            raise result
        else:
            bodies[name] = result
    slots: list[SlotReading] = []
    if "slots" in bodies:
        try:
            raw_slots = parse_json("/slots", bodies["slots"])
            if not isinstance(raw_slots, list):
                raise TypeError("not a list")
            slots = [parse_slot(slot) for slot in raw_slots]
        except (Refused, TypeError, KeyError, ValueError, AttributeError) as exc:
            refused["slots"] = f"llama-server /slots answered a shape RigDash cannot read ({exc})"
    metrics = dict(metrics_cache or {})
    if "metrics" in bodies:
        metrics = parse_prometheus(bodies["metrics"].decode("utf-8", "replace"))
    return LlamaCppReading(metrics=metrics, slots=slots, props=props, refused=refused)


def _json_object(path: str, body: bytes, parse: Any, refused: dict[str, str], name: str) -> dict[str, Any]:
    try:
        value = parse(path, body)
    except Refused as exc:
        refused[name] = str(exc)
        return {}
    if not isinstance(value, dict):
        refused[name] = f"llama-server {path} answered something that is not an object"
        return {}
    return value
