"""A llama-server router that holds one model (``--models-dir``, ``--models-max 1``) swaps to a second user's model
while a first user keeps the loaded one busy: the router evicts a model only when no request for it is in flight
(tools/server/server-models.cpp ``server_lru_sched``), so the fair queue holds the first user's next turns back until
the swap has happened (inference/queue/swaps.py). Real router, sampler and worker; SmolLM2 is the busy model, the
tiny zero-weight GGUF (tests/tiny_gguf.py) the one swapped in. Short replies."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from inference.live import served
from inference.models import Rig, Turn
from inference.turns import submit
from rigdash.launcher import Stack, free_port, wait_http, worker_command
from tests import tiny_gguf
from tests.adminkit import make_session
from tests.conftest import LOG_DIR, TEST_QUEUE, wait_until

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]
SWAP_QUEUE = f"{TEST_QUEUE}.swaps"
STORY = "Write a long story about a cat and a dog."
B_BOUND_S = 30.0  # B's turn ends within this of its submit; user 1 keeps sending for twice as long


@pytest.fixture(scope="module")
def one_model_router(tmp_path_factory: pytest.TempPathFactory, service_env: dict[str, str]) -> Iterator[str]:
    """The router, and a worker of its own with room for four turns at once (the suite's has two threads)."""
    models = tmp_path_factory.mktemp("swap-models")
    (models / "smol.gguf").symlink_to(os.environ["LLAMA_MODEL_PATH"])
    meta, tensors = tiny_gguf.llama_gqa(layers=2, kv_heads=1)
    tiny_gguf.write_gguf(Path(models / "tiny.gguf"), meta, tensors)
    port = free_port()
    stack = Stack()
    command = [os.environ["LLAMA_SERVER_BIN"], "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-tb", "1",
               "--no-webui", "--models-dir", str(models), "--models-max", "1", "-c", "2048"]  # fmt: skip
    try:
        proc = stack.start("llama-server-swaps", command, log_path=LOG_DIR / "router-swaps.log")
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
        stack.start(
            "worker-swaps",
            worker_command(queues=[SWAP_QUEUE], concurrency=5, name=f"swaps{os.getpid()}@localhost",
                           beat_schedule=None),
            env=service_env,
            log_path=LOG_DIR / "worker-swaps.log",
        )  # fmt: skip
        yield f"http://127.0.0.1:{port}"
    finally:
        stack.stop()


def test_a_second_users_model_is_swapped_in_while_the_first_keeps_sending(
    one_model_router, sampler_process, owner, other_user
) -> None:
    props = httpx.get(f"{one_model_router}/props").json()
    assert (props["role"], props["max_instances"]) == ("router", 1)
    rig = Rig.objects.create(name="swaps", kind=Rig.Kind.LLAMACPP, base_url=one_model_router, queue=SWAP_QUEUE, slots=4)
    wait_until(lambda: Rig.objects.get(pk=rig.pk).server_models_max == 1, timeout_s=30, what="the sampler's limit")
    rig.refresh_from_db()
    sent: list[Turn] = []

    def keep_three_in_flight() -> None:
        """User 1: three turns for SmolLM2 at all times, each sent as soon as one ends; their lengths differ, so they
        do not all end together and, without the fair queue's hold, the model would never idle."""
        active = Turn.objects.filter(pk__in=[t.pk for t in sent], status__in=Turn.ACTIVE).count()
        for _ in range(3 - active):
            tokens = (12, 20, 28)[len(sent) % 3]
            params = {"max_tokens": tokens, "temperature": 0}
            sent.append(submit.turn_submit(session=make_session(owner, rig, "smol"), text=STORY, params=params))

    keep_three_in_flight()
    wait_until(lambda: Turn.objects.filter(pk__in=[t.pk for t in sent], status=Turn.Status.DECODING).exists(),
               timeout_s=120, what="SmolLM2 loaded and decoding")  # fmt: skip
    wait_until(lambda: served.loaded_get_many([rig.pk])[rig.pk] == {"smol"}, timeout_s=30, what="the loaded list")
    swap = submit.turn_submit(session=make_session(other_user, rig, "tiny"), text="Say hi.", params={"max_tokens": 4})
    started = time.monotonic()
    while time.monotonic() - started < 2 * B_BOUND_S and Turn.objects.get(pk=swap.pk).status in Turn.ACTIVE:
        keep_three_in_flight()
        time.sleep(0.05)
    took_s = time.monotonic() - started
    for turn in sent:  # user 1 stops; what is left runs out
        wait_until(lambda t=turn: Turn.objects.get(pk=t.pk).status not in Turn.ACTIVE, timeout_s=120, what="the end")

    b = Turn.objects.get(pk=swap.pk)
    assert b.status == Turn.Status.DONE and took_s < B_BOUND_S, (b.status, b.error, took_s)
    ours = Turn.objects.filter(pk__in=[t.pk for t in sent]).order_by("pk")
    assert {t.status for t in ours} == {Turn.Status.DONE}, [(t.status, t.error) for t in ours]
    assert b.finished_at is not None and b.dispatched_at is not None
    # User 1's turns sent while B waited for the swap waited in RigDash's queue, not inside the router, until B's
    # first token (its model loaded); its start plus its TTFT is no later than that token (TTFT counts from the send).
    assert b.started_at is not None and b.stats.get("ttft_ms") is not None, b.stats
    b_first_token = b.started_at + timedelta(milliseconds=b.stats["ttft_ms"])
    behind = [t for t in ours if b.dispatched_at < t.created_at < b_first_token]
    assert behind and all(t.dispatched_at is not None and t.dispatched_at >= b_first_token for t in behind), [
        (t.created_at, t.dispatched_at) for t in behind
    ]
    print(f"B done {took_s:.1f} s after its submit; {len(sent)} turns of user 1", file=sys.stderr)
