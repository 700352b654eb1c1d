"""Decode calculator: what a model, a context, a number of sessions and a machine should give, as plain functions.

Each decode step reads the weights once for every session decoding together, and each session's KV cache, so
  step time = bytes read / bandwidth  and  tokens/s per session = 1 / step time.
What does not fit in the fast tier (VRAM, or the only memory of a CPU or unified-memory machine) spills to the slow
tier (system RAM), layer by layer as llama.cpp's ``-ngl`` splits it: that share of every step's bytes is read at the
slow tier's bandwidth (the spilled layers run where they lie) or over the link (the fast tier's processor reads them).
Prefill is compute-bound: 2 x parameters x prompt tokens FLOPs. Every figure is a bound: no kernel reaches its
hardware's peak. Formulas and their limits: docs/calculator.md.

The KV cache is sized layer by layer as llama.cpp allocates it (``KVSizer``, inference/backends/kvcache.py): a
full-attention layer holds the whole context, a sliding-window (or llama4 chunked) layer its window plus a batch,
a recurrent layer a fixed state per session. It is not linear in the context, so the longest context that fits is
found by bisection.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from inference.backends.base import ModelArchitecture
from monitoring import decode

GIB = 2**30
SpillRead = Literal["cpu", "link"]

# Bits per weight of a GGUF file by its quantisation. Single-type formats from their block layout (bytes per block x
# 8 / weights per block: q8_0 is 34 bytes per 32 weights); the K-quant mixes as llama.cpp's quantize tool reports
# them for Llama 2 7B (tools/quantize/README.md). A real file keeps a few small tensors (norms) in f32 and, except
# with --pure, the output tensor in q6_K: it is about 1 % larger than parameters x these bits.
WEIGHT_BITS_PER_WEIGHT: dict[str, float] = {
    "f32": 32.0,
    "f16": 16.0,
    "bf16": 16.0,
    "q8_0": 34 * 8 / 32,
    "q6_k": 6.56,
    "q5_k_m": 5.68,
    "q5_k_s": 5.52,
    "q5_1": 24 * 8 / 32,
    "q5_0": 22 * 8 / 32,
    "q4_k_m": 4.84,
    "q4_k_s": 4.58,
    "q4_1": 20 * 8 / 32,
    "q4_0": 18 * 8 / 32,
    "iq4_nl": 18 * 8 / 32,
    "iq4_xs": 136 * 8 / 256,
    "q3_k_l": 4.27,
    "q3_k_m": 3.91,
    "q3_k_s": 3.50,
    "q2_k": 3.35,
}
KV_CACHE_TYPES = tuple(decode.KV_CACHE_TYPE_BYTES)

# A typical adult's silent reading of English non-fiction: 238 words a minute (Brysbaert, "How many words do we read
# per minute? A review and meta-analysis of reading rate", Journal of Memory and Language 109, 2019), at 4/3 tokens a
# word (OpenAI's rule of thumb for English: a token is about 3/4 of a word).
READING_WORDS_PER_MIN = 238.0
TOKENS_PER_WORD = 4 / 3
READING_TPS = READING_WORDS_PER_MIN / 60 * TOKENS_PER_WORD


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive finite number, not {value!r}")


def _not_negative(**values: float) -> None:
    for name, value in values.items():
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be zero or more, not {value!r}")


def weight_bytes(*, params: float, quant: str) -> float:
    """Bytes of a model's weights: parameters x bits per weight of its GGUF quantisation / 8."""
    _positive(params=params)
    try:
        bits = WEIGHT_BITS_PER_WEIGHT[quant.lower()]
    except KeyError:
        raise ValueError(f"unknown quantisation {quant!r}; known: {sorted(WEIGHT_BITS_PER_WEIGHT)}") from None
    return params * bits / 8


def kv_bytes_per_token(arch: ModelArchitecture, kv_type: str) -> float:
    """2 (K and V) x layers x KV heads x head dim x bytes per element (``monitoring.decode``)."""
    _positive(layers=arch.block_count, heads=arch.head_count, kv_heads=arch.head_count_kv)
    _positive(embedding=arch.embedding_length)
    return decode.kv_bytes_per_token(arch, kv_type)


