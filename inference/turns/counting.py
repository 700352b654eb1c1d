"""An API request's prompt counted on the rig that would serve it, without running it (Anthropic's
``/v1/messages/count_tokens``, OpenAI's ``/v1/responses/input_tokens``): not a turn, so not queued and not on the
board; it counts as a request in the minute's rate limits, since it is one the rig answers (docs/openai.md,
"Anthropic's Messages API"). A model its rig's server does not hold now is refused where the server loads models on
demand: counting would load it outside the fair queue. The rig's server is asked only on the event loop, never on a
database thread, so an unreachable rig holds no thread another rig's requests need."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from inference.backends import backend_for, backend_supports, capabilities
from inference.backends.base import Backend, same_model
from inference.errors import InvalidInput
from inference.live import served
from inference.models import ApiKey, ChatSession, Rig
from inference.queue import ratelimits

# A count reads the request and tokenizes it; a large prompt takes the server a while.
COUNT_TIMEOUT_S = 10.0


def api_count_admit(*, key: ApiKey, rig: Rig, model: str) -> set[str] | None:
    """Admit a count of ``key``'s for ``model`` on ``rig``, or raise: RateLimited (the key's or its owner's requests
    per minute; an admitted count is one of them), or InvalidInput ``model_not_loaded`` where the rig's kept list of
    loaded models (inference/live/served.py) leaves the model out. The kept list, or None where there is none."""
    kept = served.loaded_get_many([rig.pk]).get(rig.pk)
    if kept is not None:
        _loaded_or_refused(rig, model, kept)
    ratelimits.rate_check_submit(session=ChatSession(owner_id=key.owner_id, api_key_id=key.pk))
    return kept


async def api_input_tokens(*, rig: Rig, model: str, body: dict[str, Any], kept: set[str] | None) -> int:
    """The tokens the OpenAI chat request ``body`` (its ``model`` the server's name) makes as its prompt on ``rig``.
    ``kept``: ``api_count_admit``'s answer; without one, a server that loads models on demand is asked which it holds
    first (InvalidInput where not this one). BackendError as the backend failed (BackendNotSupported: its kind cannot
    count)."""
    return await (await _holding(rig, model, kept)).input_tokens(body)


async def api_tokens_convert(*, rig: Rig, model: str, body: dict[str, Any], kept: set[str] | None,
                             way: str) -> dict[str, Any]:  # fmt: skip
    """llama-server's own ``/tokenize`` (``way`` "tokenize") or ``/detokenize`` answer to ``body`` on ``rig``, as
    ``api_input_tokens`` asks (BackendNotSupported: its kind has neither)."""
    backend = await _holding(rig, model, kept)
    return await (backend.tokenize(body) if way == "tokenize" else backend.detokenize(body))


async def _holding(rig: Rig, model: str, kept: set[str] | None) -> Backend:
    """``rig``'s backend, once it is known to hold ``model`` now (InvalidInput where a server that loads models on
    demand does not)."""
    backend = backend_for(rig, timeout_s=max(COUNT_TIMEOUT_S, settings.RIGDASH.backend_health_timeout_s))
    if kept is None and capabilities(rig.kind).loads_on_demand and backend_supports(rig.kind, "loaded_models"):
        _loaded_or_refused(rig, model, {loaded.name for loaded in await backend.loaded_models()})
    return backend


def _loaded_or_refused(rig: Rig, model: str, loaded: set[str]) -> None:
    if not any(same_model(name, model) for name in loaded):
        raise InvalidInput(
            "model_not_loaded",
            f"The model '{model}' is not loaded on rig {rig.name} now, and reading its tokens would load it outside "
            "the fair queue. A request for it loads it in its turn.",
        )
