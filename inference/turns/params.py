"""Generation parameters a user may set on a turn: an allowlist with ranges, checked before anything is stored."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings

from inference.errors import InvalidInput

# name -> (type, minimum, maximum): the only generation parameters passed to a backend.
PARAM_RULES: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 0.0, 1.0),
    "max_tokens": (int, 1, 32_768),
    "seed": (int, 0, 2**31 - 1),
}


def params_validate(raw: Any) -> dict[str, Any]:
    if raw in (None, ""):
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput("bad_params", "params must be an object")
    clean: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in PARAM_RULES:
            raise InvalidInput("bad_params", f"unknown parameter {name!r}; allowed: {sorted(PARAM_RULES)}")
        kind, low, high = PARAM_RULES[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidInput("bad_params", f"{name} must be a finite {kind.__name__}")
        if kind is int and value != int(value):
            raise InvalidInput("bad_params", f"{name} must be a {kind.__name__}")
        if not low <= value <= high:
            raise InvalidInput("bad_params", f"{name} must be between {low:g} and {high:g}")
        clean[name] = kind(value)
    limit = settings.RIGDASH.max_reply_tokens
    if clean.get("max_tokens", 0) > limit:
        raise InvalidInput("bad_params", f"max_tokens is limited to {limit} on this server")
    return clean
