"""Chat sessions and the rigs they run on: which models a rig serves, a new session."""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings
from django.contrib.auth.models import User

from inference.backends import backend_for
from inference.backends.base import BackendError, ModelInfo, user_message
from inference.errors import InvalidInput
from inference.models import ChatSession, Rig

log = logging.getLogger(__name__)


def rig_models(rig: Rig) -> list[ModelInfo]:
    """The models the rig's backend serves now (raises BackendError when it cannot say); remembered on the rig for
    placement (inference/queue/placement.py)."""
    backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)
    models = asyncio.run(backend.list_models())
    rig.record_models(model.name for model in models)
    return models


def placed_models() -> dict[str, list[Rig]]:
    """The models a chat can target rather than a rig, each with the enabled rigs that serve it, as they last said
    (the chat list asks every rig first, which refreshes this)."""
    found: dict[str, list[Rig]] = {}
    for rig in Rig.objects.filter(enabled=True).order_by("pk"):
        for name in rig.models_served or ():
            found.setdefault(name, []).append(rig)
    return dict(sorted(found.items()))


def session_create_placed(*, owner: User, model_name: str) -> ChatSession:
    """A chat whose every turn goes to an enabled rig serving ``model_name`` (inference/queue/placement.py); its
    ``rig`` starts as the first that serves it and follows its turns."""
    if not isinstance(model_name, str) or not model_name:
        raise InvalidInput("unknown_model", "Choose a model.")
    rigs = placed_models().get(model_name)
    if not rigs:
        raise InvalidInput("unknown_model", f"No enabled rig serves a model named {model_name!r}.")
    return ChatSession.objects.create(
        owner=owner, rig=rigs[0], model_name=model_name, placement=ChatSession.Placement.MODEL
    )


def session_create(*, owner: User, rig: Rig, model_name: str) -> ChatSession:
    if not rig.enabled:
        raise InvalidInput("rig_disabled", f"rig {rig.name} is disabled")
    try:
        served = {model.name for model in rig_models(rig)}
    except BackendError as exc:
        log.warning("rig %s: listing models failed: %s", rig.name, exc)  # the detail, for staff, in the log
        raise InvalidInput("backend_unavailable", user_message(rig.name, exc)) from exc
    if model_name not in served:
        raise InvalidInput("unknown_model", f"rig {rig.name} does not serve a model named {model_name!r}")
    return ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
