"""Chat sessions and the rigs they run on: which models a rig serves, a new session."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth.models import User

from inference.backends import backend_for, backend_supports, capabilities
from inference.backends.base import BackendError, ModelInfo, user_message
from inference.errors import InvalidInput
from inference.live import served
from inference.models import ChatSession, Rig
from inference.queue import placement

log = logging.getLogger(__name__)


def rig_models(rig: Rig, *, fresh: bool = False) -> list[ModelInfo]:
    """The models the rig serves: the list kept from the last minute (inference/live/served.py), else (or when
    ``fresh``) its backend's answer now, which is kept for the next ones. Raises BackendError when it cannot say."""
    if not fresh and (kept := served.served_get(rig.pk)) is not None:
        return kept
    return _read_models(rig)


def rigs_models(rigs: list[Rig]) -> dict[int, list[ModelInfo] | None]:
    """The kept lists of several rigs in one round trip, None where none is kept (``rig_models`` asks the backend)."""
    return served.served_get_many([rig.pk for rig in rigs])


def rig_serves(rig: Rig, model_name: str) -> bool:
    """Whether the rig serves ``model_name``: by the kept list, and by its backend now when that list lacks it (a model
    pulled a moment ago). Raises BackendError when the backend cannot say."""
    return any(m.name == model_name for m in rig_models(rig)) or any(
        m.name == model_name for m in rig_models(rig, fresh=True)
    )


def rigs_loaded_models(rigs: Iterable[Rig]) -> dict[int, list[str] | None]:
    """The models each rig's server holds in memory now, by rig id: as its sampler last kept them (one read for all:
    inference/live/served.py; a sleeping server holds none), else asked of its backend where it loads models on
    demand (a llama-server router's loaded instances, Ollama's ``/api/ps``; one that cannot say holds none); None for
    any other, which holds every model it serves for as long as it runs."""
    rigs = list(rigs)
    kept = served.loaded_get_many([rig.pk for rig in rigs])
    return {rig.pk: sorted(names) if (names := kept.get(rig.pk)) is not None else _loaded_asked(rig) for rig in rigs}


def _loaded_asked(rig: Rig) -> list[str] | None:
    if not capabilities(rig.kind).loads_on_demand or not backend_supports(rig.kind, "loaded_models"):
        return None
    backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)
    try:
        return [model.name for model in asyncio.run(backend.loaded_models())]
    except BackendError:
        return []  # a rig that cannot answer now holds nothing a request could use


def _read_models(rig: Rig) -> list[ModelInfo]:
    backend = backend_for(rig, timeout_s=settings.RIGDASH.backend_health_timeout_s)
    models = asyncio.run(backend.list_models())
    served.served_store(rig.pk, models)
    rig.record_models(model.name for model in models)  # what placement reads (inference/queue/placement.py)
    return models


def session_create_placed(*, owner: User, model_name: str) -> ChatSession:
    """A chat whose every turn goes to an enabled rig serving ``model_name`` (inference/queue/placement.py); its
    ``rig`` starts as the first that serves it and follows its turns."""
    if not isinstance(model_name, str) or not model_name:
        raise InvalidInput("unknown_model", "Choose a model.")
    rigs = placement.rigs_serving(model_name)  # as the rigs last said: the chat list asked them all first
    if not rigs:
        raise InvalidInput("unknown_model", f"No enabled rig serves a model named {model_name!r}.")
    return ChatSession.objects.create(
        owner=owner, rig=rigs[0], model_name=model_name, placement=ChatSession.Placement.MODEL
    )


def session_create(*, owner: User, rig: Rig, model_name: str) -> ChatSession:
    if not rig.enabled:
        raise InvalidInput("rig_disabled", f"rig {rig.name} is disabled")
    try:
        known = rig_serves(rig, model_name)
    except BackendError as exc:
        log.warning("rig %s: listing models failed: %s", rig.name, exc)  # the detail, for staff, in the log
        raise InvalidInput("backend_unavailable", user_message(rig.name, exc)) from exc
    if not known:
        raise InvalidInput("unknown_model", f"rig {rig.name} does not serve a model named {model_name!r}")
    return ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)
