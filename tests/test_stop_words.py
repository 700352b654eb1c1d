"""Which stop sequence ended a reply, as each backend's stream says it (pure parsing; the live replies are in
tests/test_anthropic_messages.py). llama-server (tools/server/server-task.cpp ``to_json_oaicompat_chat_stream``)
puts its ``__verbose`` object on the final result's first chunk, which is a text chunk before the finish chunk when
the end brought text; vLLM names the string in the finish chunk's ``stop_reason`` (a token id when none matched)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.backends.base import ChatRequest
from inference.backends.llamacpp.chat import LlamaCppBackend, _Events
from inference.backends.openai.chat import UsageEvents


def _event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


def test_llama_servers_stop_word_reaches_the_finish_chunk_when_it_came_before_it() -> None:
    reader = _Events()
    text = reader.event(_event({"content": "4, "}, __verbose={"stopping_word": "5"}), last_in_read=False)
    assert text.text == "4, " and text.finish_reason is None
    end = reader.event(_event({}, "stop", timings={"predicted_n": 9}), last_in_read=True)
    assert (end.finish_reason, end.stop_word) == ("stop", "5")


@pytest.mark.parametrize("verbose", [{"stopping_word": ""}, {"stopping_word": 5}, "5", None, {}])
def test_no_stop_word_or_a_malformed_one_is_none(verbose: Any) -> None:
    reader = _Events()
    end = reader.event(_event({}, "stop", **({} if verbose is None else {"__verbose": verbose})), last_in_read=True)
    assert end.finish_reason == "stop" and end.stop_word is None


def test_the_request_asks_llama_server_for_the_stop_word_only_with_stop_sequences() -> None:
    backend = LlamaCppBackend("http://127.0.0.1:9")
    asked = backend._payload(ChatRequest(model="m", messages=[], max_tokens=8, stop=("###",)))
    assert asked["verbose"] is True and asked["response_fields"] == ["stopping_word"] and asked["stop"] == ["###"]
    passed = backend._payload(ChatRequest(model="m", messages=[], max_tokens=8, extra={"stop": "###"}))  # an API's
    assert passed["verbose"] is True and passed["stop"] == "###"
    assert "verbose" not in backend._payload(ChatRequest(model="m", messages=[], max_tokens=8))
    raw = ChatRequest(model="m", messages=[], max_tokens=8, prompt="def f(", stop=("\n\n",))  # /v1/completions
    assert "verbose" not in backend._payload(raw) and backend._payload(raw)["stop"] == ["\n\n"]


@pytest.mark.parametrize(("stop_reason", "word"), [("END", "END"), (128009, None), (None, None), ("", None)])
def test_vllms_stop_reason_names_the_stop_string_only(stop_reason: Any, word: str | None) -> None:
    reader = UsageEvents()
    reader.event(_event({"content": "hi"}), last_in_read=False)
    event = json.loads(_event({}, "stop"))
    event["choices"][0]["stop_reason"] = stop_reason
    assert reader.event(json.dumps(event), last_in_read=True) is None
    end = reader.done()
    assert end is not None and (end.finish_reason, end.stop_word) == ("stop", word)
