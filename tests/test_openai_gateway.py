"""RigDash in front of every client: the official ``openai`` client against RigDash's web server and a Celery worker,
with every field RigDash does not own passed to the rig's backend unchanged (docs/openai.md, "Fields").

Two backends: the real llama-server with SmolLM2-135M (JSON mode through its grammar, stop sequences, logprobs,
llama.cpp's samplers, the developer role, a field it refuses), and a small OpenAI-compatible server written here
that streams ``tool_calls`` deltas. SmolLM2-135M does not call tools (this build of llama-server answers a
``tools`` request with text even with ``tool_choice: required``), so the tool-calling loop runs against the fake
server, which records what reached it: the tools, the assistant's tool call and the tool's result as sent, and the
deltas it streamed back reach the client as OpenAI's client accumulates them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from django.test import Client

from inference.board import apikeys
from inference.models import ChatSession, Quota, Rig, Turn
from inference.turns.board_rows import board_row_for
from rigdash.launcher import Stack, free_port, llama_server_command, wait_http
from tests.conftest import LOG_DIR, TEST_QUEUE, TEST_QUEUE_2, wait_until
from tests.tinykit import JsonHandler, served_rig

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]
FAKE_MODEL = "fake-tools"
SKY = 'What colour is the sky? Reply as JSON: {"colour": ...}'
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER}}]
ARGUMENT_PIECES = ['{"ci', 'ty": "Os', 'lo"}']


class FakeOpenAI(JsonHandler):
    """An OpenAI-compatible server: a request with tools whose last message is not a tool's result gets a streamed
    tool call (id and name first, then its arguments in pieces, finish ``tool_calls``); any other gets text. A body
    with ``refuse_me`` is refused with 400, as a server refuses a field it does not take."""

    bodies: list[dict[str, Any]] = []

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": FAKE_MODEL, "object": "model", "context_length": 4096}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        if "refuse_me" in body:
            self._send(400, {"error": {"message": "unknown field refuse_me", "type": "invalid_request_error"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in self._events(body):
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    @staticmethod
    def _events(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta,
                                                                    "finish_reason": finish}]}  # fmt: skip

        yield chunk({"role": "assistant", "content": None})
        if body.get("tools") and body["messages"][-1]["role"] != "tool":
            yield chunk({"tool_calls": [{"index": 0, "id": "call_7", "type": "function",
                                         "function": {"name": "get_weather", "arguments": ""}}]})  # fmt: skip
            for piece in ARGUMENT_PIECES:
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            yield chunk({}, "tool_calls")
        else:
            for word in ("It is ", "12 C ", "in Oslo."):
                yield chunk({"content": word})
            finish = chunk({}, "stop")
            if body.get("stop"):  # as vLLM names the stop string that ended a reply (this server stops on none)
                finish["choices"][0]["stop_reason"] = body["stop"][0]
            yield finish
        yield {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 4}}


@pytest.fixture
def fake_rig(db: Any) -> Iterator[Rig]:
    FakeOpenAI.bodies = []
    with served_rig(FakeOpenAI, "fake-rig", TEST_QUEUE) as rig:
        yield rig


def _client(web_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{web_url}/v1", api_key=key, max_retries=0, timeout=120)


def test_a_tool_calling_loop_streams_tool_call_deltas_and_passes_tool_messages(web_url, celery_worker, fake_rig, owner):
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="agent").secret)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in client.chat.completions.create(model=FAKE_MODEL, messages=messages, tools=TOOLS, stream=True,
                                                tool_choice="auto"):  # fmt: skip
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or delta.id
            call["name"] = call["name"] or delta.function.name
            call["arguments"] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason if chunk.choices and chunk.choices[0].finish_reason else finish
    assert finish == "tool_calls"
    assert calls == {0: {"id": "call_7", "name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert FakeOpenAI.bodies[-1]["tools"] == TOOLS and FakeOpenAI.bodies[-1]["tool_choice"] == "auto"
    first = Turn.objects.get()
    assert first.stats["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}

    # The loop's second step: the assistant's tool call and the tool's result, answered whole (not streamed).
    call = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}
    messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_7", "content": "12 C"}]  # fmt: skip
    answer = client.chat.completions.create(model=FAKE_MODEL, messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content == "It is 12 C in Oslo." and answer.choices[0].finish_reason == "stop"
    assert FakeOpenAI.bodies[-1]["messages"] == messages  # every message reached the server as sent
    assert FakeOpenAI.bodies[-1]["stream"] is True  # RigDash's own keys win

    # A tool call answered whole: the message carries it.
    whole = client.chat.completions.create(model=FAKE_MODEL, messages=messages[:1], tools=TOOLS)
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content is None
    assert whole.choices[0].message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    turns = list(Turn.objects.order_by("pk"))
    assert len(turns) == 3 and all(t.status == Turn.Status.DONE for t in turns)
    assert turns[1].user_text == "12 C" and turns[1].params["message"]["role"] == "tool"
    row = board_row_for(turns[0].pk)
    assert row["via_api"] and row["api_client"]["key"] == "agent" and "OpenAI" in row["api_client"]["agent"]


def test_a_field_the_backend_refuses_comes_back_with_its_status_and_words(web_url, celery_worker, fake_rig, owner):
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="sdk").secret)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}],
                                           stream=stream, extra_body={"refuse_me": 1})  # fmt: skip
        assert "unknown field refuse_me" in refused.value.message and refused.value.status_code == 400
        assert refused.value.body["code"] == "backend_refused"
    assert [t.status for t in Turn.objects.all()] == [Turn.Status.FAILED] * 2  # each on the board, as failed


def test_json_mode_stop_logprobs_and_samplers_reach_llama_server(web_url, celery_worker, rig, model_name, owner):
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="tools").secret)
    json_mode = client.chat.completions.create(
        model=model_name, max_tokens=200, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "system", "content": "Reply with a JSON object of one key."},
                  {"role": "user", "content": 'What colour is the sky? Reply as JSON: {"colour": ...}'}],
    )  # fmt: skip
    assert json_mode.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(json_mode.choices[0].message.content), dict)  # llama-server's JSON grammar

    stopped = client.chat.completions.create(
        model=model_name, max_tokens=60, temperature=0, stop=["5"],
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
    )  # fmt: skip
    assert stopped.choices[0].finish_reason == "stop" and "5" not in stopped.choices[0].message.content
    assert "4" in stopped.choices[0].message.content

    chunks = list(
        client.chat.completions.create(
            model=model_name, max_tokens=4, logprobs=True, top_logprobs=2, stream=True, presence_penalty=0.2,
            frequency_penalty=0.2, extra_body={"top_k": 5, "min_p": 0.05, "repeat_penalty": 1.1},
            messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        )
    )  # fmt: skip
    tokens = [lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert tokens and all(len(token.top_logprobs) == 2 for token in tokens)
    assert "".join(t.token for t in tokens) == "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with pytest.raises(openai.BadRequestError) as refused:  # llama-server's own words, in OpenAI's shape
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                       response_format={"type": "nonsense"})  # fmt: skip
    assert "response_format type must be one of" in refused.value.message
    turns = list(Turn.objects.order_by("pk"))
    assert [t.status for t in turns] == [Turn.Status.DONE] * 3 + [Turn.Status.FAILED]
    assert turns[1].params["passthrough"] == {"stop": ["5"], "temperature": 0}
    assert all(board_row_for(t.pk)["api_client"]["key"] == "tools" for t in turns)
    # Usage by key: the keys page counts the key's requests and tokens.
    used = apikeys.api_key_usage([turns[0].session.api_key])[turns[0].session.api_key_id]
    assert used.turns == 4 and used.output_tokens == sum(t.output_tokens or 0 for t in turns) > 0
    page = Client()
    page.force_login(owner)
    assert '<td data-testid="key-requests">4</td>' in page.get("/keys/").content.decode()


@pytest.fixture(scope="module")
def embeddings_url(stack: Stack) -> str:
    """A second llama-server with SmolLM2, started with ``--embeddings`` and mean pooling (OpenAI's embeddings need a
    pooled vector), named ``smol-embed``."""
    port = free_port()
    command = llama_server_command(port=port, slots=1, ctx=512, extra=["--embeddings", "--pooling", "mean"])
    command[command.index("--alias") + 1] = "smol-embed"
    proc = stack.start("llama-server-embeddings", command, log_path=LOG_DIR / "llama-server-embeddings.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout_s=120, proc=proc)
    return url


def test_embeddings_are_turns_from_a_rig_that_serves_them_and_the_refusal_of_one_that_does_not(
    web_url, celery_worker, rig, model_name, embeddings_url, owner
):
    """Each embeddings request is a turn run by the worker: on the board (staff) while it runs and in the key's usage
    after, counted by the backend's prompt tokens; its inputs are never kept, whatever the key stores."""
    embed_rig = Rig.objects.create(
        name="embed-rig", kind=Rig.Kind.LLAMACPP, base_url=embeddings_url, queue=TEST_QUEUE_2
    )
    key = apikeys.api_key_create(owner=owner, name="rag")
    client = _client(web_url, key.secret)
    answer = client.embeddings.create(model="smol-embed", input=["hello", "a lighthouse keeper"])
    vectors = [item.embedding for item in answer.data]
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0 and vectors[0] != vectors[1]
    assert answer.model == "smol-embed" and answer.usage.prompt_tokens > 0
    with pytest.raises(openai.APIStatusError) as refused:  # llama-server without --embeddings says so
        client.embeddings.create(model=model_name, input="hi")
    assert refused.value.status_code == 501 and "--embeddings" in refused.value.message

    done, failed = Turn.objects.filter(session__api_key=key.key).order_by("pk")
    assert (done.status, done.rig_id, done.stats["embeddings"]) == (Turn.Status.DONE, embed_rig.pk, 2)
    assert done.prompt_tokens == answer.usage.prompt_tokens and done.output_tokens == 0
    assert (failed.status, failed.stats["backend_refused"]["status"]) == (Turn.Status.FAILED, 501)
    wait_until(lambda: "passthrough" not in Turn.objects.get(pk=done.pk).params, timeout_s=10, what="inputs wiped")
    assert done.session.hidden and not done.session.context_messages
    assert apikeys.api_key_usage([key.key])[key.key.pk].turns == 2
    assert not any(session.api_key_id for session in ChatSession.objects.filter(hidden=False))  # not chats
    listed = {m.id: m for m in client.models.list().data}
    assert listed["smol-embed"].model_extra["context_length"] > 0
    assert listed[model_name].model_extra["capabilities"] == {"chat_completions": True, "embeddings": True}


