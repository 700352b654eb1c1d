"""JSON from browsers and API callers, read strictly: every number finite.

Python's ``json`` module reads ``NaN``, ``Infinity`` and ``1e400`` as floats that no check downstream expects
(``int(inf)`` raises OverflowError, ``nan`` compares false with every bound), and a deeply nested document raises
RecursionError. Here each of those is a ValueError, the one error a caller handles.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def loads(text: str | bytes) -> Any:
    """``json.loads``, refusing non-finite numbers and nesting deeper than Python's stack (ValueError for both)."""
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None
