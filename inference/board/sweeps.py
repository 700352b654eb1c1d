"""Decode sweeps (staff): a rig decodes at a ladder of prompt lengths times a ladder of parallel sessions, and each
step's decode tokens/s is stored beside the calculator's prediction (docs/calculator.md, "Sweeps").

Each step is ordinary turns of the staff member who started the sweep, submitted together through the submit service
(N sessions: N turns in one burst), so the fair queue, the slots, quotas, the board, usage and cancel treat them as
any user's turns: a sweep's turn waits its round like everyone's and never starves a user. The driver,
``sweep_advance``, is a short Celery task on the default queue that re-queues itself (``_look_after``) while a
step's turns run (it holds no worker thread meanwhile): submit a step's warm-up turns (they read its prompt into
the backend's cache), then its measured turns, wait for them to end, record what their stats measured, go on.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from inference import events
from inference.audit import audit_record
from inference.backends import backend_for
from inference.backends.base import BackendError, BackendNotSupported
from inference.board.actions import require_staff
from inference.db import locking
from inference.errors import InvalidInput, NotFound, QueueUnavailable
from inference.models import ChatSession, Rig, Sweep, SweepPoint, Turn
from inference.queue import quotas
from inference.tokens import estimate_tokens
from inference.turns import sweep_rows
from inference.turns.lifecycle import turn_cancel
from inference.turns.submit import SubmitRequest, turn_submit_many
from rigdash import numbers

log = logging.getLogger(__name__)

ADVANCE_TASK = "inference.sweep_advance"
# How often the driver looks at a running step's turns: a tenth of the time the step has run, from 0.25 s to 2 s, so a
# short step ends promptly and a long one is not disturbed by looks (each costs the worker some 50-100 ms of CPU).
LOOK_MIN_S, LOOK_MAX_S, LOOK_FRACTION = 0.25, 2.0, 0.1
RESUME_AFTER_S = 60.0  # a running sweep with no look for this long lost its driver's message (sweeps_resume)
MAX_RUNGS = 12  # entries per ladder
MIN_CONTEXT = 64  # the chat template and the instruction alone take a few dozen tokens
MIN_TOKENS, MAX_TOKENS = 8, 4096
# The question every turn of a sweep asks after its filler: a long, predictable reply, so it decodes to max_tokens.
INSTRUCTION = "Ignore the text above. Count from 1 to 2000, one number per line."
FILLER = "The quick brown fox jumps over the lazy dog while the river runs past the old mill. "
COUNT_TIMEOUT_S = 30.0  # tokenizing a long prompt takes a while on a busy CPU rig
PROMPT_COUNTS = 8  # counts to bring a step's prompt to the length asked for (it is usually there in two or three)


@dataclass(frozen=True)
class SweepPlan:
    """A sweep's checked numbers."""

    model: str
    contexts: list[int]
    sessions: list[int]
    max_tokens: int
    force: bool


def _ladder(raw: Any, name: str, *, low: int, high: int) -> list[int]:
    """``"512, 1024"`` or ``[512, 1024]`` as a sorted list of distinct whole numbers in [low, high]."""
    items = re.split(r"[\s,]+", raw.strip()) if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not [i for i in items if i != ""]:
        raise InvalidInput(f"bad_{name}", f"Give the {name} ladder as whole numbers, e.g. 512, 1024.")
    values = []
    for item in items:
        if item == "":
            continue
        try:
            value = numbers.parse_int(item if isinstance(item, int | str) else None, name=name)
        except numbers.BadNumber:
            shown = repr(item)[:40]
            raise InvalidInput(f"bad_{name}", f"The {name} ladder has {shown}, which is not a whole number.") from None
        if not low <= value <= high:
            raise InvalidInput(f"bad_{name}", f"The {name} ladder has {value}; each must be {low} to {high}.")
        values.append(value)
    if len(set(values)) > MAX_RUNGS:
        raise InvalidInput(f"bad_{name}", f"The {name} ladder has {len(set(values))} steps; the most is {MAX_RUNGS}.")
    return sorted(set(values))


