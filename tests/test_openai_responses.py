"""OpenAI's Responses API at ``/v1/responses``: the body's translation (as llama-server's own
``server_chat_convert_responses_to_chatcmpl``), and the official ``openai`` client's ``responses`` through RigDash's
web server and worker: llama-server's own answer, whole and streamed, a tool-calling loop (against the
OpenAI-compatible stand-in of tests/test_openai_gateway.py: SmolLM2 calls no tools), JSON mode, and the refusals."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from inference.board import apikeys
from inference.models import Turn
from inference.turns.board_rows import board_row_for
from inference.views.openai_request import BadRequest
from inference.views.openai_responses import _Events, chat_body
from tests.test_openai_gateway import FAKE_MODEL, WEATHER, FakeOpenAI, fake_rig  # noqa: F401  (the fixture)

FUNCTION = {"type": "function", "name": "get_weather", "description": "The weather", "parameters": WEATHER}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                              "parameters": WEATHER}}  # fmt: skip


def _client(web_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{web_url}/v1", api_key=key, max_retries=0, timeout=120)


def test_a_conversation_translates_as_llama_server_translates_it() -> None:
    body = {
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0, "top_k": 5,
        "store": True, "metadata": {"a": "b"}, "include": ["reasoning.encrypted_content"], "truncation": "auto",
        "reasoning": {"effort": "low"}, "tool_choice": {"type": "function", "name": "get_weather"},
        "tools": [FUNCTION, {"type": "web_search"}],
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"},
                                         {"type": "input_image", "image_url": "data:image/png;base64,iVBOR"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text",
                                                                            "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "12 C"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 12 C."}]},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "And tomorrow?"},
        ],
    }  # fmt: skip
    assert chat_body(body) == {
        "model": "m", "max_tokens": 64, "temperature": 0, "top_k": 5, "reasoning_effort": "low",
        "tools": [CHAT_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"},
                                                                   "strict": True}},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]},
            {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
            {"role": "assistant", "content": "It is 12 C."},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "And tomorrow?"},
        ],
    }  # fmt: skip
    assert chat_body({"model": "m", "input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]
    json_mode = chat_body({"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}}})
    assert json_mode["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"model": "m"}, "input is required"),
        ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id is not supported"),
        ({"model": "m", "input": "hi", "conversation": "conv_1"}, "conversation is not supported"),
        ({"model": "m", "input": 5}, "input must be a string or a non-empty list"),
        ({"model": "m", "input": []}, "input must be a string or a non-empty list"),
        ({"model": "m", "input": ["hi"]}, "input[0] must be an object"),
        ({"model": "m", "input": [{"type": "mystery"}]}, "input[0]: not a message"),
        ({"model": "m", "input": [{"role": "user", "content": 7}]}, "input[0].content must be a string or a list"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "input_file is not supported"),
        ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
         "an image needs its image_url"),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "a function_call needs call_id"),
        ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "needs its call_id and output"),
        ({"model": "m", "input": "hi", "instructions": 3}, "instructions must be a string"),
        ({"model": "m", "input": "hi", "tools": {"a": 1}}, "tools must be a list of objects"),
        ({"model": "m", "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format must be text, json_object"),
    ],
)  # fmt: skip
def test_a_malformed_body_is_refused_by_what_is_wrong(body: dict[str, Any], words: str) -> None:
    with pytest.raises(BadRequest) as refused:
        chat_body(body)
    assert words in refused.value.message


# Through the live stack ------------------------------------------------------------------------------------------


def _own_text(llama_url: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """llama-server's own /v1/responses answer: its text, and its usage."""
    own = httpx.post(f"{llama_url}/v1/responses", json=body, timeout=120)
    assert own.status_code == 200, own.text
    answer = own.json()
    text = "".join(part["text"] for item in answer["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")  # fmt: skip
    return text, answer["usage"]


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_the_openai_clients_responses_get_llama_servers_own_answer_whole_and_streamed(
    web_url, celery_worker, llama_url, rig, model_name, owner
) -> None:
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="agent").secret)
    request: dict[str, Any] = {"model": model_name, "instructions": "You are terse.", "max_output_tokens": 24,
                               "temperature": 0, "input": "Write a long story about a lighthouse keeper."}  # fmt: skip
    own_text, own_usage = _own_text(llama_url, request)
    whole = client.responses.create(**request)
    assert whole.output_text == own_text and whole.id.startswith("resp_")
    # Cut by max_output_tokens: incomplete, as OpenAI's API says (llama-server's own says completed).
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == own_usage["output_tokens"] == 24
    assert whole.usage.input_tokens == own_usage["input_tokens"]

    events = list(client.responses.create(**request, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]  # fmt: skip
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == own_text
    assert events[-1].response.output[0].content[0].text == own_text and events[-1].response.usage.output_tokens == 24

    with client.responses.stream(**{**request, "max_output_tokens": 60,
                                    "input": "Count from 1 to 10, separated by commas."}) as stream:  # fmt: skip
        final = stream.get_final_response()
    counted, _ = _own_text(llama_url, {**request, "max_output_tokens": 60,
                                       "input": "Count from 1 to 10, separated by commas."})  # fmt: skip
    assert final.status == "completed" and final.output_text == counted

    # The prompt counted as the server counts it (OpenAI's input_tokens endpoint; llama-server serves it too).
    counting = {"model": model_name, "instructions": "You are terse.", "input": request["input"]}
    counted = client.responses.input_tokens.count(**counting)
    own = httpx.post(f"{llama_url}/v1/responses/input_tokens", json=counting, timeout=30).json()
    assert counted.input_tokens == own["input_tokens"] == whole.usage.input_tokens and counted.object == own["object"]

    turns = list(Turn.objects.order_by("pk"))
    assert [t.status for t in turns] == [Turn.Status.DONE] * 3  # a count is not a turn
    assert turns[0].session.context_messages == [{"role": "system", "content": "You are terse."}]
    row = board_row_for(turns[0].pk)
    assert row is not None and row["via_api"] and row["api_client"]["key"] == "agent"
    assert row["api_client"]["agent"].startswith("OpenAI/Python")


@pytest.mark.django_db(transaction=True)
def test_a_tool_calling_loop_through_responses(web_url, celery_worker, fake_rig, owner) -> None:  # noqa: F811
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="agent").secret)
    conversation: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    events = list(client.responses.create(model=FAKE_MODEL, input=conversation, tools=[FUNCTION], stream=True))
    assert [e.type for e in events].count("response.function_call_arguments.delta") == 3  # as the server streamed
    asked = events[-1].response
    assert events[-1].type == "response.completed" and [item.type for item in asked.output] == ["function_call"]
    call = asked.output[0]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("call_7", "get_weather", {"city": "Oslo"})
    assert FakeOpenAI.bodies[-1]["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather", "parameters": WEATHER}}]  # fmt: skip

    conversation += [call.model_dump(exclude_none=True),
                     {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"}]  # fmt: skip
    answer = client.responses.create(model=FAKE_MODEL, input=conversation, tools=[FUNCTION])
    assert answer.output_text == "It is 12 C in Oslo." and answer.status == "completed"
    assert FakeOpenAI.bodies[-1]["messages"][-2:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_7", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "12 C"},
    ]  # fmt: skip
    assert answer.usage.input_tokens == 30 and answer.usage.output_tokens == 4

    json_mode = client.responses.create(model=FAKE_MODEL, input="hi", text={"format": {"type": "json_object"}})
    assert json_mode.output_text and FakeOpenAI.bodies[-1]["response_format"] == {"type": "json_object"}
    for stream in (False, True):  # a field the server refuses: its status and words, streamed or not
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=FAKE_MODEL, input="hi", stream=stream, extra_body={"refuse_me": 1})
        assert "unknown field refuse_me" in refused.value.message and refused.value.body["code"] == "backend_refused"
    turns = list(Turn.objects.order_by("pk"))
    assert [t.status for t in turns] == [Turn.Status.DONE] * 3 + [Turn.Status.FAILED] * 2
    assert turns[1].user_text == "12 C" and turns[1].params["message"]["role"] == "tool"


@pytest.mark.django_db(transaction=True)
def test_refusals_come_back_in_openais_shape_and_store_nothing(web_url, fake_rig, owner) -> None:  # noqa: F811
    """No worker is needed: each is refused before a turn runs."""
    client = _client(web_url, apikeys.api_key_create(owner=owner, name="agent").secret)
    with pytest.raises(openai.BadRequestError) as chained:
        client.responses.create(model=FAKE_MODEL, input="hi", previous_response_id="resp_rd1")
    assert chained.value.body["param"] == "previous_response_id" and "keeps no responses" in chained.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="no-such-model", input="hi")
    assert "no-such-model" in unknown.value.message
    with pytest.raises(openai.AuthenticationError):
        _client(web_url, "rdk_" + "x" * 40).responses.create(model=FAKE_MODEL, input="hi")
    answer = httpx.get(f"{web_url}/v1/responses", headers={"Authorization": f"Bearer {client.api_key}"})
    assert answer.status_code == 405 and answer.json()["error"]["code"] == "method_not_allowed"
    with pytest.raises(openai.APIStatusError) as uncountable:  # an OpenAI-compatible server cannot count: 501
        client.responses.input_tokens.count(model=FAKE_MODEL, input="hi")
    assert uncountable.value.status_code == 501 and uncountable.value.body["code"] == "not_supported"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.input_tokens.count(model=FAKE_MODEL, input=[{"type": "mystery"}])
    assert bad.value.body["param"] == "input" and "not a message" in bad.value.message
    assert Turn.objects.count() == 0 and FakeOpenAI.bodies == []


