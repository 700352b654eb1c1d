"""A chat for a model Ollama has not loaded: the page shows "loading the model", the turn waits for the load even
past the first-token timeout, and the load is split from the time to first token (Ollama's ``load_duration``).

Against the replay (tests/ollama_replay.py: no Ollama binary runs here), whose load is a real wait of ``load_s``,
reported as ``load_duration`` as Ollama reports it. Ollama holds a loading runner's lock while it loads, and /api/ps
waits on it (server/sched.go ``loadedModels``); it calls a load stalled only after OLLAMA_LOAD_TIMEOUT, 5 minutes
(envconfig/config.go). So a worker whose first-token timeout is 1 s waits for a 2.5 s load (RIGDASH_MODEL_LOAD_TIMEOUT_S
more), and the same worker fails a loaded model that sends nothing for that long.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async

from inference.models import Rig, Turn
from inference.turns import sessions
from rigdash.launcher import ROOT, Stack, free_port, wait_http, worker_command
from tests.conftest import LOG_DIR, session_cookie_for
from tests.ollama_replay import OllamaReplay, smollm2
from tests.wsclient import ChatSocket

QUEUE = f"rig.ollama-load{os.getpid()}"


@pytest.fixture(scope="module")
def impatient_worker(service_env: dict[str, str]) -> Iterator[str]:
    """A worker of its own whose first-token timeout (1 s) is shorter than the replay's load."""
    from rigdash.celery import app

    processes = Stack()
    name = f"load{os.getpid()}@localhost"
    processes.start(
        "worker-load",
        worker_command(queues=[QUEUE], concurrency=1, name=name, beat_schedule=None),
        env={**service_env, "RIGDASH_FIRST_TOKEN_TIMEOUT_S": "1"},
        log_path=LOG_DIR / "worker-load.log",
    )
    deadline = time.monotonic() + 60
    while not any(name in reply for reply in app.control.ping(timeout=0.5)):
        assert time.monotonic() < deadline, f"the worker did not answer; see {LOG_DIR / 'worker-load.log'}"
    yield name
    processes.stop()


async def _turn(owner, rig: Rig) -> tuple[list[dict], dict]:
    session = await sync_to_async(sessions.session_create)(owner=owner, rig=rig, model_name="smollm2:135m")
    return await _turn_on(owner, session)


async def _turn_on(owner, session) -> tuple[list[dict], dict]:
    sock = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()
    await sock.send({"type": "turn.send", "text": "Go.", "params": {"max_tokens": 8}})
    frames: list[dict] = []
    end = await sock.recv_until(lambda f: frames.append(f) or f["type"] == "turn.end", timeout=30)
    await sock.close()
    return frames, end["turn"]


@pytest.mark.django_db(transaction=True)
async def test_a_loading_model_is_waited_for_and_its_load_split_from_ttft(impatient_worker, owner):
    replay = OllamaReplay(models=[smollm2()], load_s=2.5).start()
    try:
        rig = await Rig.objects.acreate(name="ollama-load", kind=Rig.Kind.OLLAMA, base_url=replay.url, queue=QUEUE)
        frames, turn = await _turn(owner, rig)
        assert turn["status"] == Turn.Status.DONE, turn
        states = [f["status"] for f in frames if f["type"] == "turn.state"]
        assert "loading" in states
        stats = turn["stats"]
        assert stats["load_ms"] >= 2400 and stats["ttft_ms"] >= stats["load_ms"]
        assert stats["ttft_after_load_ms"] == pytest.approx(stats["ttft_ms"] - stats["load_ms"], abs=0.02)
        # Loaded now: no loading state, no load in the stats line.
        frames, turn = await _turn(owner, rig)
        assert turn["status"] == Turn.Status.DONE
        assert "loading" not in [f["status"] for f in frames if f["type"] == "turn.state"]
        assert "ttft_after_load_ms" not in turn["stats"]
        # A loaded model whose server sends nothing past the first-token timeout still fails as before.
        replay.token_interval_s, replay.load_s = 0.0, 0.0
        replay.prompt_delay_s = 3.0
        _, turn = await _turn(owner, rig)
        assert turn["status"] == Turn.Status.FAILED and turn["finish_reason"] == "timeout"
    finally:
        replay.stop()


