"""A server that loads the model before it answers: whether it must, and how long a turn then waits for its first
answer. One rule for a streamed reply (inference/worker/stream.py) and an embeddings request (embed.py)."""

from __future__ import annotations

import asyncio

from inference.backends import backend_for, capabilities
from inference.backends.base import BackendError
from inference.models import Rig
from rigdash.env import RigDashConfig

LOADED_CHECK_S = 1.0


async def model_needs_load(rig: Rig, model: str) -> bool:
    """Whether the rig's server loads ``model`` before it reads a request for it (a server that loads on demand:
    Ollama, llama-server in router or sleep mode; ``Backend.needs_load``). No answer within LOADED_CHECK_S means a
    load only where the backend says so (``Backend.silent_while_loading``: Ollama's /api/ps waits while a runner
    loads, server/sched.go ``loadedModels``); a llama-server that does not answer is stuck, not loading."""
    if not capabilities(rig.kind).loads_on_demand:
        return False
    backend = backend_for(rig, timeout_s=LOADED_CHECK_S)
    try:
        async with asyncio.timeout(LOADED_CHECK_S):
            return await backend.needs_load(model)
    except TimeoutError:
        return backend.silent_while_loading
    except BackendError:
        return False


def first_answer_limit_s(conf: RigDashConfig, *, loading: bool) -> float:
    """How long a turn waits for its server's first answer (a reply's first token, an embeddings answer): the
    first-token timeout, and RIGDASH_MODEL_LOAD_TIMEOUT_S more while the server loads the model, which is loading,
    not stuck (Ollama calls a load stalled only after OLLAMA_LOAD_TIMEOUT, 5 minutes)."""
    return conf.first_token_timeout_s + (conf.model_load_timeout_s if loading else 0.0)
