"""Token estimates for text the backend has not counted yet (pure)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def estimate_tokens(text: str) -> int:
    """A rough token count (about 4 characters a token for English BPE vocabularies), rounded up."""
    return math.ceil(len(text) / 4)


def estimate_prompt_tokens(messages: Iterable[Mapping[str, str]]) -> int:
    """Estimated prompt size: each message's text plus a few tokens of chat template around it."""
    return sum(estimate_tokens(m.get("content", "")) + 4 for m in messages) + 2