def test_code_completion_is_a_turn_and_a_suffix_goes_to_infill(web_url, celery_worker, rig, model_name, owner):
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="editor").secret)
    whole = client.completions.create(model=model_name, prompt="def add(a, b):\n", max_tokens=12, temperature=0)
    streamed = list(
        client.completions.create(model=model_name, prompt="def add(a, b):\n", max_tokens=12, temperature=0,
                                  stream=True, stream_options={"include_usage": True})
    )  # fmt: skip
    turns = list(Turn.objects.order_by("pk"))
    assert whole.object == "text_completion" and whole.choices[0].text == turns[0].reply_text != ""
    assert whole.usage.completion_tokens == turns[0].output_tokens > 0
    assert "".join(c.choices[0].text for c in streamed if c.choices) == turns[1].reply_text == turns[0].reply_text
    assert streamed[-1].usage.completion_tokens == turns[1].output_tokens
    assert turns[0].params["raw_prompt"] is True and turns[0].user_text == "def add(a, b):\n"
    # SmolLM2 has no fill-in-the-middle tokens: llama-server's /infill refuses, and the client reads why.
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(
            model=model_name, prompt="def add(a, b):\n    ", suffix="\n    return c", max_tokens=8
        )
    assert refused.value.status_code == 501 and "Infill is not supported" in refused.value.message


