"""JSON from browsers and API callers, read strictly: every number finite and of bounded length.

Python's ``json`` module reads ``NaN``, ``Infinity`` and ``1e400`` as floats that no check downstream expects
(``int(inf)`` raises OverflowError, ``nan`` compares false with every bound), an integer of hundreds of digits that
overflows the first float conversion or database column it meets, and a deeply nested document raises
RecursionError. Here each of those is a ValueError, the one error a caller handles (numbers: rigdash/numbers.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

from rigdash.numbers import MAX_DIGITS


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _float(text: str) -> float:
    if len(text) > 4 * MAX_DIGITS:
        raise ValueError("a number that long is out of range")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number of {len(text)} digits is out of range")
    return int(text)


def loads(text: str | bytes) -> Any:
    """``json.loads``, refusing non-finite numbers and nesting deeper than Python's stack (ValueError for both)."""
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None