def kv_bytes(*, per_token: float, context_tokens: int, sessions: int) -> float:
    """The KV cache of ``sessions`` sequences of ``context_tokens`` each, every layer attending to all of them."""
    _positive(per_token=per_token, sessions=sessions)
    _not_negative(context_tokens=context_tokens)
    return per_token * context_tokens * sessions


@dataclass(frozen=True)
class KVSizer:
    """A model's KV cache at a context and a session count.

    With ``arch``: per layer (``monitoring.decode.kv_allocated_bytes``: what llama-server allocates with ``-c
    context x sessions -np sessions``, cells padded to 256, sliding-window layers at their window plus a batch,
    recurrent states one per session; ``kv_bytes``: what the tokens in use hold, read each decode step). Without:
    ``per_token`` x context x sessions (every layer full attention, no padding)."""

    arch: ModelArchitecture | None = None
    kv_type: str = "f16"
    per_token: float = 0.0

    def allocated(self, context_tokens: int, sessions: int) -> float:
        if self.arch is None:
            return kv_bytes(per_token=self.per_token, context_tokens=context_tokens, sessions=sessions)
        _positive(sessions=sessions)
        _not_negative(context_tokens=context_tokens)
        if context_tokens == 0:
            return self.held(0, sessions)
        return decode.kv_allocated_bytes(self.arch, context_tokens, self.kv_type, parallel=sessions)

    def held(self, context_tokens: int, sessions: int) -> float:
        if self.arch is None:
            return kv_bytes(per_token=self.per_token, context_tokens=context_tokens, sessions=sessions)
        _positive(sessions=sessions)
        _not_negative(context_tokens=context_tokens)
        return decode.kv_bytes(self.arch, context_tokens, self.kv_type, parallel=sessions)


def kv_sizer(arch: ModelArchitecture, kv_type: str) -> KVSizer:
    """The per-layer sizer of ``arch`` (its geometry checked as ``kv_bytes_per_token`` does)."""
    kv_bytes_per_token(arch, kv_type)
    return KVSizer(arch, kv_type)


@dataclass(frozen=True)
class Tier:
    """One kind of memory: how much it holds and how fast it is read."""

    capacity_bytes: float
    bandwidth_bytes_s: float


@dataclass(frozen=True)
class Hardware:
    """A machine: a fast tier, optionally a slow one behind a link, compute for prefill and power draw.

    ``slow`` None: nothing to spill to (a CPU-only or unified-memory machine). ``reserved_bytes``: fast-tier memory
    the model cannot use (a CUDA context and compute buffers). ``spill_read``: "cpu" reads spilled bytes at the slow
    tier's bandwidth (llama.cpp runs the layers left in system RAM on the CPU); "link" at the slower of that and the
    link (the GPU reads them across PCIe)."""

    fast: Tier
    slow: Tier | None = None
    link_bytes_s: float | None = None
    spill_read: SpillRead = "cpu"
    reserved_bytes: float = 0.0
    flops: float | None = None
    power_w: float | None = None

    def __post_init__(self) -> None:
        _positive(fast_capacity=self.fast.capacity_bytes, fast_bandwidth=self.fast.bandwidth_bytes_s)
        _not_negative(reserved=self.reserved_bytes)
        if self.reserved_bytes >= self.fast.capacity_bytes:
            raise ValueError("the reserved memory takes the whole fast tier")
        if self.slow is not None:
            _positive(slow_capacity=self.slow.capacity_bytes, slow_bandwidth=self.slow.bandwidth_bytes_s)
        if self.link_bytes_s is not None:
            _positive(link_bandwidth=self.link_bytes_s)
        if self.spill_read not in ("cpu", "link"):
            raise ValueError(f"spill_read must be 'cpu' or 'link', not {self.spill_read!r}")
        if self.flops is not None:
            _positive(flops=self.flops)
        if self.power_w is not None:
            _positive(power_w=self.power_w)

    @property
    def usable_fast_bytes(self) -> float:
        return self.fast.capacity_bytes - self.reserved_bytes

    @property
    def total_bytes(self) -> float:
        return self.usable_fast_bytes + (self.slow.capacity_bytes if self.slow else 0.0)

    @property
    def spill_bandwidth_bytes_s(self) -> float | None:
        """The rate spilled bytes are read at; None when there is no slow tier."""
        if self.slow is None:
            return None
        if self.spill_read == "link" and self.link_bytes_s is not None:
            return min(self.slow.bandwidth_bytes_s, self.link_bytes_s)
        return self.slow.bandwidth_bytes_s