async def test_llama_servers_own_completion_events_are_read(llama_url):
    """The reader of /infill's events, on the same events of /completion (SmolLM2 cannot infill)."""
    from inference.backends.llamacpp.chat import _error, _NativeEvents
    from inference.backends.openai.stream import stream_chat_events

    chunks = [
        chunk
        async for chunk in stream_chat_events(
            server="llama-server", base_url=llama_url, path="/completion", reader=_NativeEvents(), tls=None,
            payload={"prompt": "def add(a, b):", "n_predict": 6, "stream": True, "temperature": 0},
            error=lambda status, body: _error(status, body.decode()), connect_timeout_s=5,
        )
    ]  # fmt: skip
    assert "".join(c.text for c in chunks) and chunks[-1].finish_reason == "length"
    assert chunks[-1].stats is not None and chunks[-1].stats.output_tokens == 6


def test_an_error_inside_llama_servers_own_completion_stream_keeps_its_status():
    """llama-server sends an error that comes after its stream began as an event whose ``code`` is the HTTP status it
    would have answered: a 500 stays retryable and a 400 does not, on /completion and /infill as on the chat stream."""
    from inference.backends.base import BackendError, BackendUnavailable
    from inference.backends.llamacpp.chat import _chunk, _NativeEvents

    for reader in (_NativeEvents().event, lambda data, last_in_read: _chunk(data)):
        with pytest.raises(BackendUnavailable) as failed:
            reader('{"error":{"code":500,"message":"decode failed","type":"server_error"}}', last_in_read=True)
        assert failed.value.retryable and "decode failed" in str(failed.value)
        with pytest.raises(BackendError) as refused:
            reader('{"error":{"code":400,"message":"bad grammar","type":"invalid_request_error"}}', last_in_read=True)
        assert not refused.value.retryable and "bad grammar" in str(refused.value)


