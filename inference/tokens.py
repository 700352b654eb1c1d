"""Token estimates for text the backend has not counted yet (pure)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any


def estimate_tokens(text: str) -> int:
    """A rough token count (about 4 characters a token for English BPE vocabularies), rounded up."""
    return math.ceil(len(text) / 4)


def estimate_prompt_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Estimated prompt size: each message's text plus a few tokens of chat template around it. A message that is
    more than text (content parts, an assistant's tool calls, a tool's result) counts as its JSON, which is about
    what a chat template writes of it."""
    return sum(_message_tokens(m) + 4 for m in messages) + 2


def _message_tokens(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if isinstance(content, str) and len(message) <= 2:  # {"role", "content"}: the chat page's messages
        return estimate_tokens(content)
    return estimate_json_tokens({k: v for k, v in message.items() if k != "role"})


def estimate_json_tokens(value: Any) -> int:
    """A rough token count of a JSON value as a template writes it (tool definitions, content parts)."""
    if value is None:
        return 0
    return estimate_tokens(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


# Ollama drops the oldest messages to fit its context window (num_ctx) and says nothing: all that shows is a prompt
# count (prompt_eval_count) well under what was sent. The estimate is rough (about 4 characters a token; a real
# tokenizer reads English at 4 to 5), so "clearly" leaves room for it.
TRUNCATED_UNDER_WINDOW = 0.75  # the window is known and the estimate is over it: read under 3/4 of the estimate
TRUNCATED_UNKNOWN_WINDOW = 0.5  # no window known: read under half the estimate


def history_truncated(*, sent_estimate: int, read: int | None, window: int | None) -> bool:
    """Whether the backend read clearly less of the prompt than was sent (its count ``read`` against the estimate of
    what was sent); with the window known, only a prompt estimated over it can have been cut."""
    if read is None:
        return False
    if window:
        return sent_estimate > window and read < sent_estimate * TRUNCATED_UNDER_WINDOW
    return read < sent_estimate * TRUNCATED_UNKNOWN_WINDOW
