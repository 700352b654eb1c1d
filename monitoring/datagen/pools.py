"""Pre-built text and number pools: a million turns are cut from a few hundred strings (Python cannot draw and
encode a reply's worth of random numbers per turn fast enough), so sizes are realistic and writing stays cheap."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

_WORDS = (
    "the model decode token cache slot prompt batch layer weight tensor memory bandwidth quantised context window "
    "request server latency throughput kernel thread core matrix vector attention head embedding logits sample "
    "temperature sequence stream reply user system function return value error result config file path build test"
)
WORDS = _WORDS.split()
CODE = '```python\ndef step(x: int) -> int:\n    """One step."""\n    return x * 2 + 1\n```\n'
QUESTIONS = (
    "How do I {w} the {w} in a {w}?",
    "Explain why {w} {w} is slower than {w} {w}.",
    "Write a function that returns the {w} of a {w}.",
    "What is the difference between a {w} and a {w}?",
    "Summarise this: {p}",
    "Fix the bug in this code:\n{c}",
)


def _paragraph(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[:1].upper() + text[1:] + "."


def reply_text(rng: random.Random, chars: int) -> str:
    """Markdown like a chat model's: paragraphs, lists, now and then a code block."""
    parts: list[str] = []
    size = 0
    while size < chars:
        kind = rng.random()
        if kind < 0.15:
            part = CODE
        elif kind < 0.35:
            part = "\n".join(f"- {_paragraph(rng, rng.randint(4, 12))}" for _ in range(rng.randint(2, 5)))
        else:
            part = _paragraph(rng, rng.randint(20, 70))
        parts.append(part)
        size += len(part) + 2
    return "\n\n".join(parts)


def user_text(rng: random.Random) -> str:
    template = rng.choice(QUESTIONS)
    return template.format(w=rng.choice(WORDS), p=_paragraph(rng, int(rng.lognormvariate(3.5, 0.8))), c=CODE).replace(
        "{w}", rng.choice(WORDS)
    )


@dataclass
class Gaps:
    """A JSON array of inter-token gaps whose first n elements are ``text[:ends[n - 1]] + "]"``."""

    text: str
    ends: list[int]

    def first(self, n: int) -> str:
        if n <= 0:
            return "[]"
        n = min(n, len(self.ends))
        return self.text[: self.ends[n - 1]] + "]"


def gaps(rng: random.Random, *, tps: float, count: int) -> Gaps:
    """Gaps of a decode at ``tps`` tokens/s: mostly near 1/tps, with a long tail (batches, other slots)."""
    mean_ms = 1000.0 / tps
    text, ends = "[", []
    for i in range(count):
        gap = mean_ms * rng.lognormvariate(0.0, 0.25) * (3.0 if rng.random() < 0.01 else 1.0)
        text += ("" if i == 0 else ", ") + json.dumps(round(gap, 2))
        ends.append(len(text))
    return Gaps(text=text, ends=ends)


@dataclass
class Pools:
    replies: list[str]
    questions: list[str]
    gaps: dict[int, list[Gaps]]  # by rig index

    @classmethod
    def build(cls, rng: random.Random, *, rig_rates: list[float], max_tokens: int) -> Pools:
        return cls(
            replies=[reply_text(rng, max_tokens * 5) for _ in range(64)],
            questions=[user_text(rng) for _ in range(256)],
            gaps={i: [gaps(rng, tps=tps, count=max_tokens) for _ in range(6)] for i, tps in enumerate(rig_rates)},
        )