def _stream_until_text(stream: Any, chunks: int) -> None:
    seen = 0
    for chunk in stream:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen >= chunks:
            return


def test_cancel_from_the_board_and_revoking_the_key_end_the_clients_stream(
    web_url, celery_worker, rig, model_name, owner, admin_user
):
    from inference.board.actions import admin_turn_cancel

    story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    key = apikeys.api_key_create(owner=owner, name="agent")
    client = _client(web_url, key.secret)
    for stop in ("board", "revoke"):
        stream = client.chat.completions.create(model=model_name, max_tokens=700, messages=story, stream=True)
        _stream_until_text(stream, 3)
        turn = Turn.objects.filter(status__in=Turn.ACTIVE).get()
        if stop == "board":
            admin_turn_cancel(actor=admin_user, turn_id=turn.pk)
        else:
            apikeys.api_key_revoke(key_id=key.key.pk, actor=owner)
        with pytest.raises(openai.APIError, match="cancelled"):  # the stream's error event, then its end
            _stream_until_text(stream, 10_000)
        turn.refresh_from_db()
        assert turn.status == Turn.Status.CANCELLED


def test_tools_and_history_count_in_the_context_quota_at_submit(web_url, rig, model_name, owner):
    Quota.objects.create(user=owner, max_context_tokens=300)
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="sdk").secret)
    big_tool = {"type": "function", "function": {"name": "f", "description": "word " * 400, "parameters": WEATHER}}
    with pytest.raises(openai.RateLimitError, match="context"):
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                       tools=[big_tool])  # fmt: skip
    history = [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(openai.RateLimitError, match="context"):
        client.chat.completions.create(model=model_name, messages=[*history, {"role": "user", "content": "hi"}])
    assert not Turn.objects.exists()  # refused at submit: nothing stored


def _ollama(web_url: str, key: str) -> Any:
    import ollama

    return ollama.Client(host=web_url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def test_ollamas_client_chats_generates_and_lists_through_rigdash(web_url, celery_worker, rig, model_name, owner):
    import ollama

    client = _ollama(web_url, apikeys.api_key_create(owner=owner, name="ollama-cli").secret)
    assert model_name in [m.model for m in client.list().models]
    assert client.show(model_name).modelinfo["general.context_length"] > 0
    options = {"temperature": 0, "num_predict": 12}
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat(model=model_name, messages=messages, options=options)
    streamed = list(client.chat(model=model_name, messages=messages, options=options, stream=True))
    assert whole.message.content and "".join(p.message.content for p in streamed) == whole.message.content
    assert streamed[-1].done and streamed[-1].eval_count == whole.eval_count > 0
    json_mode = client.chat(model=model_name, format="json", options={"temperature": 0, "num_predict": 200},
                            messages=[{"role": "system", "content": "Reply with a JSON object of one key."},
                                      {"role": "user", "content": SKY}])  # fmt: skip
    assert isinstance(json.loads(json_mode.message.content), dict)
    generated = client.generate(model=model_name, prompt="def add(a, b):\n", raw=True, options=options)
    assert generated.response and generated.done
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="no-such-model", messages=messages)
    assert missing.value.status_code == 404
    turns = list(Turn.objects.order_by("pk"))
    assert len(turns) == 4 and all(t.status == Turn.Status.DONE for t in turns)
    assert turns[0].params["passthrough"] == {"temperature": 0} and turns[0].params["max_tokens"] == 12
    assert turns[3].params["raw_prompt"] is True and "ollama" in board_row_for(turns[0].pk)["api_client"]["agent"]


def test_ollamas_client_runs_a_tool_loop_and_embeds(web_url, celery_worker, fake_rig, embeddings_url, owner):
    Rig.objects.create(name="embed-rig", kind=Rig.Kind.LLAMACPP, base_url=embeddings_url, queue=TEST_QUEUE_2)
    client = _ollama(web_url, apikeys.api_key_create(owner=owner, name="ollama-agent").secret)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    called = client.chat(model=FAKE_MODEL, messages=messages, tools=TOOLS)
    call = called.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Oslo"}
    streamed = [p for p in client.chat(model=FAKE_MODEL, messages=messages, tools=TOOLS, stream=True)
                if p.message.tool_calls]  # fmt: skip
    assert streamed[0].message.tool_calls[0].function.arguments == {"city": "Oslo"}
    messages += [{"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                 {"role": "tool", "content": "12 C", "tool_name": "get_weather"}]  # fmt: skip
    answer = client.chat(model=FAKE_MODEL, messages=messages, tools=TOOLS)
    assert answer.message.content == "It is 12 C in Oslo."
    sent = FakeOpenAI.bodies[-1]["messages"]  # in OpenAI's shape at the OpenAI-compatible server
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert sent[2] == {"role": "tool", "content": "12 C", "name": "get_weather"}
    vectors = client.embed(model="smol-embed", input=["hello", "world"]).embeddings
    assert len(vectors) == 2 and len(vectors[0]) > 0


def test_a_client_whose_base_url_is_the_root_reaches_the_same_routes(web_url, celery_worker, rig, model_name, owner):
    """llama-server answers /models, /chat/completions and /responses without /v1/ too; a client configured with the
    server's root as its base URL reaches RigDash's same routes, each request a turn."""
    key = apikeys.api_key_create(owner=owner, name="root")
    client = openai.OpenAI(base_url=web_url, api_key=key.secret, max_retries=0, timeout=120)
    assert model_name in {m.id for m in client.models.list().data}
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=6, temperature=0)  # fmt: skip
    answer = client.responses.create(model=model_name, input="Say hi.", max_output_tokens=6, temperature=0)
    assert chat.choices[0].message.content and answer.output_text
    assert [t.status for t in Turn.objects.filter(session__api_key=key.key)] == [Turn.Status.DONE] * 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=web_url, api_key="rdk_wrong", max_retries=0).models.list()