def test_the_stats_line_reads_the_same_on_every_backend():
    """static/rigdash/turnstats.js, run by Node: the whole prompt, its cached part where told, prefill tok/s (an upper
    bound on Ollama, whose count includes cached tokens), and a load apart from TTFT."""
    script = f"""
      global.window = {{}};
      require({json.dumps(str(ROOT / "static/rigdash/turnstats.js"))});
      const s = window.RigDashStats;
      console.log(JSON.stringify([
        s.statsText({{status: "done", finish_reason: "stop", stats: {{ttft_ms: 40, prompt_tokens: 100,
          prompt_total_tokens: 900, prompt_cached_tokens: 800, prompt_ms: 50, prefill_tps: 2000,
          prefill_tps_at_most: false}}}}),
        s.statsText({{status: "done", finish_reason: "stop", stats: {{ttft_ms: 2600, load_ms: 2500,
          ttft_after_load_ms: 100, prompt_tokens: 900, prompt_total_tokens: 900, prompt_cached_tokens: null,
          prompt_ms: 50, prefill_tps: 18000, prefill_tps_at_most: true}}}}),
        s.statsText({{status: "loading", stats: {{}}}}),
      ]));
    """
    out = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout)
    assert "prompt 900 tok (800 cached) in 50 ms · prefill 2000 tok/s" in out[0]
    assert "model loaded in 2500 ms · TTFT 100 ms after the load" in out[1]
    assert "prompt 900 tok in 50 ms · prefill ≤ 18000 tok/s" in out[1]
    assert out[2].startswith("loading the model")


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
async def test_a_routers_model_loaded_on_demand_shows_loading_and_its_load_apart(impatient_worker, owner, tmp_path):
    """The real llama-server in router mode (--models-dir) loads SmolLM2 for the first chat on it: the page shows
    "loading", the worker waits past its 1 s first-token timeout, and the stats hold the load apart from the time to
    first token (llama-server does not time its loads: RigDash's TTFT less the server's prompt time)."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "smol.gguf").symlink_to(os.environ["LLAMA_MODEL_PATH"])
    port = free_port()
    processes = Stack()
    processes.start(
        "llama-router",
        [os.environ["LLAMA_SERVER_BIN"], "--host", "127.0.0.1", "--port", str(port), "--models-dir", str(models),
         "-c", "1024", "-t", "1", "--no-webui"],
        log_path=LOG_DIR / "llama-router.log",
    )  # fmt: skip
    try:
        await sync_to_async(wait_http)(f"http://127.0.0.1:{port}/health", timeout_s=60)
        rig = await Rig.objects.acreate(
            name="router-load", kind=Rig.Kind.LLAMACPP, base_url=f"http://127.0.0.1:{port}", queue=QUEUE
        )
        session = await sync_to_async(sessions.session_create)(owner=owner, rig=rig, model_name="smol")
        frames, turn = await _turn_on(owner, session)
        assert turn["status"] == Turn.Status.DONE, turn
        assert "loading" in [f["status"] for f in frames if f["type"] == "turn.state"]
        stats = turn["stats"]
        assert stats["load_timed_by"] == "RigDash" and stats["load_ms"] > 0
        assert stats["ttft_after_load_ms"] == pytest.approx(stats["ttft_ms"] - stats["load_ms"], abs=0.02)
        frames, turn = await _turn_on(owner, session)  # loaded now: no loading, no load in the stats
        assert "loading" not in [f["status"] for f in frames if f["type"] == "turn.state"]
        assert "load_ms" not in turn["stats"]
    finally:
        processes.stop()
