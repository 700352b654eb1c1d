"""Model management on a rig, for staff only: what is installed and loaded, pull, delete, load, unload.

Each admin action is one function (``model_pull``, ``model_delete``, ``model_load``, ``model_unload``), so an audit
record is one line in each. Views and the consumer check staff rights with ``rig_get_for_admin``
before calling anything here. A pull runs as a Celery task on the rig's queue and reports its progress
through ``events`` (group ``rig.<id>.models``); delete, load and unload are calls made in the request.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q

from inference import events
from inference.audit import audit_record
from inference.backends import backend_for, backend_supports
from inference.backends.base import BackendError, PullProgress
from inference.errors import InvalidInput, NotFound
from inference.live import served
from inference.models import Rig, Turn
from inference.worker import loop
from rigdash.access import is_staff

# Ollama's names: [host/][namespace/]model[:tag], letters, digits, "._-" (server/internal names).
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
MODEL_NAME_RE = re.compile(rf"^{_PART}(?:/{_PART}){{0,2}}(?::[A-Za-z0-9_][A-Za-z0-9._-]*)?$")
MODEL_NAME_MAX = 200
PROGRESS_INTERVAL_S = 0.25  # at most ~4 progress events a second per pull, plus one per status change
MODEL_PULL_TASK = "inference.model_pull"  # inference/tasks.py, looked up by name: entry points sit above
ACTIONS = {
    "pull": "pull_model", "delete": "delete_model", "load": "load_model", "unload": "unload_model",
    "loaded": "loaded_models",
}  # fmt: skip


def rig_get_for_admin(user: AbstractBaseUser | AnonymousUser, rig_id: Any) -> Rig:
    """The rig, for staff; NotFound for everyone else (the route looks exactly like one that does not exist)."""
    if not is_staff(user):
        raise NotFound("rig")
    try:
        return Rig.objects.get(pk=int(rig_id))
    except (Rig.DoesNotExist, ValueError, TypeError):
        raise NotFound("rig") from None


def model_name_validate(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidInput("bad_model_name", "Give a model name, e.g. llama3.2 or qwen2.5:0.5b.")
    name = raw.strip()
    if len(name) > MODEL_NAME_MAX or not MODEL_NAME_RE.match(name):
        raise InvalidInput(
            "bad_model_name",
            "A model name is [namespace/]model[:tag] in letters, digits, '.', '_' and '-' (e.g. qwen2.5:0.5b).",
        )
    return name


def _tagged(name: str) -> str:
    """Ollama's default tag: ``llama3.2`` and ``llama3.2:latest`` are the same model."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _require(rig: Rig, action: str) -> None:
    if not backend_supports(rig.kind, ACTIONS[action]):
        raise InvalidInput("not_supported", f"{rig.get_kind_display()} rigs cannot {action} models from RigDash.")


def models_overview(rig: Rig) -> dict[str, Any]:
    """What the page shows: installed and loaded models, what this rig can do, and why a part is missing."""
    backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)
    capabilities = {action: backend_supports(rig.kind, method) for action, method in ACTIONS.items()}

    async def read() -> tuple[Any, Any]:
        loaded = backend.loaded_models() if capabilities["loaded"] else asyncio.sleep(0, result=[])
        results = await asyncio.gather(backend.list_models(), loaded, return_exceptions=True)
        return results[0], results[1]

    installed, loaded = asyncio.run(read())
    errors = []
    for label, result in (("list the installed models", installed), ("list the loaded models", loaded)):
        if isinstance(result, BaseException):
            if not isinstance(result, BackendError):
                raise result
            errors.append(f"Cannot {label}: {result}")
    return {
        "rig": {"id": rig.pk, "name": rig.name, "kind": rig.kind, "kind_label": rig.get_kind_display()},
        "capabilities": capabilities,
        "models": []
        if isinstance(installed, BaseException)
        else [{"name": m.name, "size_bytes": m.size_bytes, "details": m.details} for m in installed],
        "loaded": []
        if isinstance(loaded, BaseException)
        else [
            {
                "name": m.name,
                "size_bytes": m.size_bytes,
                "size_vram_bytes": m.size_vram_bytes,
                "context_length": m.context_length,
                "expires_at": m.expires_at,
            }
            for m in loaded
        ],
        "loaded_names": [] if isinstance(loaded, BaseException) else [m.name for m in loaded],
        "errors": errors,
    }


