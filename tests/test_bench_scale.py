"""The scale benchmark (bench/scale.py) and its synthetic llama-server (bench/synthetic.py), run tiny to keep working.

The synthetic server is checked against RigDash's own llama.cpp client and monitoring collector: if it drifted from
the wire format they read, every figure measured with it would be about something else. The benchmark's smoke run
starts its own stacks (private Redis, SQLite) on free ports; its figures are not asserted, only that each part ran
and saw every token in order."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx

from bench import scale
from inference.backends.base import ChatRequest
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.llamacpp import metrics as llamacpp
from rigdash.launcher import ROOT


async def test_the_synthetic_server_speaks_what_rigdashs_llamacpp_client_and_collector_read(synthetic_llama):
    backend = LlamaCppBackend(synthetic_llama[1])
    assert (await backend.health()).ok
    models = await backend.list_models()
    assert [m.name for m in models] == ["synthetic"] and models[0].size_bytes and models[0].context_length

    idle = await llamacpp.collect(backend.base_url)
    assert idle.props["default_generation_settings"]["n_ctx"] > 0 and "chat_template" not in idle.props
    assert [s.phase for s in idle.slots] == ["idle", "decoding"]  # the free slot and the --busy-rate one
    assert idle.metrics["requests_processing"] == 1 and idle.metrics["tokens_predicted_total"] == 0

    request = ChatRequest(
        model="synthetic", messages=[{"role": "user", "content": "[synthetic rate=2000 tokens=1000]"}], max_tokens=2000
    )
    texts, finish, stats, t0 = [], None, None, time.monotonic()
    async for chunk in backend.stream_chat(request):
        texts.append(chunk.text) if chunk.text else None
        finish, stats = chunk.finish_reason or finish, chunk.stats or stats
    elapsed = time.monotonic() - t0
    assert len(texts) == 1000 and finish == "length" and stats is not None and stats.output_tokens == 1000
    assert stats.decode_tps is not None and stats.decode_tps > 1900  # the source kept its schedule at 2,000 tokens/s
    assert elapsed < 3
    after = await llamacpp.collect(backend.base_url)
    assert after.metrics["tokens_predicted_total"] == 1000 and after.metrics["prompt_tokens_total"] == 1

    # The native /completion stream, and the other port answering on its own.
    body = {"prompt": "[synthetic rate=1000 tokens=5]", "n_predict": 3, "stream": True}
    with httpx.stream("POST", f"{synthetic_llama[0]}/completion", json=body) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert [e["stop"] for e in events] == [False, False, False, True] and events[-1]["timings"]["predicted_n"] == 3
    other = await llamacpp.collect(synthetic_llama[0])
    assert other.metrics["tokens_predicted_total"] == 3


def test_every_part_of_the_scale_benchmark_runs_tiny_and_delivers_every_token_in_order(tmp_path):
    out = tmp_path / "scale.json"
    done = subprocess.run([sys.executable, "-m", "bench.scale", "all", "--smoke", f"--out={out}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    rigs = result["rigs"]["rounds"][0]
    assert rigs["rigs"] == scale.SMOKE.rig_counts[0] and rigs["samples_per_rig_per_s"] > 0.5
    assert rigs["sample_to_browser_ms"]["n"] > 0 and rigs["raw_sample_bytes"] > 0
    assert result["rigs"]["database_growth"]["bound_mb_per_rig"] > 0
    viewers = result["viewers"]["rounds"][0]
    assert viewers["every_token_in_order"], viewers["failures"]
    assert viewers["chat_tabs"] > scale.SMOKE.viewer_turns and viewers["web_processes"] == 2
    assert viewers["frames_delivered"] > 0 and viewers["board_frames"] > 0 and viewers["web_cpu_us_per_frame"]
    assert result["viewers"]["floor_direct"]["every_token_in_order"]
    relay = viewers["relay_floor"]  # the same sockets and frames from a minimal relay, no RigDash
    assert relay["every_token_in_order"], relay["failures"]
    assert relay["sockets"] == viewers["sockets"] and relay["sample_bytes"] > 100
    rate = result["rate"]["rounds"][0]
    assert rate["every_token_in_order"], rate["failures"]
    assert rate["token_batches"] < rate["streams"] * rate["tokens_per_stream"]  # batched, not a frame per token
    assert rate["floor_direct"]["every_token_in_order"]
