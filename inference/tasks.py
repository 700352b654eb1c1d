"""Thin Celery tasks: take an id, call one service. Their names are the contract with senders (the queue and the
board send them by name: inference/queue/dispatch.py, inference/board/model_admin.py)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from inference.board import apikeys, model_admin, sweeps
from inference.queue import dispatch
from inference.turns import api, lifecycle
from inference.worker import queues, start


@shared_task(name="inference.turn_run")
def turn_run_task(turn_id: int) -> str:
    return start.turn_run(turn_id)


@shared_task(name="inference.turns_run")
def turns_run_task(
    turn_ids: list[int], tickets: list[dict[str, Any]] | None = None, rig_id: int | None = None, **later: Any
) -> dict[int, str]:
    # ``later``: arguments a later release's dispatch adds, which this release does without (a rig agent upgraded
    # after the central side), rather than fail the task.
    return start.turns_run(turn_ids, tickets=tickets, rig_id=rig_id)


@shared_task(name="inference.turn_reap_stale")
def turn_reap_stale_task(older_than_s: float = 60.0) -> list[int]:
    return lifecycle.turn_reap_stale(older_than_s=older_than_s)


@shared_task(name="inference.model_pull")
def model_pull_task(rig_id: int, model: str, pull_id: str) -> str:
    return model_admin.model_pull_run(rig_id=rig_id, model=model, pull_id=pull_id)


@shared_task(name="inference.dispatch_all")
def dispatch_all_task(resend_after_s: float = 120.0) -> dict[str, list[int]]:
    return {**dispatch.dispatch_all(resend_after_s=resend_after_s), "failed": lifecycle.turns_fail_where_agent_down()}


@shared_task(name="inference.sweep_advance")
def sweep_advance_task(sweep_id: int) -> str:
    return sweeps.sweep_advance(sweep_id=sweep_id)


@shared_task(name="inference.sweeps_resume")
def sweeps_resume_task(silent_s: float = 60.0) -> list[int]:
    return sweeps.sweeps_resume(silent_s=silent_s)


@shared_task(name=queues.TASK)
def worker_queues_reconcile_task() -> dict[str, Any]:
    done = queues.reconcile()
    return {"added": done.added, "cancelled": done.cancelled, "error": done.error}


@shared_task(name="inference.api_keys_expire")
def api_keys_expire_task() -> list[int]:
    return apikeys.api_keys_expired_cancel()


@shared_task(name="inference.api_texts_forget")
def api_texts_forget_task(older_than_s: float = 900.0) -> list[int]:
    return api.api_texts_forget_ended(older_than_s=older_than_s)