def test_a_streamed_replys_items_open_and_close_in_order_with_their_indexes() -> None:
    """Thoughts, then text, then a tool call in two deltas (a reasoning model's reply; SmolLM2 gives only text): each
    item is added, streamed and done before the next, at its place in the output."""
    turn = Turn(pk=7)
    events = _Events(turn)
    raw = [*events.thinking("Use "), *events.thinking("the tool."), *events.text("Checking."),
           *events.tool({"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": '{"ci'}}),
           *events.tool({"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}), *events.close()]  # fmt: skip
    parsed = [json.loads(chunk.decode().split("data: ", 1)[1]) for chunk in raw]
    assert [e["sequence_number"] for e in parsed] == list(range(len(parsed)))
    assert [(e["type"], e.get("output_index")) for e in parsed] == [
        ("response.output_item.added", 0), ("response.reasoning_text.delta", 0), ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0), ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.content_part.added", 1), ("response.output_text.delta", 1),
        ("response.output_text.done", 1), ("response.content_part.done", 1), ("response.output_item.done", 1),
        ("response.output_item.added", 2), ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2), ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
    ]  # fmt: skip
    assert [item["type"] for item in events.output] == ["reasoning", "message", "function_call"]
    assert events.output[0]["content"][0]["text"] == "Use the tool." and events.output[1]["content"][0]["text"] == (
        "Checking.")  # fmt: skip
    call = events.output[2]
    assert (call["call_id"], call["id"], call["arguments"], call["status"]) == (
        "call_1", "fc_call_1", '{"city": "Oslo"}', "completed")  # fmt: skip
    assert parsed[0]["item"]["status"] == "in_progress" and parsed[11]["item"]["arguments"] == ""


@pytest.mark.parametrize("field", [5, "text", {"text": "x"}])
def test_a_reasoning_items_odd_fields_are_left_out_not_a_crash(field: Any) -> None:
    body = {"model": "m", "input": [{"type": "reasoning", "summary": field, "content": field},
                                    {"role": "user", "content": "hi"}]}  # fmt: skip
    assert chat_body(body)["messages"] == [{"role": "user", "content": "hi"}]
