"""The one number parser for input from outside (query strings, forms, JSON bodies, websocket frames).

Python's own ``int()`` and ``float()`` read more than a person types into a field: Unicode digits (``int("٣")`` is
3, ``"²".isdigit()`` is true but ``int("²")`` raises), underscores (``int("1_000")``), ``nan``, ``inf``, ``1e400``
and numbers of thousands of digits, which overflow a float conversion or a database column further on. Here only
ASCII digits of a bounded length, finite and within the caller's range, pass; anything else is ``BadNumber``, one
ValueError subclass each entry point turns into its own 400 (views/http.py, the OpenAI-shaped errors, form errors,
error frames).
"""

from __future__ import annotations

import math
import re
from typing import Any

MAX_DIGITS = 40  # far beyond any count, id or limit here; well under float's 308-digit overflow
_DIGITS = f"[0-9]{{1,{MAX_DIGITS}}}"
_INT = re.compile(rf"[+-]?{_DIGITS}", re.ASCII)
_FRACTION = f"[0-9]{{0,{MAX_DIGITS}}}"
_FLOAT = re.compile(rf"[+-]?(?:{_DIGITS}(?:\.{_FRACTION})?|\.{_DIGITS})(?:[eE][+-]?[0-9]{{1,3}})?", re.ASCII)


class BadNumber(ValueError):
    """A value that is not a number of the kind asked for, or out of its range; the message names it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


def _in_range(value: float, *, name: str, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low:g} and {high:g}" if low is not None and high is not None else (
            f"at least {low:g}" if low is not None else f"at most {high:g}")  # fmt: skip
        raise BadNumber(name, f"{name} must be {bounds}.")


def parse_int(value: Any, *, name: str, low: int | None = None, high: int | None = None) -> int:
    """A whole number from text (ASCII digits, an optional sign, at most MAX_DIGITS) or from a JSON int."""
    if isinstance(value, bool):
        raise BadNumber(name, f"{name} must be a whole number.")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 10**MAX_DIGITS:
        value = int(value)
    if isinstance(value, int):
        if abs(value) >= 10**MAX_DIGITS:
            raise BadNumber(name, f"{name} is too long a number.")
        number = value
    elif isinstance(value, str) and _INT.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise BadNumber(name, f"{name} must be a whole number.")
    _in_range(number, name=name, low=low, high=high)
    return number


def parse_float(value: Any, *, name: str, low: float | None = None, high: float | None = None) -> float:
    """A finite number from text (ASCII digits, an optional sign, point and exponent) or from a JSON number."""
    if isinstance(value, bool):
        raise BadNumber(name, f"{name} must be a number.")
    if isinstance(value, int) and abs(value) < 10**MAX_DIGITS:
        number = float(value)
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        number = float(value.strip())
    else:
        raise BadNumber(name, f"{name} must be a number.")
    if not math.isfinite(number):
        raise BadNumber(name, f"{name} must be a finite number.")
    _in_range(number, name=name, low=low, high=high)
    return number


def optional_int(value: Any, *, name: str, default: int, low: int | None = None, high: int | None = None) -> int:
    """``parse_int``, with ``default`` for a missing or empty value (a query string's optional parameter)."""
    if value is None or value == "":
        return default
    return parse_int(value, name=name, low=low, high=high)