def sweep_plan_parse(raw: Mapping[str, Any]) -> SweepPlan:
    """The request's numbers checked on their own (no rig needed): ladders, reply length, the force flag."""
    model = raw.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > 200:
        raise InvalidInput("bad_model", "Name the model to sweep (one the rig serves).")
    try:
        max_tokens = numbers.parse_int(raw.get("max_tokens", 64), name="max_tokens", low=MIN_TOKENS, high=MAX_TOKENS)
    except numbers.BadNumber:
        raise InvalidInput(
            "bad_max_tokens", f"Tokens per reply must be a whole number, {MIN_TOKENS} to {MAX_TOKENS}."
        ) from None
    force = raw.get("force", False)
    return SweepPlan(
        model=model.strip(),
        contexts=_ladder(raw.get("contexts"), "contexts", low=MIN_CONTEXT, high=1_048_576),
        sessions=_ladder(raw.get("sessions"), "sessions", low=1, high=256),
        max_tokens=max_tokens,
        force=force is True or str(force).lower() in ("1", "true", "on", "yes"),
    )


def _rig_check(rig: Rig, plan: SweepPlan) -> None:
    """What only the rig can say: its model, its context per slot, its slots, whether it is busy or sweeping."""
    if plan.sessions[-1] > rig.capacity:
        raise InvalidInput(
            "ladder_past_slots",
            f"Rig {rig.name} decodes {rig.capacity} turns at once; the sessions ladder goes to {plan.sessions[-1]}.",
        )
    if Sweep.objects.filter(rig=rig, status=Sweep.Status.RUNNING).exists():
        raise InvalidInput("sweep_running", f"A sweep of rig {rig.name} is running; wait for it or cancel it.")
    busy = Turn.objects.filter(rig=rig, status__in=Turn.ACTIVE).count()  # its own and those handed to it
    if busy and not plan.force:
        raise InvalidInput(
            "rig_busy",
            f"Rig {rig.name} has {busy} turns waiting or running: its figures would mix with theirs. "
            "Start it when the rig is idle, or force it.",
        )
    backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)

    async def read() -> tuple[list[str], int | None]:
        served = [model.name for model in await backend.list_models()]
        return served, await backend.context_window(plan.model) if plan.model in served else None

    try:
        served, n_ctx = asyncio.run(read())
    except BackendError as exc:
        raise InvalidInput("rig_unreachable", f"Rig {rig.name} did not answer: {exc}") from None
    if plan.model not in served:
        raise InvalidInput(
            "model_not_served",
            f"Rig {rig.name} does not serve {plan.model!r}; it serves {', '.join(served) or 'none'}.",
        )
    if n_ctx is not None and plan.contexts[-1] + plan.max_tokens > n_ctx:
        raise InvalidInput(
            "ladder_past_context",
            f"Rig {rig.name} gives each session {n_ctx} tokens of context; the longest prompt ({plan.contexts[-1]}) "
            f"and its reply ({plan.max_tokens}) need {plan.contexts[-1] + plan.max_tokens}.",
        )


def _quota_check(owner_id: int, plan: SweepPlan) -> None:
    """The sweep's turns are its owner's: refuse at once what their limits would refuse at some step."""
    limits = quotas.limits_for(owner_id)
    problems = []
    if limits.max_concurrent_turns is not None and plan.sessions[-1] > limits.max_concurrent_turns:
        problems.append(f"{plan.sessions[-1]} sessions at once against your limit of {limits.max_concurrent_turns}")
    if limits.max_tokens_per_reply is not None and plan.max_tokens > limits.max_tokens_per_reply:
        problems.append(f"{plan.max_tokens} tokens per reply against your limit of {limits.max_tokens_per_reply}")
    if limits.max_context_tokens is not None and plan.contexts[-1] > limits.max_context_tokens:
        problems.append(f"a {plan.contexts[-1]}-token prompt against your limit of {limits.max_context_tokens}")
    if problems:
        raise InvalidInput(
            "ladder_past_quota", "The sweep's turns are yours and over your quota: " + "; ".join(problems)
        )


def sweep_start(*, actor: AbstractBaseUser | AnonymousUser, rig_id: Any, raw: Mapping[str, Any]) -> Sweep:
    """Check everything, store the sweep and queue its driver after the commit; InvalidInput, with nothing stored,
    for any bad input."""
    admin = require_staff(actor)
    try:
        rig_id = numbers.parse_int(rig_id, name="rig", low=1, high=2**31 - 1)
    except numbers.BadNumber:
        raise NotFound("rig") from None
    rig = Rig.objects.filter(pk=rig_id, enabled=True).first()
    if rig is None:
        raise NotFound("rig")
    plan = sweep_plan_parse(raw)
    if plan.max_tokens > settings.RIGDASH.max_reply_tokens:
        raise InvalidInput(
            "bad_max_tokens", f"Tokens per reply: RigDash caps replies at {settings.RIGDASH.max_reply_tokens}."
        )
    _quota_check(admin.pk, plan)
    _rig_check(rig, plan)
    try:
        with transaction.atomic():
            sweep = Sweep.objects.create(
                rig=rig,
                owner=admin,
                model_name=plan.model,
                contexts=plan.contexts,
                sessions=plan.sessions,
                max_tokens=plan.max_tokens,
                forced=plan.force,
            )
            audit_record(
                actor=admin,
                action="sweep.start",
                target=f"rig:{rig.name}",
                detail={"sweep": sweep.pk, "model": plan.model, "contexts": plan.contexts, "sessions": plan.sessions},
            )
            transaction.on_commit(lambda: _advance_later(sweep.pk, countdown=0))
    except IntegrityError:  # another start won the race (Sweep's sweep_one_running constraint)
        raise InvalidInput(
            "sweep_running", f"A sweep of rig {rig.name} is running; wait for it or cancel it."
        ) from None
    _publish(sweep)
    return sweep