def model_pull(*, actor: AbstractBaseUser | AnonymousUser, rig: Rig, model: Any) -> str:
    """Queue a download of ``model`` on the rig's queue; progress arrives as events. Returns the pull id."""
    name = model_name_validate(model)
    _require(rig, "pull")
    pull_id = uuid.uuid4().hex
    current_app.tasks[MODEL_PULL_TASK].apply_async(args=[rig.pk, name, pull_id], queue=rig.queue)
    audit_record(actor=actor, action="model.pull", target=f"rig:{rig.pk}", detail={"model": name, "pull": pull_id})
    return pull_id


def model_delete(*, actor: AbstractBaseUser | AnonymousUser, rig: Rig, model: Any) -> str:
    """Delete a model from the rig, refusing while a chat turn uses it. Like ``ollama rm``, unload it first."""
    name = model_name_validate(model)
    _require(rig, "delete")
    running = Turn.objects.filter(
        Q(rig=rig) | Q(rig__isnull=True, session__rig=rig),
        session__model_name__in={name, _tagged(name)},
        status__in=Turn.ACTIVE,
    ).count()
    if running:
        raise InvalidInput(
            "model_in_use",
            f"{name} is answering {running} chat repl{'y' if running == 1 else 'ies'} now; "
            "stop them or let them finish, then delete it.",
        )
    backend = backend_for(rig)

    async def unload_then_delete() -> None:
        if backend_supports(rig.kind, "unload_model"):
            await backend.unload_model(name)
        await backend.delete_model(name)

    asyncio.run(unload_then_delete())
    served.served_forget(rig.pk)
    audit_record(actor=actor, action="model.delete", target=f"rig:{rig.pk}", detail={"model": name})
    events.models_changed_sync(rig_id=rig.pk, action="deleted", model=name)
    return name


def model_load(*, actor: AbstractBaseUser | AnonymousUser, rig: Rig, model: Any) -> str:
    """Load a model into memory now (llama-server's router mode), so that the next chat on it does not wait."""
    name = model_name_validate(model)
    _require(rig, "load")
    asyncio.run(backend_for(rig).load_model(name))
    audit_record(actor=actor, action="model.load", target=f"rig:{rig.pk}", detail={"model": name})
    events.models_changed_sync(rig_id=rig.pk, action="loaded", model=name)
    return name


def model_unload(*, actor: AbstractBaseUser | AnonymousUser, rig: Rig, model: Any) -> str:
    """Free the memory a loaded model holds (a reply in progress on it finishes first)."""
    name = model_name_validate(model)
    _require(rig, "unload")
    asyncio.run(backend_for(rig).unload_model(name))
    audit_record(actor=actor, action="model.unload", target=f"rig:{rig.pk}", detail={"model": name})
    events.models_changed_sync(rig_id=rig.pk, action="unloaded", model=name)
    return name


def model_pull_run(*, rig_id: int, model: str, pull_id: str) -> str:
    """The worker side of ``model_pull``: stream the download's progress to the rig's admin pages."""
    rig = Rig.objects.get(pk=rig_id)
    return loop.run(_pull(rig, model, pull_id))


async def _pull(rig: Rig, model: str, pull_id: str) -> str:
    backend = backend_for(rig)
    last_sent, last_status = 0.0, ""
    try:
        steps = cast(AsyncGenerator[PullProgress, None], backend.pull_model(model))
        async with aclosing(steps):
            async for step in steps:
                now = time.monotonic()
                # Ollama reports many steps a second per layer: send each new status (a new layer), a layer's
                # completion and the end, and otherwise at most a few a second.
                layer_done = bool(step.total) and step.completed == step.total
                if step.done or layer_done or step.status != last_status or now - last_sent >= PROGRESS_INTERVAL_S:
                    last_sent, last_status = now, step.status
                    await events.models_pull_progress(
                        rig_id=rig.pk,
                        pull_id=pull_id,
                        model=model,
                        status=step.status,
                        digest=step.digest,
                        total=step.total,
                        completed=step.completed,
                    )
    except BackendError as exc:
        error = {"code": exc.code, "message": str(exc)}
        await events.models_pull_end(rig_id=rig.pk, pull_id=pull_id, model=model, ok=False, error=error)
        return "failed"
    await asyncio.to_thread(served.served_forget, rig.pk)
    await events.models_pull_end(rig_id=rig.pk, pull_id=pull_id, model=model, ok=True)
    return "done"
