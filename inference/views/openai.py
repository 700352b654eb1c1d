"""The OpenAI-compatible API's edge (/v1/): API-key authentication, OpenAI's error shape and the model list (a
request body is read in inference/views/openai_request.py).

Protocol: https://platform.openai.com/docs/api-reference (``GET /v1/models``, ``POST /v1/chat/completions``).
Requests authenticate with a RigDash API key only (``Authorization: Bearer rdk_...``), never a session cookie,
which is why these views need no CSRF token.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from inference.backends import backend_supports
from inference.backends.base import BackendError, ModelInfo, same_model
from inference.board import apikeys
from inference.models import Rig
from inference.turns.selectors import rig_list_enabled
from inference.turns.sessions import rig_models, rigs_loaded_models, rigs_models
from inference.views.openai_request import BadRequest, chat_request_parse

__all__ = ["BadRequest", "chat_request_parse"]  # read here by the API's views and tests


def openai_error(status: int, message: str, *, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> JsonResponse:  # fmt: skip
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JsonResponse(body, status=status)


def error_words(response: HttpResponse) -> str | None:
    """The message of an error answer in OpenAI's shape (``openai_error``), for another API's shape of it; None for
    an answer that is not one."""
    try:
        error = json.loads(response.content).get("error")
    except (ValueError, AttributeError):
        return None
    return str(error.get("message") if isinstance(error, dict) else error)


View = Callable[..., HttpResponse]


def key_authenticated(
    request: HttpRequest, refused: Callable[[apikeys.KeyRejected], HttpResponse], *, remembered: bool = False
) -> HttpResponse | None:
    """The key from ``Authorization: Bearer``, or where there is none from ``X-Api-Key`` (as Anthropic's SDKs and
    llama-server's ``--api-key`` clients send it), as ``request.api_key``; else ``refused(why)``. ``remembered``: it
    may come from memory (``key_checked``), for a caller that confirms it before any answer."""
    header = request.headers.get("Authorization", "")
    if not header and (key := request.headers.get("X-Api-Key", "").strip()):
        header = f"Bearer {key}"
    try:
        request.api_key = apikeys.api_key_authenticate(header, remembered=remembered)  # type: ignore[attr-defined]
    except apikeys.KeyRejected as exc:
        return refused(exc)
    return None


def key_refused(exc: apikeys.KeyRejected) -> HttpResponse:
    """OpenAI's 401 for a key refused (``apikeys.KeyRejected``)."""
    response = openai_error(401, exc.message, code="invalid_api_key")
    response["WWW-Authenticate"] = 'Bearer realm="rigdash-api"'
    return response


def key_required(view: View) -> View:
    """Authenticate by API key; the view gets ``request.api_key`` and ``request.user`` (the key's owner)."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            key = apikeys.api_key_authenticate(request.headers.get("Authorization", ""))
        except apikeys.KeyRejected as exc:
            return key_refused(exc)
        request.api_key = key  # type: ignore[attr-defined]
        request.user = key.owner
        return view(request, *args, **kwargs)

    return wrapped


@dataclass(frozen=True)
class CatalogueEntry:
    """A model id of the API. ``<model>``: any enabled rig serving it, each request placed on one with a free slot
    (inference/queue/placement.py); ``<rig>/<model>``: that rig only, listed where several rigs serve the model."""

    id: str
    rig: Rig  # the rig, or for a placed id the first that serves it (``owned_by``)
    model: str
    context_length: int | None = None
    placed: bool = False
    context_source: str | None = None  # where context_length comes from (ModelInfo.context_source)


def model_catalogue(*, within_s: float = 0.0) -> list[CatalogueEntry]:
    """Every model the enabled rigs serve (a rig whose backend cannot say is left out); the rigs' lists are the ones
    kept for pages (inference/live/served.py), not a backend round trip per request. ``within_s``: the one this process
    made last, if it is that recent (an early request's guess: the request's own checks read it anew)."""
    global _catalogue_made
    made_at, made = _catalogue_made
    if within_s and time.monotonic() - made_at < within_s:
        return made
    catalogue = _catalogue()
    _catalogue_made = (time.monotonic(), catalogue)
    return catalogue


_catalogue_made: tuple[float, list[CatalogueEntry]] = (float("-inf"), [])  # this process's last, and when


def _catalogue() -> list[CatalogueEntry]:
    found: list[tuple[Rig, ModelInfo]] = []
    rigs = list(rig_list_enabled().order_by("-is_default", "name"))
    kept = rigs_models(rigs)  # one round trip for every rig's kept list
    for rig in rigs:
        try:
            models = kept.get(rig.pk)
            found.extend((rig, m) for m in (rig_models(rig) if models is None else models))
        except BackendError:
            continue
    entries: dict[str, CatalogueEntry] = {}
    for rig, m in found:
        entries.setdefault(m.name, CatalogueEntry(m.name, rig, m.name, m.context_length, True, m.context_source))
    names = [m.name for _, m in found]
    pinned = [
        CatalogueEntry(f"{rig.name}/{m.name}", rig, m.name, m.context_length, context_source=m.context_source)
        for rig, m in found
        if names.count(m.name) > 1
    ]
    return [*entries.values(), *pinned]


def model_resolve(model_id: str, catalogue: list[CatalogueEntry]) -> CatalogueEntry | None:
    """The entry of ``model_id``; ``<rig>/<model>`` names that rig's model even where it is listed under its name."""
    by_id = next((entry for entry in catalogue if entry.id == model_id), None)
    if by_id is not None:
        return by_id
    pinned = next((e for e in catalogue if f"{e.rig.name}/{e.model}" == model_id), None)
    return None if pinned is None else dataclasses.replace(pinned, id=model_id, placed=False)


def catalogue_loaded(catalogue: list[CatalogueEntry]) -> set[str]:
    """The ids of ``catalogue`` held in memory now: a server that loads models on demand (a llama-server router,
    Ollama) is asked which (a router lists every model of its directory, loaded or not); any other holds every model
    it serves. A placed id is held where any rig serving its model holds it."""
    held = rigs_loaded_models({entry.rig for entry in catalogue})

    def loaded(entry: CatalogueEntry) -> bool:
        rigs = {e.rig.pk for e in catalogue if e.model == entry.model} if entry.placed else {entry.rig.pk}
        return any(held[pk] is None or any(same_model(name, entry.model) for name in held[pk] or []) for pk in rigs)

    return {entry.id for entry in catalogue if loaded(entry)}


def model_object(entry: CatalogueEntry, loaded: set[str]) -> dict[str, Any]:
    """OpenAI's model object, with RigDash's additions: the model's context for a request and where that figure comes
    from (``context_length_source``: the running server, a router's command line for it, its file's trained context;
    null where unknown), whether a server holds it in memory now (``loaded``), and what its rig's backend can be asked
    (an embeddings request may still be refused by a rig that does not serve them: llama-server without
    ``--embeddings``)."""
    return {"id": entry.id, "object": "model", "created": int(entry.rig.created_at.timestamp()),
            "owned_by": entry.rig.name, "context_length": entry.context_length,
            "context_length_source": entry.context_source if entry.context_length else None,
            "loaded": entry.id in loaded,
            "capabilities": {"chat_completions": True,
                             "embeddings": backend_supports(entry.rig.kind, "embeddings")}}  # fmt: skip


@key_required
def models_list(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return openai_error(405, "Use GET.", code="method_not_allowed")
    catalogue = model_catalogue()
    loaded = catalogue_loaded(catalogue)
    return JsonResponse({"object": "list", "data": [model_object(entry, loaded) for entry in catalogue]})


@key_required
def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    if request.method != "GET":
        return openai_error(405, "Use GET.", code="method_not_allowed")
    catalogue = model_catalogue()
    entry = model_resolve(model_id, catalogue)
    if entry is None:
        return openai_error(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model")
    return JsonResponse(model_object(entry, catalogue_loaded([entry, *catalogue])))