def sweep_cancel(*, actor: AbstractBaseUser | AnonymousUser, sweep_id: Any) -> Sweep:
    """Stop a running sweep: no further step starts and its waiting or running turns are cancelled (their slots
    free as any cancelled turn's). A sweep that already ended is refused."""
    admin = require_staff(actor)
    sweep = sweep_rows.sweep_get(sweep_id)
    if sweep is None:
        raise NotFound("sweep")
    with transaction.atomic():
        # Waits for a driver that holds the row while it submits a step, so that step's turns are seen below.
        stopped = Sweep.objects.filter(pk=sweep.pk, status=Sweep.Status.RUNNING).update(
            status=Sweep.Status.CANCELLED, finished_at=timezone.now()
        )
        if not stopped:
            raise InvalidInput("sweep_finished", "That sweep has already ended.")
        audit_record(actor=admin, action="sweep.cancel", target=f"rig:{sweep.rig.name}", detail={"sweep": sweep.pk})
    for turn in Turn.objects.select_related("session").filter(sweep_point__sweep=sweep, status__in=Turn.ACTIVE):
        try:
            turn_cancel(turn=turn)
        except InvalidInput:  # it ended meanwhile
            continue
    sweep.refresh_from_db()
    _publish(sweep)
    return sweep


def sweep_advance(*, sweep_id: int) -> str:
    """The driver, one look: submit the next step, or wait for the running one's turns, or record it and go on."""
    seen = Sweep.objects.select_related("rig", "owner").filter(pk=sweep_id).first()
    if seen is None or seen.status != Sweep.Status.RUNNING:
        return "ended"
    filler, look_s = None, LOOK_MIN_S
    if not seen.points.filter(step=seen.step).exists():
        # Counted before the transaction: the backend's answers are not worth holding the sweep's row (or, on
        # SQLite, the database's write lock) for.
        try:
            filler = prompt_filler(seen.rig, seen.model_name, seen.steps[seen.step][0])
        except BackendError as exc:
            outcome = _fail(seen, f"Rig {seen.rig.name} could not count the prompt's tokens: {exc}")
            return _looked(seen, outcome, [], look_s)
    try:
        with transaction.atomic():
            sweep = locking(Sweep.objects.select_related("rig", "owner").filter(pk=sweep_id)).first()
            if sweep is None or sweep.status != Sweep.Status.RUNNING or sweep.step != seen.step:
                return "ended" if sweep is None or sweep.status != Sweep.Status.RUNNING else "moved"
            points = list(sweep.points.filter(step=sweep.step).select_related("turn", "turn__session"))
            measured = [p for p in points if not p.warmup]
            if not points:
                outcome = _step_submit(sweep, filler, warmup=True) if filler is not None else "waiting"
            elif any(p.turn is not None and p.turn.status in Turn.ACTIVE for p in points):
                outcome, look_s = "waiting", _look_after(points)
            elif not measured:
                outcome = _step_warmed(sweep, points)
            else:
                points = measured
                outcome = _step_record(sweep, points)
    except QueueUnavailable:  # the step's turns are stored and wait for the task queue (dispatch sends them later)
        outcome = "submitted"
        sweep, points = seen, []
    return _looked(sweep, outcome, points if outcome in ("recorded", "done", "failed") else [], look_s)


def _look_after(points: Sequence[SweepPoint]) -> float:
    submitted = min((p.turn.created_at for p in points if p.turn is not None), default=timezone.now())
    elapsed_s = (timezone.now() - submitted).total_seconds()
    return min(LOOK_MAX_S, max(LOOK_MIN_S, elapsed_s * LOOK_FRACTION))


