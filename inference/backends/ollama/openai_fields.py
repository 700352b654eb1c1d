"""An OpenAI client's fields and messages in Ollama's ``/api/chat`` terms: what maps is mapped, the rest is refused
by name (BackendNotSupported), never dropped.

https://github.com/ollama/ollama/blob/main/docs/api.md ("Generate a chat completion": ``tools``, ``format``,
``options``, ``images``; a tool call's ``arguments`` is an object) and ``api/types.go`` (Options' names).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inference.backends.base import BackendNotSupported

# OpenAI's name -> Ollama's option (api/types.go, Options and Runner).
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "num_keep": "num_keep",
    "num_ctx": "num_ctx",  # an Ollama client's own option, through RigDash's /api/
}
# Fields that change nothing Ollama generates: OpenAI's end-user tag and stored-completion metadata.
NO_EFFECT = frozenset({"user", "store", "metadata", "parallel_tool_calls"})


def ollama_fields(extra: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(options, top-level fields) for an OpenAI client's ``extra`` fields; BackendNotSupported names the first one
    Ollama has no equivalent for."""
    options: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for name, value in extra.items():
        if name in OPTIONS:
            options[OPTIONS[name]] = [value] if name == "stop" and isinstance(value, str) else value
        elif name == "tools":
            fields["tools"] = value  # OpenAI's function tools are Ollama's shape
        elif name == "tool_choice" and value in ("auto", None):
            continue  # Ollama's only behaviour
        elif name == "response_format":
            fields.update(_format(value))
        elif name not in NO_EFFECT:
            raise BackendNotSupported(f"Ollama has no equivalent of the field {name!r}={_short(value)}")
    return options, fields


def _format(value: Any) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"format": "json"}
    schema = value.get("json_schema") if isinstance(value, dict) else None
    if kind == "json_schema" and isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
        return {"format": schema["schema"]}
    raise BackendNotSupported(f"Ollama has no equivalent of response_format {_short(value)}")


def ollama_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI message as Ollama's: text parts joined, image parts as base64 ``images`` (data URLs only: Ollama
    reads no URL), a tool call's arguments as an object, ``developer`` as ``system``."""
    out: dict[str, Any] = {"role": "system" if message.get("role") == "developer" else message.get("role")}
    content = message.get("content")
    if isinstance(content, list):
        texts, images = [], []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image_url":
                images.append(_image(part.get("image_url")))
            else:
                raise BackendNotSupported(f"Ollama has no equivalent of a content part of type {kind!r}")
        out["content"] = "".join(texts)
        if images:
            out["images"] = images
    else:
        out["content"] = content or ""
    if message.get("tool_calls"):
        out["tool_calls"] = [_tool_call(call) for call in message["tool_calls"]]
    if message.get("name") and out["role"] == "tool":
        out["tool_name"] = message["name"]
    return out


def _image(value: Any) -> str:
    url = value.get("url") if isinstance(value, dict) else value
    if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
        return url.split(";base64,", 1)[1]
    raise BackendNotSupported("Ollama reads images sent inline only (a data: URL in base64), not by URL")


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise BackendNotSupported("a tool call without a function")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise BackendNotSupported("Ollama needs a tool call's arguments as a JSON object") from None
    return {"function": {"name": function.get("name"), "arguments": arguments}}


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."
