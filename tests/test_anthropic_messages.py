"""Anthropic's Messages API through RigDash (``POST /v1/messages``, inference/views/anthropic_messages.py): Anthropic's
official ``anthropic`` client against RigDash's web server and a Celery worker, with a RigDash key.

Against the real llama-server with SmolLM2-135M: whole and streamed replies give the text llama-server's own
``/v1/messages`` gives the same greedy request, stop sequences and the system prompt reach it, and each request is a
turn of its key (board, usage). The tool-use loop runs against the small OpenAI-compatible server of
tests/test_openai_gateway.py (SmolLM2 does not call tools): ``tool_use`` blocks streamed as ``input_json_delta``, and
the ``tool_result`` reaching the server as OpenAI's tool message. The translation itself is tested without servers."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from inference.board import apikeys
from inference.live import served
from inference.models import Quota, Turn
from inference.turns.board_rows import board_row_for
from inference.views.anthropic_messages import openai_body
from inference.views.openai_request import BadRequest
from tests.test_openai_gateway import FAKE_MODEL, FakeOpenAI, fake_rig  # noqa: F401  (the ``fake_rig`` fixture)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "The weather", "input_schema": WEATHER}]


def _client(web_url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=web_url, api_key=key, max_retries=0, timeout=120)


# The translation, as llama-server's own (tools/server/server-chat.cpp server_chat_convert_anthropic_to_oai) --------


def test_a_conversation_with_tools_translates_as_llama_server_translates_it() -> None:
    body = {
        "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "stop_sequences": ["\n\n"], "temperature": 0, "top_k": 5, "metadata": {"user_id": "u1"}, "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"}, "thinking": {"type": "enabled", "budget_tokens": 99},
        "service_tier": "auto",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "iVBOR"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "12 C"}]}]},
        ],
    }  # fmt: skip
    assert openai_body(body) == {
        "model": "m", "max_tokens": 64, "stop": ["\n\n"], "temperature": 0, "top_k": 5, "stream": False,
        "thinking_budget_tokens": 99, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                                    "parameters": WEATHER}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
            {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
             "tool_calls": [{"id": "toolu_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "12 C"},
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": "m", "messages": []}, "messages: a non-empty list is required"),
        ({"model": "m", "messages": [{"role": "system", "content": "hi"}]}, "role is 'user' or 'assistant'"),
        ({"model": "m", "messages": [{"role": "user", "content": 7}]}, "content must be a string or a list"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "must be an object with a type"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "must be a string"),
        ({"model": "m", "system": 5, "messages": [{"role": "user", "content": "hi"}]}, "system must be"),
        ({"model": "m", "stop_sequences": "x", "messages": [{"role": "user", "content": "hi"}]}, "stop_sequences"),
        ({"model": "m", "tools": {"a": 1}, "messages": [{"role": "user", "content": "hi"}]}, "tools must be a list"),
        ({"model": "m", "tool_choice": "auto", "messages": [{"role": "user", "content": "hi"}]}, "tool_choice"),
        ({"model": "m", "stream": "yes", "messages": [{"role": "user", "content": "hi"}]}, "stream must be a boolean"),
    ],
)
def test_a_malformed_body_is_refused_by_what_is_wrong(body: dict[str, Any], words: str) -> None:
    with pytest.raises(BadRequest) as refused:
        openai_body(body)
    assert words in refused.value.message


# Through the live stack ------------------------------------------------------------------------------------------


def _direct(request: dict[str, Any]) -> dict[str, Any]:
    """The SDK call's arguments as the body it sends."""
    return {**{k: v for k, v in request.items() if k != "extra_body"}, **request.get("extra_body", {})}


