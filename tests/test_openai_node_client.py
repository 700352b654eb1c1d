"""A third real client library through RigDash: node's official ``openai`` package (the JavaScript SDK, as editors'
extensions and agents written in TypeScript use it) runs a tool-calling loop against the OpenAI-compatible fake server
of tests/test_openai_gateway.py, and JSON mode, stop sequences, a code completion and embeddings against the real
llama-server rigs; each request is a turn on the board naming the key and the SDK's user agent, and in usage.

The package is installed outside the checkout by scripts/test (npm, cached like oidc-provider); without node or it,
the test skips saying why. The script reads its settings as JSON on stdin and prints its results as JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from inference.board import apikeys
from inference.models import Rig, Turn
from inference.turns.board_rows import board_row_for
from tests import test_openai_gateway as gateway
from tests.conftest import TEST_QUEUE, TEST_QUEUE_2
from tests.test_openai_gateway import FAKE_MODEL, SKY, TOOLS, FakeOpenAI

fake_rig, embeddings_url = gateway.fake_rig, gateway.embeddings_url  # its fixtures

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]

SCRIPT = r"""
import OpenAI from "openai";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const cfg = JSON.parse(Buffer.concat(chunks).toString());
const client = new OpenAI({ baseURL: cfg.base_url, apiKey: cfg.key, maxRetries: 0, timeout: 120000 });
const out = {};

