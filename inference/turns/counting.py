"""An API request's prompt counted on the rig that would serve it, without running it (Anthropic's
``/v1/messages/count_tokens``): not a turn, so not queued and not on the board; it counts as a request in the
minute's rate limits, since it is one the rig answers (docs/openai.md, "Anthropic's Messages API")."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from inference.backends import backend_for
from inference.backends.base import same_model
from inference.errors import InvalidInput
from inference.models import ApiKey, ChatSession, Rig
from inference.queue import ratelimits
from inference.turns.sessions import rigs_loaded_models

# A count reads the request and tokenizes it; a large prompt takes the server a while.
COUNT_TIMEOUT_S = 10.0


def api_count_admit(*, key: ApiKey, rig: Rig, model: str) -> None:
    """Admit a count of ``key``'s for ``model`` on ``rig`` or raise: RateLimited (the key's or its owner's requests
    per minute; an admitted count is one of them), or InvalidInput ``model_not_loaded`` where the rig's server loads
    models on demand and does not hold this one now: counting would load it outside the fair queue."""
    held = rigs_loaded_models([rig])[rig.pk]  # None: the server holds every model it serves
    if held is not None and not any(same_model(name, model) for name in held):
        raise InvalidInput(
            "model_not_loaded",
            f"The model '{model}' is not loaded on rig {rig.name} now, and counting its tokens would load it outside "
            "the fair queue. A request for it loads it in its turn.",
        )
    ratelimits.rate_check_submit(session=ChatSession(owner_id=key.owner_id, api_key_id=key.pk))


async def api_input_tokens(*, rig: Rig, body: dict[str, Any]) -> int:
    """The tokens the OpenAI chat request ``body`` (its ``model`` the server's name) makes as its prompt on ``rig``;
    BackendError as the backend failed (BackendNotSupported: its kind cannot count)."""
    backend = backend_for(rig, timeout_s=max(COUNT_TIMEOUT_S, settings.RIGDASH.backend_health_timeout_s))
    return await backend.input_tokens(body)
