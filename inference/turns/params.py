"""Generation parameters and per-chat settings: the rules they are checked against, how a turn's parameters are
made from the chat's settings, and how they become a backend request.

Settings are a plain dict, stored validated on ``ChatSession.settings`` and ``ChatPreset.settings`` and copied
onto each turn's ``params`` (so a reply records what it was generated with). Only names in ``NUMBER_RULES``,
``system`` and ``stop`` are accepted; a value of the wrong type or out of range is refused with a message naming
it, and nothing is stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings

from inference.backends.base import THINK_LEVELS, ChatRequest
from inference.errors import InvalidInput
from rigdash import numbers

if TYPE_CHECKING:
    from inference.models import ChatSession

# name -> (type, minimum, maximum). top_k 0 and min_p 0 switch that sampler off (llama.cpp and Ollama alike);
# repeat_penalty 1 is no penalty.
NUMBER_RULES: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, 0, 1000),
    "min_p": (float, 0.0, 1.0),
    "repeat_penalty": (float, 0.0, 2.0),
    "max_tokens": (int, 1, 32_768),
    "seed": (int, 0, 2**31 - 1),
    "num_ctx": (int, 256, 1_048_576),  # Ollama's context window (reloads the model); llama-server sets its own
}
# Settings a server takes per request only where its backend says so (``Capabilities.request_settings``):
# llama-server's context is fixed when it starts (-c), for every chat at once; Ollama's follows num_ctx.
SERVER_SETTINGS = ("num_ctx",)
SYSTEM_MAX_CHARS = 8000
STOP_MAX_STRINGS = 8
STOP_MAX_CHARS = 64
PRESET_NAME_MAX_CHARS = 60
# ``think`` asks a reasoning model to think first (true, or an effort level: "low" | "medium" | "high") or to answer
# at once (false); left out, the server's default holds (Ollama's ``think``, which takes either; llama-server's
# ``chat_template_kwargs.enable_thinking`` and, for a level, ``reasoning_effort``). gpt-oss reads only the level.
ALLOWED = (*NUMBER_RULES, "system", "stop", "think")
# A turn's own: the start of the reply, which the backend continues (continue a reply cut short). llama-server
# streams it back first, so the turn's reply holds the whole text; Ollama sends only what follows it.
# An API request's turn also keeps what the client sent beyond RigDash's own fields (``passthrough``: tools,
# response_format, samplers..., forwarded to the backend unchanged) and its last message when that is more than a
# user's text (``message``: a tool's result, an assistant's start, content parts; ``Turn.prompt_message``). Both
# come from the strict JSON parser (rigdash/strictjson.py) and the body's size limit.
# ``client``: an API request's key name and user agent, for the board. ``raw_prompt``: a raw completion
# (/v1/completions): the turn's text is the prompt, sent with no chat template. ``embeddings``: an embeddings request
# (/v1/embeddings), its body in ``passthrough``; the worker asks for vectors, not a reply (inference/worker/embed.py).
# ``native``: a raw completion in llama-server's own API (``NATIVE_ROUTES``), its body in ``passthrough``.
# ``rerank``: a rerank request (/v1/rerank), its body in ``passthrough``; answered whole, as embeddings are.
TURN_ONLY = ("prefill", "passthrough", "message", "client", "raw_prompt", "embeddings", "native", "rerank")
# A turn answered whole by one backend request, nothing streamed or decoded (inference/worker/embed.py): no chat
# request goes out before its claim.
ONE_ANSWER = ("embeddings", "rerank")
NATIVE_ROUTES = ("completion", "infill")
PREFILL_MAX_CHARS = 100_000
LABELS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repeat penalty",
    "max_tokens": "max tokens",
    "seed": "seed",
    "num_ctx": "context (num_ctx)",
}


def _bad(message: str) -> InvalidInput:
    return InvalidInput("bad_params", message)


def _number(name: str, value: Any) -> int | float:
    kind, low, high = NUMBER_RULES[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{name} must be a {'whole number' if kind is int else 'number'}")
    if kind is int and value != int(value):
        raise _bad(f"{name} must be a whole number")
    if not low <= value <= high:
        raise _bad(f"{name} must be between {low:g} and {high:g}")
    number: int | float = kind(value)
    return number


def _system(value: Any) -> str:
    if not isinstance(value, str):
        raise _bad("system must be text")
    if not value.strip():
        raise _bad("The system prompt is empty: leave it out for none.")
    if len(value) > SYSTEM_MAX_CHARS:
        raise _bad(f"The system prompt has {len(value)} characters; the limit is {SYSTEM_MAX_CHARS}.")
    return value


def _stop(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _bad("stop must be a list of strings")
    if len(value) > STOP_MAX_STRINGS:
        raise _bad(f"stop has {len(value)} strings; the limit is {STOP_MAX_STRINGS}.")
    for item in value:
        if not item:
            raise _bad("A stop string is empty.")
        if len(item) > STOP_MAX_CHARS:
            raise _bad(f"A stop string has {len(item)} characters; the limit is {STOP_MAX_CHARS}.")
    return list(value)


def _prefill(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad("prefill must be non-empty text")
    if len(value) > PREFILL_MAX_CHARS:
        raise _bad(f"prefill has {len(value)} characters; the limit is {PREFILL_MAX_CHARS}.")
    return value


def params_validate(raw: Any, *, turn: bool = False) -> dict[str, Any]:
    """Checked settings (``turn``: a turn's parameters, which may also carry a ``prefill``): only allowed names,
    each of its type and in range. ``None`` or an empty string is no settings; an empty stop list is none."""
    if raw in (None, ""):
        return {}
    if not isinstance(raw, dict):
        raise _bad("params must be an object")
    allowed = (*ALLOWED, *TURN_ONLY) if turn else ALLOWED
    clean: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in allowed:
            raise _bad(f"unknown parameter {name!r}; allowed: {sorted(allowed)}")
        if name == "prefill":
            clean[name] = _prefill(value)
        elif name == "client":
            if not isinstance(value, dict) or not all(isinstance(v, str) and len(v) <= 200 for v in value.values()):
                raise _bad("client must be an object of short strings")
            clean[name] = value
        elif name in ("passthrough", "message"):
            if not isinstance(value, dict) or (name == "message" and not isinstance(value.get("role"), str)):
                raise _bad(f"{name} must be an object" + (" with a role" if name == "message" else ""))
            clean[name] = value
        elif name == "system":
            clean[name] = _system(value)
        elif name == "think":
            if not isinstance(value, bool) and value not in THINK_LEVELS:
                raise _bad(f"think must be true, false or an effort level ({', '.join(THINK_LEVELS)})")
            clean[name] = value
        elif name == "native":
            if value not in NATIVE_ROUTES:
                raise _bad(f"native must be one of {', '.join(NATIVE_ROUTES)}")
            clean[name] = value
        elif name in ("raw_prompt", *ONE_ANSWER):
            if not isinstance(value, bool):
                raise _bad(f"{name} must be true or false")
            clean[name] = value
        elif name == "stop":
            if value != []:
                clean[name] = _stop(value)
        else:
            clean[name] = _number(name, value)
    limit = django_settings.RIGDASH.max_reply_tokens
    if clean.get("max_tokens", 0) > limit:
        raise _bad(f"max_tokens is limited to {limit} on this server")
    return clean


def rig_settings_check(values: Mapping[str, Any], *, accepted: frozenset[str]) -> None:
    """Refuse a chat setting the chat's rig does not apply (``num_ctx`` on llama-server); ``accepted``: the server
    settings its backend takes per request."""
    refused = [name for name in SERVER_SETTINGS if name in values and name not in accepted]
    if refused:
        raise _bad(
            f"{refused[0]} (the context window) applies to rigs whose server takes it per request (Ollama rigs only"
            " among the kinds RigDash knows): llama-server's is set when it starts (-c)."
        )


def rig_settings(values: Mapping[str, Any], *, accepted: frozenset[str]) -> dict[str, Any]:
    """``values`` less what the rig does not apply (a preset made on an Ollama chat, applied to a llama-server one)."""
    return {name: value for name, value in values.items() if name not in SERVER_SETTINGS or name in accepted}


def turn_params(*, session: ChatSession, raw: Any) -> dict[str, Any]:
    """A new turn's parameters: the chat's stored settings, with what the request itself sets on top."""
    return {**params_validate(session.settings or {}), **params_validate(raw, turn=True)}


def chat_request(model: str, messages: list[dict[str, Any]], max_tokens: int, params: Mapping[str, Any]) -> ChatRequest:
    """The backend request for a turn: its system prompt first, then the conversation, with its sampling."""
    if params.get("system"):
        messages = [{"role": "system", "content": params["system"]}, *messages]
    if params.get("prefill"):
        messages = [*messages, {"role": "assistant", "content": params["prefill"]}]
    return ChatRequest(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        seed=params.get("seed"),
        top_k=params.get("top_k"),
        min_p=params.get("min_p"),
        repeat_penalty=params.get("repeat_penalty"),
        stop=tuple(params.get("stop") or ()),
        think=params.get("think"),
        num_ctx=params.get("num_ctx"),
        extra=params.get("passthrough") or {},
        prompt=messages[-1]["content"] if params.get("raw_prompt") else None,
        native=params.get("native"),
    )


def one_answer(params: Mapping[str, Any] | None) -> bool:
    """Whether a turn with ``params`` is answered whole by one backend request (``ONE_ANSWER``)."""
    return any((params or {}).get(name) for name in ONE_ANSWER)


def settings_summary(values: Mapping[str, Any]) -> str:
    """One line for the chat's header: what differs from the model's defaults."""
    parts = [f"{LABELS[name]} {values[name]:g}" for name in NUMBER_RULES if name in values]
    if values.get("stop"):
        parts.append(f"{len(values['stop'])} stop string{'s' if len(values['stop']) != 1 else ''}")
    if values.get("system"):
        parts.insert(0, f"system prompt ({len(values['system'])} chars)")
    return " · ".join(parts) or "model defaults"


def form_values(data: Mapping[str, str]) -> dict[str, Any]:
    """Settings from the page's form (every value a string; an empty field is unset), then checked."""
    raw: dict[str, Any] = {}
    for name, (kind, _low, _high) in NUMBER_RULES.items():
        text = (data.get(name) or "").strip()
        if not text:
            continue
        try:
            raw[name] = numbers.parse_int(text, name=name) if kind is int else numbers.parse_float(text, name=name)
        except numbers.BadNumber:
            raise _bad(f"{name} must be a {'whole number' if kind is int else 'number'}, not {text[:20]!r}") from None
    system = data.get("system") or ""
    if system.strip():
        raw["system"] = system.replace("\r\n", "\n")
    stop = [line for line in (data.get("stop") or "").replace("\r\n", "\n").split("\n") if line]
    if stop:
        raw["stop"] = stop
    return params_validate(raw)


def preset_name_validate(raw: Any) -> str:
    name = raw.strip() if isinstance(raw, str) else ""
    if not name:
        raise InvalidInput("bad_preset", "Give the preset a name.")
    if len(name) > PRESET_NAME_MAX_CHARS:
        raise InvalidInput("bad_preset", f"A preset name has at most {PRESET_NAME_MAX_CHARS} characters.")
    return name
