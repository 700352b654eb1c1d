"""An embeddings request for a model a llama-server router loads on demand waits for the load as a chat turn does
(inference/worker/loading.py: RIGDASH_MODEL_LOAD_TIMEOUT_S past the first-answer timeout once the server says it loads
the model first), and only then.

Against the real router (``--models-dir`` with SmolLM2, ``--embeddings``), run in this process with a first-answer
timeout far shorter than the router's load of SmolLM2 (a child server started, the weights read, a warm-up run):
the same request fails for that timeout when no load is allowed, and is answered when it is."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import httpx
import pytest
from redis import asyncio as aioredis

from inference.live import answers
from inference.live.state import sync_client
from inference.models import ChatSession, Rig, Turn
from inference.worker import embed
from inference.worker import start as starts
from rigdash.launcher import Stack, free_port, wait_http
from tests.conftest import LOG_DIR

FIRST_ANSWER_S = 0.3  # the first-answer timeout once SmolLM2 is loaded (an embeddings answer takes milliseconds)
LATE_CHECK_S = 0.1  # how long a server takes to say whether it loads the model
NO_LOAD_S = 0.02  # shorter than any load by the router: a child server started, the weights read, a warm-up run


@pytest.fixture
def router(tmp_path) -> Iterator[str]:
    models = tmp_path / "models"
    models.mkdir()
    (models / "smol.gguf").symlink_to(os.environ["LLAMA_MODEL_PATH"])
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    processes = Stack()
    processes.start(
        "llama-router-embeddings",
        [os.environ["LLAMA_SERVER_BIN"], "--host", "127.0.0.1", "--port", str(port), "--models-dir", str(models),
         "-c", "1024", "-t", "1", "--embeddings", "--pooling", "mean", "--no-webui"],
        log_path=LOG_DIR / "llama-router-embeddings.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout_s=60)
        yield url
    finally:
        processes.stop()


def _status(url: str) -> str:
    return next(m["status"]["value"] for m in httpx.get(f"{url}/v1/models").json()["data"] if m["id"] == "smol")


def _until(url: str, status: str) -> None:
    deadline = time.monotonic() + 60
    while _status(url) != status:
        assert time.monotonic() < deadline, f"smol never became {status}"
        time.sleep(0.1)


def _embeddings_turn(owner, rig: Rig) -> Turn:
    session = ChatSession.objects.create(owner=owner, rig=rig, model_name="smol", hidden=True)
    params = {"embeddings": True, "max_tokens": 1, "passthrough": {"input": ["a cat"]}}
    turn = Turn.objects.create(session=session, user_text="embeddings of 1 input(s)", params=params)
    assert starts.turn_run(turn.pk) == "ran"
    turn.refresh_from_db()
    return turn


def _timeouts(settings, *, load_s: float, first_s: float = FIRST_ANSWER_S) -> None:
    conf = {**vars(settings.RIGDASH), "first_token_timeout_s": first_s, "model_load_timeout_s": load_s}
    settings.RIGDASH = type(settings.RIGDASH)(**conf)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_embeddings_wait_for_a_routers_load_as_a_chat_does(router, owner, settings) -> None:
    rig = Rig.objects.create(name="router-embeddings", kind=Rig.Kind.LLAMACPP, base_url=router, queue="rig.embed-load")

    _timeouts(settings, load_s=0, first_s=NO_LOAD_S)  # no allowance: the load outlasts the first-answer timeout
    assert _status(router) == "unloaded"
    turn = _embeddings_turn(owner, rig)
    assert (turn.status, turn.finish_reason) == (Turn.Status.FAILED, "timeout"), turn.error
    assert "embeddings" in turn.error and turn.stats["model_loading"] is True

    _until(router, "loaded")  # the router goes on loading what it was asked for; unloaded again for the next one
    assert httpx.post(f"{router}/models/unload", json={"model": "smol"}).json() == {"success": True}
    _until(router, "unloaded")

    _timeouts(settings, load_s=300, first_s=NO_LOAD_S)  # the same timeout and RigDash's default allowance
    turn = _embeddings_turn(owner, rig)
    assert turn.status == Turn.Status.DONE, (turn.finish_reason, turn.error, turn.stats)
    assert turn.stats["model_loading"] is True and turn.stats["e2e_ms"] > NO_LOAD_S * 1000
    answer = answers.answer_take(turn.pk)
    assert answer is not None and len(answer["data"]) == 1 and answer["data"][0]["embedding"]

    _timeouts(settings, load_s=300)
    turn = _embeddings_turn(owner, rig)  # loaded now: the first-answer timeout alone, and no load said
    assert turn.status == Turn.Status.DONE and "model_loading" not in turn.stats, turn.stats
    sync_client().delete(answers.answer_key(turn.pk))


async def _late_check(*, loads: bool) -> bool:
    await asyncio.sleep(LATE_CHECK_S)  # a server slow to say whether it loads the model
    return loads


@pytest.mark.parametrize("loads", [True, False])
def test_no_timeout_is_declared_before_the_load_check_answers(settings, loads: bool) -> None:
    """A first-answer timeout shorter than the load check's own answer waits for that answer: a server that says it
    loads gets the load allowance; one that does not times out as soon as it says so, not at the first-answer
    timeout. The request is a server that never answers; the cancel flag is read from the tests' own Redis."""
    _timeouts(settings, load_s=0.3, first_s=0.02)

    async def outcome() -> tuple[str, float]:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        loading = asyncio.ensure_future(_late_check(loads=loads))
        started = time.perf_counter()
        try:
            await embed._answered(1, client, asyncio.sleep(30), loading, "the embeddings")
        except embed._TimedOut as exc:
            return str(exc), time.perf_counter() - started
        finally:
            await client.aclose()
        raise AssertionError("a server that never answers was not timed out")

    words, waited = asyncio.run(outcome())
    if loads:
        assert "0.32 s" in words and 0.32 <= waited < 0.32 + embed.CANCEL_POLL_S, (words, waited)
    else:
        assert "0.02 s" in words and LATE_CHECK_S <= waited < LATE_CHECK_S + embed.CANCEL_POLL_S, (words, waited)