def _own_answer(llama_url: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{llama_url}/v1/messages", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_anthropics_client_gets_llama_servers_own_answer_whole_and_streamed(
    web_url, celery_worker, llama_url, rig, model_name, owner
) -> None:
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="claude").secret)
    # Greedy, to compare texts; the SDK (2.x) has no sampler arguments, so it goes as an extra field.
    request: dict[str, Any] = {
        "model": model_name, "max_tokens": 24, "system": "You are terse.", "extra_body": {"temperature": 0},
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
    }  # fmt: skip
    own = _own_answer(llama_url, _direct(request))
    whole = client.messages.create(**request)
    assert [b.type for b in whole.content] == ["text"] and whole.role == "assistant"
    assert whole.content[0].text == own["content"][0]["text"]
    assert (whole.stop_reason, own["stop_reason"]) == ("max_tokens", "max_tokens")
    assert whole.usage.output_tokens == own["usage"]["output_tokens"] == 24

    with client.messages.stream(**request) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert len(texts) > 1 and "".join(texts) == own["content"][0]["text"]
    assert streamed.content[0].text == own["content"][0]["text"] and streamed.stop_reason == "max_tokens"
    assert streamed.usage.output_tokens == 24

    counting = {**request, "max_tokens": 60, "messages": [{"role": "user", "content": "Count from 1 to 10, separated "
                                                                                      "by commas."}]}  # fmt: skip
    stopped = client.messages.create(**counting, stop_sequences=["7", "5"])
    own_stopped = _own_answer(llama_url, _direct({**counting, "stop_sequences": ["7", "5"]}))
    assert stopped.content[0].text == own_stopped["content"][0]["text"] and "5" not in stopped.content[0].text
    # Which sequence ended it, as llama-server's own answer says; its reason as Anthropic's API gives it (llama-server
    # says end_turn: docs/openai.md).
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "5")
    assert own_stopped["stop_sequence"] == "5"
    with client.messages.stream(**counting, stop_sequences=["5"]) as stream:
        ended = stream.get_final_message()
    assert (ended.stop_reason, ended.stop_sequence) == ("stop_sequence", "5")
    unmatched = client.messages.create(**{**counting, "max_tokens": 3}, stop_sequences=["@@"])
    assert (unmatched.stop_reason, unmatched.stop_sequence) == ("max_tokens", None)

    turns = list(Turn.objects.order_by("pk"))
    assert [t.status for t in turns] == [Turn.Status.DONE] * 5
    assert turns[0].session.context_messages == [{"role": "system", "content": "You are terse."}]
    rows = [board_row_for(t.pk) for t in turns]
    assert all(r is not None and r["via_api"] and r["api_client"]["key"] == "claude" for r in rows)
    assert all(r is not None and r["api_client"]["agent"].startswith("Anthropic/Python") for r in rows)
    used = apikeys.api_key_usage([turns[0].session.api_key])[turns[0].session.api_key_id]
    assert used.turns == 5 and used.output_tokens == sum(t.output_tokens or 0 for t in turns)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_anthropics_client_runs_a_tool_use_loop(web_url, celery_worker, fake_rig, owner) -> None:  # noqa: F811
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="agent").secret)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    with client.messages.stream(model=FAKE_MODEL, max_tokens=100, messages=messages, tools=TOOLS) as stream:
        events = [event.type for event in stream]
        asked = stream.get_final_message()
    assert asked.stop_reason == "tool_use" and [b.type for b in asked.content] == ["tool_use"]
    call = asked.content[0]
    assert (call.id, call.name, call.input) == ("call_7", "get_weather", {"city": "Oslo"})
    assert events.count("input_json") == 3  # the arguments as the server streamed them, in three pieces
    sent = FakeOpenAI.bodies[-1]
    assert sent["tools"] == [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                                               "parameters": WEATHER}}]  # fmt: skip

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "12 C"}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in asked.content]},
                 {"role": "user", "content": [result]}]  # fmt: skip
    answer = client.messages.create(model=FAKE_MODEL, max_tokens=100, messages=messages, tools=TOOLS,
                                    stop_sequences=["Celsius"])  # fmt: skip
    assert answer.content[0].text == "It is 12 C in Oslo."
    assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", "Celsius")  # the server's stop_reason
    assert FakeOpenAI.bodies[-1]["messages"][-2:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_7", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "12 C"},
    ]  # fmt: skip
    assert answer.usage.input_tokens == 30 and answer.usage.output_tokens == 4

    whole = client.messages.create(model=FAKE_MODEL, max_tokens=100, messages=messages[:1], tools=TOOLS)
    assert whole.stop_reason == "tool_use" and whole.content[0].input == {"city": "Oslo"}


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_refusals_come_back_in_anthropics_shape(web_url, rig, model_name, owner) -> None:
    """No worker is needed: each is refused before a turn runs (and the bad ones store nothing)."""
    key = apikeys.api_key_create(owner=owner, name="claude").secret
    with pytest.raises(anthropic.AuthenticationError) as wrong_key:
        _client(web_url, "rdk_" + "x" * 40).messages.create(model=model_name, max_tokens=5,
                                                            messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert wrong_key.value.body["error"]["type"] == "authentication_error"
    client = _client(web_url, key)
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert "no-such-model" in unknown.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=model_name, max_tokens=5, messages=[{"role": "system", "content": "hi"}])
    words = "messages[0] must be an object whose role is 'user' or 'assistant'"
    assert bad.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": words}}
    bearer = httpx.post(f"{web_url}/v1/messages", headers={"Authorization": f"Bearer {key}"},
                        content=b'{"model": "m", "messages": [1e999]}')  # fmt: skip
    assert bearer.status_code == 400 and bearer.json()["type"] == "error"  # a bearer token is taken too
    assert Turn.objects.count() == 0


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_anthropics_client_lists_and_retrieves_the_models_page_by_page(web_url, rig, llama_url, model_name,
                                                                       owner) -> None:  # fmt: skip
    """``/v1/models`` in Anthropic's shape for Anthropic's client (its ``anthropic-version`` header, its key in
    ``x-api-key``), the same ids as OpenAI's list, paged; OpenAI's shape for anyone else."""
    from inference.models import Rig

    Rig.objects.create(name="twin", kind=Rig.Kind.LLAMACPP, base_url=llama_url, queue="rig.twin")
    key = apikeys.api_key_create(owner=owner, name="claude").secret
    client = _client(web_url, key)
    openai_models = httpx.get(f"{web_url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    openai_ids = [m["id"] for m in openai_models]
    assert openai_ids == [model_name, f"test-rig/{model_name}", f"twin/{model_name}"]
    listed = client.models.list()
    assert [m.id for m in listed.data] == openai_ids and listed.has_more is False
    assert listed.data[0].type == "model" and listed.data[0].created_at.tzinfo is not None
    contexts = [m["context_length"] for m in openai_models]
    assert [m.max_input_tokens for m in listed.data] == contexts and contexts[0]
    paged = [m.id for m in client.models.list(limit=1)]  # the client follows after_id, page by page
    assert paged == openai_ids
    first = client.models.list(limit=1)
    assert first.has_more is True and first.first_id == first.last_id == model_name
    back = client.models.list(limit=5, before_id=f"twin/{model_name}")
    assert [m.id for m in back.data] == openai_ids[:2] and back.has_more is False
    assert client.models.retrieve(f"twin/{model_name}").display_name == f"twin/{model_name}"

    with pytest.raises(anthropic.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.models.list(limit=0)
    assert "limit" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        client.models.list(after_id="no-such-model")
    with pytest.raises(anthropic.AuthenticationError) as wrong_key:
        _client(web_url, "rdk_" + "x" * 43).models.list()
    assert wrong_key.value.body["type"] == "error"
    # Without the header: OpenAI's shape, and a key only as a bearer token.
    plain = httpx.get(f"{web_url}/v1/models/{model_name}", headers={"Authorization": f"Bearer {key}"})
    assert plain.json()["object"] == "model"
    assert httpx.get(f"{web_url}/v1/models", headers={"X-Api-Key": key}).status_code == 401


def test_a_streamed_replys_blocks_start_and_stop_in_order() -> None:
    """Thoughts, text and two tool calls as the stream's pieces give them: each block started once, its deltas at its
    index, a thinking block signed before its stop; a call index the backend garbled counts as the first call's."""
    from inference.views.anthropic_messages import _Blocks

    blocks = _Blocks()
    raw = [*blocks.thinking("Hm"), *blocks.thinking("m."), *blocks.text("Hi"),
           *blocks.tool({"index": 0, "id": "c0", "function": {"name": "f", "arguments": ""}}),
           *blocks.tool({"index": 0, "function": {"arguments": "{}"}}),
           *blocks.tool({"index": 1, "id": "c1", "function": {"name": "g", "arguments": '{"a"'}}),
           *blocks.tool({"index": "1", "function": {"arguments": ": 1}"}}), *blocks.stop(), *blocks.stop()]  # fmt: skip
    seen = []
    for event in raw:
        name, data = event.decode().removesuffix("\n\n").split("\n")
        body = json.loads(data.removeprefix("data: "))
        assert name == f"event: {body['type']}"
        part = body.get("content_block") or body.get("delta") or {}
        seen.append((body["type"].removeprefix("content_block_"), body["index"], part.get("type")))
    assert seen == [
        ("start", 0, "thinking"), ("delta", 0, "thinking_delta"), ("delta", 0, "thinking_delta"),
        ("delta", 0, "signature_delta"), ("stop", 0, None),
        ("start", 1, "text"), ("delta", 1, "text_delta"), ("stop", 1, None),
        ("start", 2, "tool_use"), ("delta", 2, "input_json_delta"), ("stop", 2, None),
        ("start", 3, "tool_use"), ("delta", 3, "input_json_delta"), ("stop", 3, None),
        ("start", 4, "tool_use"), ("delta", 4, "input_json_delta"), ("stop", 4, None),
    ]  # fmt: skip


# Token counting (POST /v1/messages/count_tokens) ---------------------------------------------------------------


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_anthropics_client_counts_tokens_as_llama_server_itself_counts_them(
    web_url, llama_url, rig, model_name, owner
) -> None:
    """No worker: a count is not a turn. The figure is the rig's own server's for the same body (its template, the
    system prompt, the tools)."""
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="claude").secret)
    plain: dict[str, Any] = {"model": model_name, "system": "You are terse.",
                             "messages": [{"role": "user", "content": "Count from 1 to 10."}]}  # fmt: skip
    with_tools = {**plain, "tools": TOOLS, "tool_choice": {"type": "auto"}}
    counts = []
    for body in (plain, with_tools):
        own = httpx.post(f"{llama_url}/v1/messages/count_tokens", json=body, timeout=30)
        assert own.status_code == 200, own.text
        counted = client.messages.count_tokens(**body)
        assert counted.input_tokens == own.json()["input_tokens"] > 0
        counts.append(counted.input_tokens)
    longer = client.messages.count_tokens(
        **{**plain, "messages": [*plain["messages"], {"role": "assistant", "content": "1, 2, 3"}]}
    )
    assert longer.input_tokens > counts[0]
    # As the sampler keeps the rig's loaded models: a model left out is refused unasked, one listed is counted.
    served.loaded_store(rig.pk, ["another-model"])
    try:
        with pytest.raises(anthropic.APIStatusError) as unloaded:
            client.messages.count_tokens(**plain)
        assert unloaded.value.status_code == 409 and "not loaded on rig test-rig" in unloaded.value.message
        served.loaded_store(rig.pk, [model_name])
        assert client.messages.count_tokens(**plain).input_tokens == counts[0]
    finally:
        served.loaded_store(rig.pk, None)
    assert Turn.objects.count() == 0  # nothing stored, nothing queued


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_a_count_is_refused_by_what_is_wrong_and_counts_in_the_keys_rate_limit(web_url, rig, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="claude").secret
    url = f"{web_url}/v1/messages/count_tokens"
    hi = {"model": model_name, "messages": [{"role": "user", "content": "hi"}]}

    def ask(body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.post(url, json=body, headers={"x-api-key": key} if headers is None else headers, timeout=30)

    cases = [
        (ask(hi, {"x-api-key": "rdk_" + "x" * 40}), 401, "authentication_error", "API key"),
        (ask(hi, {}), 401, "authentication_error", "x-api-key"),
        (ask({**hi, "messages": "hi"}), 400, "invalid_request_error", "messages: a non-empty list is required"),
        (ask({**hi, "messages": [{"role": "tool", "content": "x"}]}), 400, "invalid_request_error", "role is 'user'"),
        (ask({"messages": hi["messages"]}), 400, "invalid_request_error", "model"),
        (ask({**hi, "model": "no-such-model"}), 404, "not_found_error", "no-such-model"),
        (httpx.get(url, headers={"x-api-key": key}), 405, "invalid_request_error", "Use POST"),
    ]
    for answer, status, kind, words in cases:
        assert answer.status_code == status, answer.text
        error = answer.json()
        assert error["type"] == "error" and error["error"]["type"] == kind and words in error["error"]["message"]
    garbled = httpx.post(url, content=b'{"model": ', headers={"x-api-key": key}, timeout=30)
    assert garbled.status_code == 400 and garbled.json()["error"]["type"] == "invalid_request_error"

    Quota.objects.create(user=owner, key_requests_per_minute=2)
    assert ask(hi).status_code == 200 and ask(hi).status_code == 200
    limited = ask(hi)
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limit_error", limited.text
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert Turn.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_rig_whose_server_cannot_count_answers_501(web_url, fake_rig, owner) -> None:  # noqa: F811
    """An OpenAI-compatible server has no token count (nor a way to read its template): 501, and it is not asked."""
    key = apikeys.api_key_create(owner=owner, name="claude").secret
    answer = httpx.post(f"{web_url}/v1/messages/count_tokens", headers={"x-api-key": key}, timeout=30,
                        json={"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert answer.status_code == 501, answer.text
    assert answer.json()["error"] == {
        "type": "api_error",
        "message": "Rig fake-rig's server (openai) cannot count tokens.",
    }
    assert FakeOpenAI.bodies == []


# Claude Code's billing header (its cch= stamp changes on every request) -------------------------------------------

HEADER = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch={};"


@pytest.mark.parametrize(
    ("system", "sent"),
    [
        (HEADER.format("a5145") + "You are Claude Code.", HEADER.format("fffff") + "You are Claude Code."),
        ([{"type": "text", "text": HEADER.format("0b9c2")}, {"type": "text", "text": "You are Claude Code."}],
         HEADER.format("fffff") + "You are Claude Code."),
        ("Say cch=a5145; as it is.", "Say cch=a5145; as it is."),  # not the header: left alone
        ("x-anthropic-billing-header: cc_version=2; cch=a51;x", "x-anthropic-billing-header: cc_version=2; cch=a51;x"),
        ("x-anthropic-billing-header: cch=a5145", "x-anthropic-billing-header: cch=a5145"),  # no ';' after it
    ],
)  # fmt: skip
def test_the_billing_headers_stamp_is_fixed_as_llama_server_fixes_it(system: Any, sent: str) -> None:
    body = {"model": "m", "system": system, "messages": [{"role": "user", "content": "hi"}]}
    assert openai_body(body)["messages"][0] == {"role": "system", "content": sent}


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_requests_differing_only_in_the_billing_stamp_reuse_the_servers_prompt_cache(
    web_url, celery_worker, rig, model_name, owner
) -> None:
    """Claude Code's system prompt through RigDash: the second request's prompt is read from the server's cache
    (``cache_read_input_tokens``), not again from its first tokens."""
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="claude-code").secret)
    rules = " ".join(f"Rule {n}: answer in plain words and keep each answer short." for n in range(1, 25))
    answers = []
    for stamp in ("a5145", "e07d3"):
        answers.append(client.messages.create(
            model=model_name, max_tokens=1, extra_body={"temperature": 0},
            system=[{"type": "text", "text": HEADER.format(stamp)}, {"type": "text", "text": rules}],
            messages=[{"role": "user", "content": "Name a colour."}],
        ))  # fmt: skip
    second = answers[1].usage
    prompt = second.input_tokens + (second.cache_read_input_tokens or 0)
    assert prompt > 300 and (second.cache_read_input_tokens or 0) >= prompt - 8, second
