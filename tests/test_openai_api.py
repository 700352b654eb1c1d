"""The OpenAI-compatible API's edge: the official ``openai`` client against RigDash's web server (uvicorn) in front
of the real llama-server, for the model list and key authentication; the chat request parser on its own (what
RigDash checks, what it passes on)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from django.conf import settings
from django.test import Client

from inference.board import apikeys
from inference.models import Rig
from inference.views.openai import BadRequest, chat_request_parse, model_catalogue, model_resolve
from tests.conftest import session_cookie_for

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": [{"type": "text", "text": "Why?"}]},
]


def _client(web_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{web_url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_models_through_the_official_client(web_url, rig, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="sdk")
    client = _client(web_url, key.secret)
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert models.data[0].owned_by == rig.name and models.data[0].object == "model"
    assert client.models.retrieve(model_name).id == model_name
    assert client.models.retrieve(f"{rig.name}/{model_name}").id == f"{rig.name}/{model_name}"  # pinned to the rig
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found"


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_missing_malformed_unknown_and_revoked_keys_get_openais_401(web_url, rig, owner):
    key = apikeys.api_key_create(owner=owner, name="sdk")
    missing = httpx.get(f"{web_url}/v1/models")  # the client itself refuses to send no key
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert missing.json()["error"]["code"] == "invalid_api_key" and "provide an API key" in missing.text
    for bad in ("sk-not-ours", "rdk_" + "B" * 43, key.secret + "x"):
        with pytest.raises(openai.AuthenticationError) as refused:
            _client(web_url, bad).models.list()
        assert refused.value.status_code == 401
        assert refused.value.body["code"] == "invalid_api_key" and refused.value.body["type"] == "invalid_request_error"
    apikeys.api_key_revoke(key_id=key.key.pk, actor=owner)
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        _client(web_url, key.secret).models.list()
    # A logged-in browser session is not an API key: /v1/ takes keys only.
    cookie = session_cookie_for(owner)
    assert httpx.get(f"{web_url}/keys/", cookies={settings.SESSION_COOKIE_NAME: cookie}).status_code == 200
    response = httpx.get(f"{web_url}/v1/models", cookies={settings.SESSION_COOKIE_NAME: cookie})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.llama
@pytest.mark.django_db
def test_a_model_on_two_rigs_is_named_by_itself_for_any_rig_and_by_rig_for_one(rig, llama_url, model_name):
    Rig.objects.create(name="twin", kind=Rig.Kind.LLAMACPP, base_url=llama_url, queue="rig.twin")
    Rig.objects.create(name="down", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="rig.down")
    catalogue = model_catalogue()
    ids = sorted(entry.id for entry in catalogue)
    # The rig that is down is left out; the plain name is placed on either rig, each rig's name pins to it.
    assert ids == sorted([model_name, f"{rig.name}/{model_name}", f"twin/{model_name}"])
    assert [e.placed for e in catalogue if e.id == model_name] == [True]
    pinned = model_resolve(f"twin/{model_name}", catalogue)
    assert pinned is not None and (pinned.rig.name, pinned.placed) == ("twin", False)


@pytest.mark.django_db
def test_the_api_needs_no_csrf_token_and_refuses_other_methods(owner):
    key = apikeys.api_key_create(owner=owner, name="sdk")
    response = Client(enforce_csrf_checks=True).post("/v1/models", HTTP_AUTHORIZATION=f"Bearer {key.secret}")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


def test_a_chat_request_becomes_a_turn_request():
    """RigDash reads what it owns (model, messages, stream flags, the token cap) and keeps every other field, as
    sent, for the backend (``passthrough``); a last message that is more than a user's text is kept whole."""
    body = {"model": "m", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0.5, "max_completion_tokens": 64, "seed": 7, "user": "tag", "top_k": 40}  # fmt: skip
    parsed = chat_request_parse(json.dumps(body).encode())
    assert parsed.model == "m" and parsed.user_text == "Why?"
    assert parsed.history == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello!"}]  # fmt: skip
    assert parsed.stream and parsed.include_usage
    assert parsed.params == {"max_tokens": 64, "message": MESSAGES[-1],
                             "passthrough": {"temperature": 0.5, "seed": 7, "user": "tag", "top_k": 40}}  # fmt: skip
    plain = chat_request_parse(json.dumps({"model": "m", "messages": MESSAGES[1:2]}).encode())
    assert not plain.stream and not plain.include_usage and plain.params == {} and plain.history == []
    assert plain.user_text == "Hi"


TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
# The fields the issue names, each passed on unchanged (llama-server takes them all).
PASSED = [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    ("tool_choice", "auto"),
    ("stop", ["\n", "END"]),
    ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
    ("logprobs", True),
    ("top_logprobs", 2),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5),
    ("top_k", 20),
    ("min_p", 0.1),
    ("repeat_penalty", 1.1),
    ("temperature", 5),  # the backend's range, not RigDash's: it says what it refuses
    ("logit_bias", {"42": -100}),
]


@pytest.mark.parametrize(("name", "value"), PASSED)
def test_fields_rigdash_does_not_own_are_passed_on_unchanged(name, value):
    parsed = chat_request_parse(json.dumps({"model": "m", "messages": MESSAGES[1:2], name: value}).encode())
    assert parsed.params["passthrough"] == {name: value}


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}],
        [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Autumn"}],  # a prefill
        [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
    ],
)  # fmt: skip
def test_any_role_and_message_shape_is_passed_on(messages):
    parsed = chat_request_parse(json.dumps({"model": "m", "messages": messages}).encode())
    assert [*parsed.history, parsed.params.get("message", {"role": "user", "content": parsed.user_text})] == messages
    assert parsed.user_text.strip()  # the board's text for the turn


BAD = [
    (b"{not json", "not valid JSON", None),
    (b"[]", "JSON object", None),
    (json.dumps({"messages": MESSAGES}).encode(), "model", "model"),
    (json.dumps({"model": "m", "messages": []}).encode(), "non-empty array", "messages"),
    (json.dumps({"model": "m", "messages": [{"content": "x"}]}).encode(), "role", "messages"),
    (json.dumps({"model": "m", "messages": ["hi"]}).encode(), "role", "messages"),
    (json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 10**6}).encode(), "max_tokens", "max_tokens"),
    (
        json.dumps({"model": "m", "messages": MESSAGES, "max_completion_tokens": 0}).encode(),
        "max_completion_tokens",
        "max_completion_tokens",
    ),
    (json.dumps({"model": "m", "messages": MESSAGES, "stream": "yes"}).encode(), "boolean", "stream"),
    (
        json.dumps({"model": "m", "messages": MESSAGES, "stream": True, "stream_options": 1}).encode(),
        "stream_options",
        "stream_options",
    ),
    (json.dumps({"model": "m", "messages": MESSAGES, "n": 2}).encode(), "n=1", "n"),
]


@pytest.mark.parametrize(("body", "message", "param"), BAD)
def test_bad_chat_requests_are_refused_with_a_reason(body, message, param):
    with pytest.raises(BadRequest, match=message) as refused:
        chat_request_parse(body)
    assert refused.value.status == 400 and refused.value.param == param


USER = '"messages": [{"role": "user", "content": "hi"}]'
HOSTILE = [
    '{"model": "m", ' + USER + ', "temperature": NaN}',
    '{"model": "m", ' + USER + ', "temperature": Infinity}',
    '{"model": "m", ' + USER + ', "temperature": -Infinity}',
    '{"model": "m", ' + USER + ', "temperature": 1e400}',
    '{"model": "m", ' + USER + ', "seed": ' + "9" * 5000 + "}",
    '{"model": "m", ' + USER + ', "max_tokens": ' + "9" * 40 + "}",
    '{"model": "m", ' + USER + ', "top_k": \u0661\u0662}',  # Arabic-Indic digits are not JSON numbers
    '{"model": "m", ' + USER + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_numbers_and_nesting_are_refused(body):
    with pytest.raises(BadRequest) as refused:
        chat_request_parse(body.encode())
    assert refused.value.status == 400


def test_nulls_are_fields_left_out():
    body = {"model": "m", "messages": MESSAGES[1:2], "n": 1, "tools": None, "tool_choice": None, "stop": None}
    assert chat_request_parse(json.dumps(body).encode()).params == {}


def test_oversized_bodies_and_messages():
    with pytest.raises(BadRequest) as too_big:
        chat_request_parse(b" " * (settings.API_MAX_BODY_BYTES + 1))
    assert too_big.value.status == 413
    long = [{"role": "user", "content": "x" * (settings.RIGDASH.max_message_chars + 1)}]
    with pytest.raises(BadRequest, match="longer than"):
        chat_request_parse(json.dumps({"model": "m", "messages": long}).encode())