def _looked(sweep: Sweep, outcome: str, recorded: Sequence[SweepPoint], look_s: float) -> str:
    """After a look: queue the next one while the sweep runs; tell the pages and the board of any change."""
    Sweep.objects.filter(pk=sweep.pk).update(looked_at=timezone.now())
    if outcome in ("submitted", "waiting", "recorded"):
        _advance_later(sweep.pk, countdown=0 if outcome == "recorded" else look_s)
    if outcome != "waiting":
        sweep.refresh_from_db()
        _publish(sweep, points=[sweep_rows.point_row(p) for p in recorded if not p.warmup])
    return outcome


class _StepRefused(Exception):
    pass


def _step_submit(sweep: Sweep, filler: str, *, warmup: bool) -> str:
    """Submit N turns of the step in one burst, each in a session of its own holding the step's filler: first the
    warm-up turns (one token of reply), then, in new sessions, the measured ones."""
    context, count = sweep.steps[sweep.step]
    params = {"max_tokens": 1 if warmup else sweep.max_tokens, "temperature": 0.0, "seed": 1}
    what = "warm-up" if warmup else "at once"
    try:
        with transaction.atomic():  # a refused step leaves no sessions behind
            sessions = [
                ChatSession.objects.create(
                    owner=sweep.owner,
                    rig=sweep.rig,
                    model_name=sweep.model_name,
                    title=f"Sweep {sweep.pk}: {context} tokens, {count} {what} ({i + 1}/{count})",
                    context_messages=[{"role": "system", "content": filler}],
                )
                for i in range(count)
            ]
            results = turn_submit_many([SubmitRequest(sweep.owner, s.pk, INSTRUCTION, params) for s in sessions])
            refused = next((r for r in results if isinstance(r, InvalidInput)), None)
            if refused is not None:  # e.g. a quota changed since the start: nothing of the step runs
                raise _StepRefused(refused.message)
            # A turn stored while the task queue is down waits in the fair queue and starts when it is back.
            turns = Turn.objects.filter(session__in=sessions).order_by("id")
            SweepPoint.objects.bulk_create(
                SweepPoint(
                    sweep=sweep, step=sweep.step, context_target=context, sessions=count, turn=turn, warmup=warmup
                )
                for turn in turns
            )
    except _StepRefused as exc:
        return _fail(sweep, f"Step {sweep.step + 1}: {exc}")
    return "submitted"


def _step_warmed(sweep: Sweep, warmups: Sequence[SweepPoint]) -> str:
    """The warm-up turns ended: the backend holds the step's prompt in each slot they used, so the measured turns,
    the same prompt, start decoding together instead of one decoding while another's prompt is read (which a
    decode rate of the first would count as its own time)."""
    for point in warmups:
        point.status = point.turn.status if point.turn is not None else "deleted"
        point.save(update_fields=["status"])
    bad = next((p for p in warmups if p.status != Turn.Status.DONE), None)
    if bad is not None or warmups[0].turn is None:
        why = bad.turn.error if bad is not None and bad.turn is not None and bad.turn.error else "a warm-up turn failed"
        return _fail(sweep, f"Step {sweep.step + 1}: {why}")
    filler = warmups[0].turn.session.context_messages[0]["content"]
    return _step_submit(sweep, filler, warmup=False)


def _step_record(sweep: Sweep, points: Sequence[SweepPoint]) -> str:
    """Every turn of the step ended: store what each measured; a turn that did not finish fails the sweep."""
    for point in points:
        _point_measure(sweep.rig_id, point)
        point.save()
    bad = next((p for p in points if p.status != Turn.Status.DONE), None)
    if bad is not None:
        why = bad.turn.error if bad.turn is not None and bad.turn.error else f"a turn ended {bad.status or 'deleted'}"
        return _fail(sweep, f"Step {sweep.step + 1}: {why}")
    step = sweep.step + 1
    done = step >= len(sweep.steps)
    Sweep.objects.filter(pk=sweep.pk, status=Sweep.Status.RUNNING).update(
        step=step,
        **({"status": Sweep.Status.DONE, "finished_at": timezone.now()} if done else {}),
    )
    return "done" if done else "recorded"


