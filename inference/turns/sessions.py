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
    """The models the rig's backend serves now (raises BackendError when it cannot say)."""
    backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)
    return asyncio.run(backend.list_models())


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