if (cfg.phase === "tools") {
// A tool-calling loop: the call streamed as deltas, then the tool's result sent back, answered whole.
const messages = [{ role: "user", content: "What is the weather in Oslo?" }];
const stream = await client.chat.completions.create({
  model: cfg.tool_model, messages, tools: cfg.tools, tool_choice: "auto", stream: true,
});
const calls = {};
let finish = null;
for await (const chunk of stream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  for (const delta of choice.delta.tool_calls ?? []) {
    const call = (calls[delta.index] ??= { id: null, name: null, arguments: "" });
    call.id ??= delta.id ?? null;
    call.name ??= delta.function?.name ?? null;
    call.arguments += delta.function?.arguments ?? "";
  }
  finish = choice.finish_reason ?? finish;
}
out.tool_call = { finish, calls };
messages.push(
  { role: "assistant", content: null, tool_calls: [{ id: calls[0].id, type: "function",
    function: { name: calls[0].name, arguments: calls[0].arguments } }] },
  { role: "tool", tool_call_id: calls[0].id, content: "12 C" },
);
const answer = await client.chat.completions.create({ model: cfg.tool_model, messages, tools: cfg.tools });
out.tool_answer = { content: answer.choices[0].message.content, finish: answer.choices[0].finish_reason };
} else {

// JSON mode, stop sequences, a code completion and embeddings on the real llama-server rigs.
const json = await client.chat.completions.create({
  model: cfg.model, max_tokens: 200, temperature: 0, response_format: { type: "json_object" },
  messages: [{ role: "system", content: "Reply with a JSON object of one key." }, { role: "user", content: cfg.sky }],
});
out.json_mode = json.choices[0].message.content;
const stopped = await client.chat.completions.create({
  model: cfg.model, max_tokens: 60, temperature: 0, stop: ["5"],
  messages: [{ role: "user", content: "Count from 1 to 10, separated by commas." }],
});
out.stopped = { content: stopped.choices[0].message.content, finish: stopped.choices[0].finish_reason };
const code = await client.completions.create({ model: cfg.model, prompt: "def add(a, b):\n", max_tokens: 12,
                                               temperature: 0 });
out.completion = { text: code.choices[0].text, tokens: code.usage.completion_tokens };
try {
  await client.completions.create({ model: cfg.model, prompt: "def add(a, b):\n    ", suffix: "\n    return c",
                                    max_tokens: 8 });
  out.infill = { status: 200 };
} catch (err) {
  out.infill = { status: err.status, message: err.message };
}
const embedded = await client.embeddings.create({ model: cfg.embed_model, input: ["hello", "a lighthouse keeper"] });
out.embeddings = embedded.data.map((item) => item.embedding.length);
out.embeddings_differ = JSON.stringify(embedded.data[0].embedding) !== JSON.stringify(embedded.data[1].embedding);
}
console.log(JSON.stringify(out));
"""


def _openai_modules() -> Path:
    """Where scripts/test installs the package (npm install --prefix <this>/.. openai)."""
    cache = Path(os.environ.get("RIGDASH_CACHE_DIR", Path.home() / ".cache" / "rigdash"))
    return Path(os.environ.get("NODE_OPENAI_MODULES", cache / "node-openai" / "node_modules"))


def _node_client(tmp_path: Path, settings: dict[str, Any]) -> dict[str, Any]:
    node = shutil.which("node")
    modules = _openai_modules()
    if node is None:
        pytest.skip("node is not installed: this test runs node's official openai package")
    if not (modules / "openai").is_dir():
        pytest.skip(f"no openai package in {modules}: scripts/test installs it with npm (npm install --prefix ...)")
    if not (tmp_path / "node_modules").exists():
        (tmp_path / "node_modules").symlink_to(modules)  # the script's `import "openai"` resolves from its folder
    script = tmp_path / "client.mjs"
    script.write_text(SCRIPT)
    done = subprocess.run([node, str(script)], input=json.dumps(settings), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_nodes_openai_client_runs_tools_json_stop_completion_and_embeddings(
    web_url, celery_worker, fake_rig, llama_url, model_name, embeddings_url, owner, tmp_path
):
    key = apikeys.api_key_create(owner=owner, name="node-agent")
    settings = {"base_url": f"{web_url}/v1", "key": key.secret, "tool_model": FAKE_MODEL, "model": model_name,
                "embed_model": "smol-embed", "tools": TOOLS, "sky": SKY}  # fmt: skip
    out = _node_client(tmp_path, {**settings, "phase": "tools"})
    # The test worker consumes one rig queue (a rig's queue is its own): the fake rig gives it to llama-server's.
    Rig.objects.filter(pk=fake_rig.pk).update(enabled=False, queue=f"{TEST_QUEUE}.fake")
    Rig.objects.create(name="test-rig", kind=Rig.Kind.LLAMACPP, base_url=llama_url, queue=TEST_QUEUE)
    Rig.objects.create(name="embed-rig", kind=Rig.Kind.LLAMACPP, base_url=embeddings_url, queue=TEST_QUEUE_2)
    out |= _node_client(tmp_path, {**settings, "phase": "llama"})

    called = {"0": {"id": "call_7", "name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert out["tool_call"] == {"finish": "tool_calls", "calls": called}
    assert out["tool_answer"] == {"content": "It is 12 C in Oslo.", "finish": "stop"}
    sent = FakeOpenAI.bodies[-1]["messages"]  # the loop's second step reached the server as the SDK sent it
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert sent[2] == {"role": "tool", "tool_call_id": "call_7", "content": "12 C"}
    assert isinstance(json.loads(out["json_mode"]), dict)  # llama-server's JSON grammar
    stopped = out["stopped"]
    assert stopped["finish"] == "stop" and "5" not in stopped["content"] and "4" in stopped["content"]
    assert out["completion"]["text"] and out["completion"]["tokens"] > 0
    assert out["infill"]["status"] == 501 and "Infill is not supported" in out["infill"]["message"]
    assert len(out["embeddings"]) == 2 and out["embeddings"][0] == out["embeddings"][1] > 0 and out["embeddings_differ"]

    # Every request is a turn on the board and in usage, the embeddings too (the last).
    turns = list(Turn.objects.order_by("pk"))
    assert [t.status for t in turns] == [Turn.Status.DONE] * 5 + [Turn.Status.FAILED, Turn.Status.DONE]
    assert turns[6].stats["embeddings"] == 2 and turns[6].output_tokens == 0
    assert turns[0].stats["tool_calls"][0]["function"]["name"] == "get_weather"
    assert turns[2].params["passthrough"] == {"response_format": {"type": "json_object"}, "temperature": 0}
    assert turns[3].params["passthrough"] == {"stop": ["5"], "temperature": 0}
    assert turns[4].params["raw_prompt"] is True and turns[4].reply_text == out["completion"]["text"]
    for turn in turns:
        row = board_row_for(turn.pk)
        assert row["via_api"] and row["api_client"]["key"] == "node-agent"
        assert row["api_client"]["agent"].startswith("OpenAI/JS ")  # the SDK's own user agent
    used = apikeys.api_key_usage([key.key])[key.key.pk]
    assert used.turns == 7 and used.output_tokens == sum(t.output_tokens or 0 for t in turns) > 0