@dataclass(frozen=True)
class Placement:
    """Where a footprint (weights + KV cache allocated) lies: in the fast tier, spilled, or not at all."""

    footprint_bytes: float
    fast_bytes: float
    spilled_bytes: float
    fits: bool
    short_bytes: float  # how much more memory it would need (0 when it fits)

    @property
    def spill_fraction(self) -> float:
        return self.spilled_bytes / self.footprint_bytes if self.footprint_bytes else 0.0


def place(footprint_bytes: float, hw: Hardware) -> Placement:
    """Fill the fast tier first; the rest goes to the slow tier if there is one and it holds it."""
    _not_negative(footprint=footprint_bytes)
    fast = min(footprint_bytes, hw.usable_fast_bytes)
    spilled = footprint_bytes - fast
    short = max(0.0, footprint_bytes - hw.total_bytes)
    return Placement(footprint_bytes, fast, spilled, fits=short == 0.0, short_bytes=short)


def decode_step_s(*, read_bytes: float, placement: Placement, hw: Hardware) -> float:
    """Seconds one decode step takes to read ``read_bytes``, split between the tiers as the footprint is."""
    _positive(read_bytes=read_bytes)
    if not placement.fits:
        raise ValueError("the model does not fit in this machine's memory")
    spilled = placement.spill_fraction
    seconds = read_bytes * (1 - spilled) / hw.fast.bandwidth_bytes_s
    rate = hw.spill_bandwidth_bytes_s
    if spilled and rate:
        seconds += read_bytes * spilled / rate
    return seconds


@dataclass(frozen=True)
class DecodeRate:
    per_session_tps: float
    total_tps: float
    step_s: float
    read_bytes: float  # per step: the weights once and each session's KV cache in use
    compute_bound: bool = False  # the step's FLOPs, not its bytes, set its time


def decode_rate(
    *,
    weight_bytes: float,
    hw: Hardware,
    context_tokens: int,
    sessions: int,
    kv_per_token: float | None = None,
    kv: KVSizer | None = None,
    context_in_use: int | None = None,
    params: float | None = None,
) -> DecodeRate | None:
    """Tokens/s with ``sessions`` sequences of ``context_tokens`` allocated, each holding ``context_in_use`` tokens
    now (the whole context when None); None when the footprint does not fit. The cache: ``kv`` per layer, else
    ``kv_per_token`` for every token. With ``params`` and the hardware's FLOP/s, a step takes at least its
    2 x parameters x sessions FLOPs: many sessions make decode compute-bound."""
    _positive(weight_bytes=weight_bytes)
    if kv is None:
        if kv_per_token is None:
            raise ValueError("decode_rate needs kv or kv_per_token")
        kv = KVSizer(per_token=kv_per_token)
    allocated = kv.allocated(context_tokens, sessions)
    placement = place(weight_bytes + allocated, hw)
    if not placement.fits:
        return None
    in_use = context_tokens if context_in_use is None else min(context_in_use, context_tokens)
    read = weight_bytes + kv.held(in_use, sessions)
    step = decode_step_s(read_bytes=read, placement=placement, hw=hw)
    compute = 2 * params * sessions / hw.flops if params and hw.flops else 0.0
    return DecodeRate(1 / max(step, compute), sessions / max(step, compute), max(step, compute), read, compute > step)


def prefill_s(*, params: float, prompt_tokens: int, flops: float) -> float:
    """Seconds to read a prompt at ``flops``: 2 FLOPs per parameter per token (attention's own work left out)."""
    _positive(params=params, flops=flops)
    _not_negative(prompt_tokens=prompt_tokens)
    return 2 * params * prompt_tokens / flops


def max_sessions(*, capacity_bytes: float, weight_bytes: float, kv_per_session_bytes: float) -> int:
    """The most sessions whose KV cache fits beside the weights in ``capacity_bytes`` (0 if the weights do not)."""
    _positive(weight_bytes=weight_bytes, kv_per_session_bytes=kv_per_session_bytes)
    if weight_bytes > capacity_bytes:
        return 0
    return math.floor((capacity_bytes - weight_bytes) / kv_per_session_bytes)