def _point_measure(rig_id: int, point: SweepPoint) -> None:
    """A point's figures from its turn's stats: decode tokens/s (the backend's), the mean context while decoding
    (prompt plus half the reply, as the calculator's measured points) and how many of the rig's turns were running at
    its midpoint."""
    turn = point.turn
    if turn is None:
        point.status = "deleted"
        return
    point.status = turn.status
    stats = turn.stats or {}
    output = stats.get("output_tokens") or turn.output_tokens
    context = stats.get("context_tokens")
    point.output_tokens = output
    # The backend's own rate (llama-server's predicted_per_second, its clock): a short reply's rate from arrival
    # times at the worker moves with how late its first token was read. RigDash's figure where there is no other.
    point.decode_tps = stats.get("backend_decode_tps") or stats.get("decode_tps")
    if context and output is not None:
        point.prompt_tokens = context - output
        point.context_mean = context - output / 2
    if turn.started_at and turn.finished_at:
        middle = turn.started_at + (turn.finished_at - turn.started_at) / 2
        point.decoding_together = (
            Turn.objects.filter(rig_id=rig_id, started_at__lte=middle)  # the turns the rig ran
            .filter(Q(finished_at__gte=middle) | Q(finished_at__isnull=True))
            .count()
        )


def _fail(sweep: Sweep, message: str) -> str:
    Sweep.objects.filter(pk=sweep.pk, status=Sweep.Status.RUNNING).update(
        status=Sweep.Status.FAILED, error=message[:2000], finished_at=timezone.now()
    )
    return "failed"


def prompt_filler(rig: Rig, model: str, tokens: int) -> str:
    """Filler text that makes a sweep turn's prompt (the filler as its system message, then ``INSTRUCTION``) the
    given number of tokens, counted by the backend's own template and tokenizer; a backend that cannot count gets
    RigDash's estimate (the turn's ``prompt_n`` then says what it was)."""
    backend = backend_for(rig, timeout_s=COUNT_TIMEOUT_S)

    def messages(filler: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": filler}, {"role": "user", "content": INSTRUCTION}]

    async def count(filler: str) -> int:
        return await backend.prompt_tokens(model, messages(filler))

    try:
        base = asyncio.run(count(""))
    except BackendNotSupported:
        per_char = estimate_tokens(FILLER) / len(FILLER)
        return _cut(FILLER, max(0, round((tokens - estimate_tokens(INSTRUCTION) - 16) / per_char)))
    sample = FILLER * 16
    per_char = (asyncio.run(count(sample)) - base) / len(sample)
    chars = max(0, round((tokens - base) / per_char))
    best = (tokens, chars)  # (miss in tokens, characters)
    # Refine: a few counts bring it to the length asked for (a miss is mostly a word cut at the end).
    for _ in range(PROMPT_COUNTS):
        got = asyncio.run(count(_cut(FILLER, chars)))
        best = min(best, (abs(got - tokens), chars))
        if got == tokens:
            break
        step = round((tokens - got) / per_char)
        chars = max(0, chars + (step or (1 if got < tokens else -1)))
    return _cut(FILLER, best[1])


def _cut(unit: str, chars: int) -> str:
    """``unit`` repeated to ``chars`` characters."""
    return (unit * (chars // len(unit) + 1))[:chars]


def sweeps_resume(*, silent_s: float = RESUME_AFTER_S) -> list[int]:
    """Beat's safety net: queue a look for each running sweep whose driver has not looked for ``silent_s`` (its
    Celery message was lost, e.g. with the worker that held it); the sweeps resumed. A look never waits longer than
    ``LOOK_MAX_S``, so a live driver is never doubled."""
    quiet_since = timezone.now() - timedelta(seconds=silent_s)
    stalled = Sweep.objects.filter(status=Sweep.Status.RUNNING).filter(
        Q(looked_at__lt=quiet_since) | Q(looked_at__isnull=True, created_at__lt=quiet_since)
    )
    resumed = list(stalled.values_list("pk", flat=True))
    for sweep_id in resumed:
        log.warning("sweep %s: no look for %g s; its driver is queued again", sweep_id, silent_s)
        Sweep.objects.filter(pk=sweep_id).update(looked_at=timezone.now())
        _advance_later(sweep_id, countdown=0)
    return resumed


def _advance_later(sweep_id: int, *, countdown: float) -> None:
    """Queue the driver's next look on the default queue: a rig's worker runs as many threads as the rig has slots,
    and a driver among them would wait behind the very turns it submitted (the rig's queue is first in, first out)."""
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    current_app.tasks[ADVANCE_TASK].apply_async(
        args=[sweep_id], countdown=countdown, queue=queue, exchange="", routing_key=queue
    )


def _publish(sweep: Sweep, *, points: list[dict[str, Any]] | None = None) -> None:
    try:
        events.sweep_progress_sync(sweep=sweep_rows.sweep_snapshot(sweep, points=False), points=points)
    except Exception:  # a page that misses it reads the state when it opens; the sweep goes on
        log.warning("sweep %s: its progress could not be published", sweep.pk, exc_info=True)