def max_context(*, capacity_bytes: float, weight_bytes: float, kv_per_token: float, sessions: int) -> int:
    """The longest context each of ``sessions`` can hold beside the weights in ``capacity_bytes`` (linear rule)."""
    return max_sessions(
        capacity_bytes=capacity_bytes, weight_bytes=weight_bytes, kv_per_session_bytes=kv_per_token * sessions
    )


CONTEXT_LIMIT = 1 << 30  # the most tokens searched: a cache that stops growing (all recurrent) fits any context


def _largest(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n in 0..``limit`` with ``fits(n)``, ``fits`` monotone (true up to some n, false after): doubling
    then bisection, about 2 log2(n) calls."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    if high > limit:
        if fits(limit):
            return limit
        high = limit
    while high - low > 1:  # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def max_sessions_for(*, capacity_bytes: float, weight_bytes: float, kv: KVSizer, context_tokens: int) -> int:
    """The most sessions of ``context_tokens`` whose cache, as allocated, fits beside the weights."""
    _positive(weight_bytes=weight_bytes)
    room = capacity_bytes - weight_bytes
    return _largest(lambda n: kv.allocated(context_tokens, n) <= room, 1 << 20) if room >= 0 else 0


def max_context_for(*, capacity_bytes: float, weight_bytes: float, kv: KVSizer, sessions: int) -> int:
    """The longest context each of ``sessions`` can have beside the weights (bisection: the cache is not linear in
    the context); ``CONTEXT_LIMIT`` when it stops growing first."""
    _positive(weight_bytes=weight_bytes)
    room = capacity_bytes - weight_bytes
    return _largest(lambda n: kv.allocated(n, sessions) <= room, CONTEXT_LIMIT) if room >= 0 else 0


@dataclass(frozen=True)
class Energy:
    joules_per_million: float
    kwh_per_million: float
    cost_per_million: float | None


def energy_per_million(*, power_w: float, total_tps: float, price_per_kwh: float | None = None) -> Energy:
    """Energy and cost of a million output tokens at ``power_w`` while decoding ``total_tps``."""
    _positive(power_w=power_w, total_tps=total_tps)
    if price_per_kwh is not None:
        _not_negative(price_per_kwh=price_per_kwh)
    joules = power_w / total_tps * 1e6
    kwh = joules / 3.6e6
    return Energy(joules, kwh, None if price_per_kwh is None else kwh * price_per_kwh)


def reading_pace(per_session_tps: float) -> float:
    """How many times faster than a typical reader (``READING_TPS``) a reply streams."""
    _not_negative(per_session_tps=per_session_tps)
    return per_session_tps / READING_TPS


@dataclass(frozen=True)
class ModelSpec:
    """A model as the calculator needs it: its KV geometry, parameter count and the bytes of its weights."""

    arch: ModelArchitecture
    params: float
    weight_bytes: float


@dataclass(frozen=True)
class Workload:
    context_tokens: int  # allocated per session; the headline rate is for a context this full
    sessions: int
    prompt_tokens: int
    kv_type: str = "f16"


@dataclass(frozen=True)
class Prediction:
    weight_bytes: float
    kv_bytes_per_token: float  # what each further token adds: the full-attention layers
    kv_bytes: float  # allocated, layer by layer, for the context and sessions
    placement: Placement
    at_full_context: DecodeRate | None
    at_prompt: DecodeRate | None  # each session's context holding just the prompt: where a reply starts
    prefill_s: float | None
    ttft_s: float | None
    max_sessions_fast: int
    max_sessions_total: int
    spill_context: int | None  # the shortest context per session that spills at this many sessions
    spill_sessions: int | None  # the fewest sessions that spill at this context
    energy: Energy | None
    reading_pace: float | None


def _first_spill(hw: Hardware, fits_up_to: int) -> int | None:
    """The first count past what the fast tier holds; None with nothing to spill to (past it, nothing fits)."""
    return None if hw.slow is None else fits_up_to + 1


def predict(model: ModelSpec, hw: Hardware, work: Workload, *, price_per_kwh: float | None = None) -> Prediction:
    """Every output of the calculator for one model, machine and workload."""
    _positive(context_tokens=work.context_tokens, sessions=work.sessions)
    if not 0 <= work.prompt_tokens <= work.context_tokens:
        raise ValueError("the prompt must fit in the context")
    per_token = kv_bytes_per_token(model.arch, work.kv_type)
    sizer = kv_sizer(model.arch, work.kv_type)
    kv = sizer.allocated(work.context_tokens, work.sessions)
    placement = place(model.weight_bytes + kv, hw)
    rate = functools.partial(
        decode_rate,
        weight_bytes=model.weight_bytes,
        kv=sizer,
        hw=hw,
        context_tokens=work.context_tokens,
        sessions=work.sessions,
        params=model.params,
    )
    full, start = rate(), rate(context_in_use=work.prompt_tokens)
    prefill = prefill_s(params=model.params, prompt_tokens=work.prompt_tokens, flops=hw.flops) if hw.flops else None
    ttft = prefill + start.step_s if prefill is not None and start else None
    sessions_in = functools.partial(
        max_sessions_for, weight_bytes=model.weight_bytes, kv=sizer, context_tokens=work.context_tokens
    )
    fast_sessions = sessions_in(capacity_bytes=hw.usable_fast_bytes)
    all_sessions = sessions_in(capacity_bytes=hw.total_bytes)
    fast_context = max_context_for(
        capacity_bytes=hw.usable_fast_bytes, weight_bytes=model.weight_bytes, kv=sizer, sessions=work.sessions
    )
    energy = None
    if full and hw.power_w:
        energy = energy_per_million(power_w=hw.power_w, total_tps=full.total_tps, price_per_kwh=price_per_kwh)
    return Prediction(
        weight_bytes=model.weight_bytes,
        kv_bytes_per_token=per_token,
        kv_bytes=kv,
        placement=placement,
        at_full_context=full,
        at_prompt=start,
        prefill_s=prefill,
        ttft_s=ttft,
        max_sessions_fast=fast_sessions,
        max_sessions_total=all_sessions,
        spill_context=_first_spill(hw, fast_context),
        spill_sessions=_first_spill(hw, fast_sessions),
        energy=energy,
        reading_pace=reading_pace(full.per_session_tps) if full else None,
    )


def _top(value: int, floor: int, marks: tuple[int | None, ...], stretch: int) -> int:
    """Four times ``value`` (at least ``floor``), stretched to show the marks (a spill point) up to ``stretch`` x."""
    top = max(4 * value, floor)
    shown = [mark for mark in marks if mark is not None and mark <= stretch * value]
    return max([top, *(math.ceil(mark * 1.25) for mark in shown)])


def context_ladder(context_tokens: int, *, marks: tuple[int | None, ...] = (), points: int = 48) -> list[int]:
    """Contexts from 128 tokens to four times ``context_tokens`` (further, up to 64 times, to show ``marks``),
    evenly spaced on a log scale, with ``context_tokens`` and the marks included."""
    top = _top(context_tokens, 1024, marks, 64)
    ladder = {round(128 * (top / 128) ** (i / (points - 1))) for i in range(points)}
    return sorted(ladder | {context_tokens} | {m for m in marks if m is not None and m <= top})


def sessions_ladder(sessions: int, *, marks: tuple[int | None, ...] = (), limit: int = 4096) -> list[int]:
    """1 .. max(4 x ``sessions``, 16) sessions (further, up to 64 times, to show ``marks``): every count up to 64,
    then a log scale."""
    top = min(_top(sessions, 16, marks, 64), limit)
    ladder = set(range(1, min(top, 64) + 1))
    if top > 64:
        ladder |= {round(64 * (top / 64) ** (i / 32)) for i in range(33)}
    return sorted(ladder | {min(sessions, limit)} | {m for m in marks if m is not None and m <= top})


def curve(
    model: ModelSpec,
    hw: Hardware,
    work: Workload,
    *,
    contexts: list[int] | None = None,
    sessions: list[int] | None = None,
) -> list[DecodeRate | None]:
    """Decode rates at full context along one axis (contexts, or session counts), the rest as in ``work``."""
    sizer = kv_sizer(model.arch, work.kv_type)
    pairs = [(c, work.sessions) for c in contexts] if contexts else [(work.context_tokens, s) for s in sessions or []]
    return [
        decode_rate(
            weight_bytes=model.weight_bytes,
            kv=sizer,
            hw=hw,
            context_tokens=c,
            sessions=s,
            params=model.params,
        )
        for c, s in pairs
    ]
