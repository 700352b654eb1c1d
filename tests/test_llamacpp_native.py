"""llama-server's own API through RigDash (inference/views/llamacpp_native.py): ``/completion``, ``/infill``,
``/tokenize`` and ``/detokenize``, asked as llama.vim, llama.vscode and SillyTavern ask them, answered as the real
llama-server answers the same request directly.

Every comparison asks the rig's server itself the same body (temperature 0) and compares what a client reads. The
infill cases run on a tiny model written here with fill-in-the-middle tokens (tests/tiny_gguf.py): SmolLM2 has none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from inference.board import apikeys
from inference.models import Quota, Rig, Turn
from rigdash.launcher import Stack
from tests import tiny_gguf
from tests.conftest import TEST_QUEUE_2, llama_busy_slots, wait_until
from tests.tinykit import tiny_llama_server, vllm_like_rig

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]
PROMPT = "The capital of France is"
# What a client reads of the last result that RigDash and the server both know (the slot, token ids, the prompt and
# the generation settings RigDash does not keep).
COMPARED = ("content", "stop", "tokens_predicted", "tokens_evaluated", "tokens_cached", "truncated", "stop_type",
            "stopping_word", "has_new_line")  # fmt: skip


@pytest.fixture(scope="module")
def fim_url(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """llama-server with a tiny llama model whose vocabulary names fill-in-the-middle tokens (all its weights are
    zero: its output is nonsense, the same nonsense every time), named ``tiny-fim``. One slot of 4,096 tokens: the
    server takes ``input_extra`` only past its batch size (2,048)."""
    meta, tensors = tiny_gguf.llama_gqa(layers=2)
    meta |= {"tokenizer.ggml.fim_pre_token_id": 3, "tokenizer.ggml.fim_suf_token_id": 4,
             "tokenizer.ggml.fim_mid_token_id": 5}  # fmt: skip
    model = tiny_gguf.write_gguf(tmp_path_factory.mktemp("fim") / "tiny-fim.gguf", meta, tensors)
    return tiny_llama_server(stack, model, "tiny-fim", ctx=4096)


def _post(url: str, path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=120)


def _events(url: str, path: str, body: dict[str, Any], key: str | None = None) -> list[str]:
    """A stream's raw ``data:`` payloads, as a client of llama-server reads them."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.stream("POST", f"{url}{path}", json=body, headers=headers, timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        text = response.read().decode()
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block.startswith("data: ")]


def _compared(answer: dict[str, Any]) -> dict[str, Any]:
    """What a client reads; of the timings, the tokens decoded and the prompt's (read or taken from the server's
    prompt cache, which outlives a slot's erasure: how they split depends on the requests before)."""
    timings = answer.get("timings") or {}
    read = timings.get("prompt_n", 0) + timings.get("cache_n", 0)
    return {**{name: answer.get(name) for name in COMPARED}, "predicted_n": timings.get("predicted_n"), "read": read}


def _fresh(url: str) -> None:
    """Empty the server's prompt cache (a slot erased), so that the direct and the RigDash request read the same."""
    for slot in httpx.get(f"{url}/slots", timeout=10).json():
        httpx.post(f"{url}/slots/{slot['id']}?action=erase", timeout=10)


def test_completion_whole_and_streamed_equals_llama_servers_own(
    web_url, celery_worker, rig, llama_url, model_name, owner
):
    """SillyTavern's llama.cpp mode: ``/completion`` with llama-server's samplers, whole and streamed; each a turn."""
    key = apikeys.api_key_create(owner=owner, name="sillytavern")
    body = {
        "prompt": PROMPT,
        "n_predict": 12,
        "temperature": 0,
        "top_k": 1,
        "repeat_penalty": 1.0,
        "cache_prompt": False,
    }
    _fresh(llama_url)
    direct = _post(llama_url, "/completion", body).json()
    _fresh(llama_url)
    through = _post(web_url, "/completion", {**body, "model": f"{rig.name}/{model_name}"}, key.secret)
    assert through.status_code == 200, through.text
    mine = through.json()
    assert mine["content"] and _compared(mine) == _compared(direct)

    # No model, as SillyTavern asks: the default rig's one model, where there is a default rig.
    unnamed = _post(web_url, "/completions", {**body, "stream": True}, key.secret)
    assert unnamed.status_code == 400 and '"model" is required' in unnamed.json()["error"]["message"]
    rig.is_default = True
    rig.save(update_fields=["is_default"])
    streamed = _events(web_url, "/completions", {**body, "stream": True}, key.secret)
    events = [json.loads(data) for data in streamed]
    assert "[DONE]" not in streamed and all(event["stop"] is False for event in events[:-1])
    assert "".join(event["content"] for event in events) == direct["content"]
    assert events[-1]["stop"] is True and events[-1]["content"] == ""
    assert _compared({**events[-1], "content": direct["content"]}) == _compared(direct)

    turns = list(Turn.objects.filter(session__api_key=key.key).order_by("pk"))
    assert [t.status for t in turns] == [Turn.Status.DONE, Turn.Status.DONE]
    assert turns[0].params["native"] == "completion" and turns[0].user_text == PROMPT
    assert turns[0].params["client"]["key"] == "sillytavern" and turns[0].reply_text == direct["content"]
    assert apikeys.api_key_usage([key.key])[key.key.pk].turns == 2


def test_response_fields_are_applied_to_rigdashs_answer_as_llama_server_applies_them(
    web_url, celery_worker, rig, llama_url, model_name, owner
):
    """llama.vim asks for a few fields by path; the server's stream would lose the ones RigDash reads, so RigDash
    asks for all and gives the client what it named."""
    key = apikeys.api_key_create(owner=owner, name="vim")
    fields = ["content", "timings/predicted_n", "timings/prompt_n", "tokens_cached", "truncated", "no/such"]
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "cache_prompt": False, "response_fields": fields}
    _fresh(llama_url)
    direct = _post(llama_url, "/completion", body).json()
    _fresh(llama_url)
    mine = _post(web_url, "/completion", {**body, "model": model_name}, key.secret).json()
    assert mine == direct and set(mine) == set(fields) - {"no/such"}


def test_n_predict_zero_reads_the_prompt_into_the_cache_and_nothing_more(
    web_url, celery_worker, rig, llama_url, model_name, owner
):
    key = apikeys.api_key_create(owner=owner, name="warm-up")
    body = {"prompt": PROMPT + " Paris. The capital of Italy is", "n_predict": 0, "cache_prompt": True,
            "temperature": 0, "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "model": model_name}  # fmt: skip
    _fresh(llama_url)
    direct = _post(llama_url, "/completion", body).json()
    _fresh(llama_url)
    mine = _post(web_url, "/completion", body, key.secret).json()
    assert _compared(mine) == _compared(direct) and mine["tokens_predicted"] == direct["tokens_predicted"] <= 1
    assert mine["tokens_cached"] >= mine["tokens_evaluated"] > 5  # the prompt is in the server's cache now
    # As llama.vim asks it: no field it names exists (the path ""), so the answer is an empty object, as the server's.
    quiet = {**body, "response_fields": [""]}
    direct_quiet = _post(llama_url, "/completion", quiet).json()
    assert _post(web_url, "/completion", quiet, key.secret).json() == direct_quiet == {}


def test_infill_as_llama_vscode_asks_it_equals_llama_servers_own(web_url, celery_worker, fim_url, owner):
    rig = Rig.objects.create(name="fim-rig", kind=Rig.Kind.LLAMACPP, base_url=fim_url, queue=TEST_QUEUE_2)
    key = apikeys.api_key_create(owner=owner, name="vscode")
    body = {
        "input_prefix": "def add(a, b):\n    ",
        "input_suffix": "\n\nprint(add(1, 2))\n",
        "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
        "prompt": "ret",
        "n_predict": 8,
        "temperature": 0,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        "id_slot": 0,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1000,
        "model": "tiny-fim",
    }
    _fresh(fim_url)
    direct = _post(fim_url, "/infill", body).json()
    _fresh(fim_url)
    whole = _post(web_url, "/infill", body, key.secret)
    assert whole.status_code == 200, whole.text
    assert _compared(whole.json()) == _compared(direct) and direct["tokens_evaluated"] > 20  # the extra file counted
    _fresh(fim_url)
    events = [json.loads(data) for data in _events(web_url, "/infill", {**body, "stream": True}, key.secret)]
    assert "".join(event["content"] for event in events) == direct["content"] and events[-1]["stop"] is True

    turn = Turn.objects.filter(session__api_key=key.key).order_by("pk").first()
    assert turn is not None and turn.rig_id == rig.pk and turn.params["native"] == "infill"
    assert turn.user_text == "def add(a, b):\n    ret\n\nprint(add(1, 2))\n"
    assert turn.params["passthrough"]["input_extra"] == body["input_extra"]
    assert "id_slot" not in turn.params["passthrough"]  # the slot is the fair queue's to place


def test_a_pinned_slot_is_left_out_of_what_goes_to_the_server():
    """``id_slot`` would make a request wait in that slot behind another user's reply, outside the fair queue: it is
    dropped from every API's body (llama-server then picks the free slot whose cache holds most of the prompt)."""
    from inference.views.llamacpp_native import _parsed
    from inference.views.openai_request import chat_request_parse, completion_request_parse

    native = _parsed({"prompt": "x", "id_slot": 1, "cache_prompt": True}, "completion", "m")
    assert native.params["passthrough"] == {"cache_prompt": True}
    chat = chat_request_parse(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                          "id_slot": 0, "top_k": 3}).encode())  # fmt: skip
    assert chat.params["passthrough"] == {"top_k": 3}
    completion = completion_request_parse(b'{"model": "m", "prompt": "x", "id_slot": 0}')
    assert "passthrough" not in completion.params


def test_the_request_sent_keeps_the_fields_the_stream_is_read_by():
    """The client's ``response_fields`` would strip the server's events of ``stop`` and the timings; its ``stream``
    and cap are RigDash's. ``n_predict`` 0 (a warm-up) goes as 0; any other is the turn's cap or less."""
    from inference.backends.base import ChatRequest
    from inference.backends.llamacpp.chat import _native

    def sent(extra: dict[str, Any], native: str = "completion") -> dict[str, Any]:
        return _native(ChatRequest(model="m", messages=[], max_tokens=4, extra=extra, prompt="x", native=native))

    mine = {"model": "m", "stream": True, "timings_per_token": True, "n_predict": 4}
    assert sent({"response_fields": ["content"], "stream": False, "cache_prompt": True}) == {
        **mine, "cache_prompt": True, "prompt": "x"}  # fmt: skip
    assert sent({"n_predict": 0})["n_predict"] == 0 and sent({"n_predict": 99})["n_predict"] == 4
    infill = {"input_prefix": "a", "input_suffix": "b", "prompt": "c"}
    assert sent(infill, "infill") == {**mine, **infill}  # the infill's own prompt, not the turn's text


def test_infill_on_a_model_without_fim_tokens_is_the_servers_501_in_its_shape(
    web_url, celery_worker, rig, model_name, owner
):
    key = apikeys.api_key_create(owner=owner, name="vscode")
    body = {"input_prefix": "def f():\n", "input_suffix": "\n", "n_predict": 4, "model": model_name}
    direct = _post(rig.base_url, "/infill", body)
    mine = _post(web_url, "/infill", body, key.secret)
    assert mine.status_code == direct.status_code == 501
    assert mine.json()["error"]["message"] == direct.json()["error"]["message"]
    assert mine.json()["error"]["code"] == 501 and mine.json()["error"]["type"] == "not_supported_error"


def test_tokenize_and_detokenize_are_the_servers_own_answers(web_url, rig, llama_url, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="counter")
    for path, body in (
        ("/tokenize", {"content": "Hello, lighthouse keeper!"}),
        ("/tokenize", {"content": "Hello, world", "add_special": True, "with_pieces": True}),
        ("/detokenize", {"tokens": [19556, 28, 905]}),
    ):
        direct = _post(llama_url, path, body).json()
        mine = _post(web_url, path, {**body, "model": model_name}, key.secret)
        assert mine.status_code == 200 and mine.json() == direct, (path, mine.text)
    # Not turns: nothing queued, nothing on the board; counted as requests in the minute's rate limit.
    assert not Turn.objects.filter(session__api_key=key.key).exists()
    Quota.objects.create(user=owner, key_requests_per_minute=2)
    asked = [_post(web_url, "/tokenize", {"content": "hi", "model": model_name}, key.secret) for _ in range(3)]
    assert [answer.status_code for answer in asked] == [200, 200, 429]
    assert 1 <= int(asked[2].headers["Retry-After"]) <= 60 and asked[2].json()["error"]["code"] == 429


@pytest.fixture
def openai_rig(db: Any) -> Iterator[Rig]:
    """An OpenAI-compatible rig: RigDash refuses the request before asking its server anything."""
    with vllm_like_rig("vllm-rig", "rig.native-vllm") as rig:
        yield rig


def test_bad_requests_get_llama_servers_error_shape_and_store_nothing(web_url, rig, model_name, openai_rig, owner):
    key = apikeys.api_key_create(owner=owner, name="bad").secret
    cases = [
        ("/completion", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
        ("/completion", {"prompt": "hi", "n_predict": -5}, 400, "n_predict"),
        ("/completion", {"prompt": "hi", "n_predict": 10**9}, 400, "n_predict"),
        ("/completion", {"prompt": [1, 2, 3]}, 400, "prompt"),
        ("/completion", {"prompt": ""}, 400, "prompt"),
        ("/completion", {"prompt": "hi", "response_fields": "content"}, 400, "response_fields"),
        ("/infill", {"input_suffix": "x"}, 400, "input_prefix"),
        ("/infill", {"input_prefix": "x", "input_suffix": 3}, 400, "input_suffix"),
        ("/completion", {"prompt": "hi", "model": "vllm-model"}, 501, "llama-server"),
        ("/completion", {"prompt": "hi", "model": "no-such"}, 404, "no-such"),
        ("/tokenize", {"content": "hi", "model": "no-such"}, 404, "no-such"),
        ("/tokenize", {"content": "hi", "model": "vllm-model"}, 501, "/tokenize"),
        ("/completion", {"prompt": "hi"}, 400, '"model" is required'),  # two rigs, neither the default
    ]
    for path, body, status, words in cases:
        if status not in (404, 501) and "model" not in body and words != '"model" is required':
            body = {**body, "model": model_name}
        answer = _post(web_url, path, body, key)
        error = answer.json()["error"]
        assert (answer.status_code, error["code"]) == (status, status), (path, body, answer.text)
        assert words in error["message"] and isinstance(error["type"], str), (path, body, answer.text)
    unauthorised = _post(web_url, "/completion", {"prompt": "hi"}, "rd-not-a-key")
    assert unauthorised.status_code == 401 and unauthorised.json()["error"]["type"] == "authentication_error"
    assert _post(web_url, "/tokenize", {"content": "hi"}).status_code == 401
    assert httpx.get(f"{web_url}/completion", headers={"Authorization": f"Bearer {key}"}).status_code == 405
    assert not Turn.objects.exists()


def test_an_infills_files_for_context_count_in_the_context_quota_at_submit(web_url, rig, model_name, owner):
    """``input_extra`` is part of the prompt the server reads (before the prefix): a quota's context limit refuses it
    at submit, as a chat's history and tools, rather than after the server has read it."""
    Quota.objects.create(user=owner, max_context_tokens=300)
    key = apikeys.api_key_create(owner=owner, name="vscode").secret
    body = {"input_prefix": "def f():\n", "input_suffix": "\n", "model": model_name}
    refused = _post(web_url, "/infill", {**body, "input_extra": [{"filename": "a.py", "text": "word " * 400}]}, key)
    assert refused.status_code == 429 and "context" in refused.json()["error"]["message"], refused.text
    assert refused.json()["error"]["code"] == 429 and not Turn.objects.exists()


@pytest.mark.parametrize(
    ("path", "body"),
    [("/completion", {"n_predict": 700, "stream": True}), ("/v1/completions", {"max_tokens": 700, "stream": True})],
)
def test_a_client_that_leaves_a_completions_stream_cancels_its_turn(
    web_url, celery_worker, rig, model_name, llama_url, owner, path, body
):
    """The raw completion streams (llama-server's own and OpenAI's) end their turn when the client goes away: the
    server stops decoding and the slot frees."""
    key = apikeys.api_key_create(owner=owner, name="editor").secret
    asked = {**body, "model": model_name, "prompt": "Once upon a time, in a lighthouse", "temperature": 0.8}
    with httpx.stream("POST", f"{web_url}{path}", json=asked, headers={"Authorization": f"Bearer {key}"},
                      timeout=120) as response:  # fmt: skip
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events >= 5:
                break
    wait_until(lambda: Turn.objects.get().status == Turn.Status.CANCELLED, timeout_s=30, what="the turn cancelled")
    wait_until(lambda: llama_busy_slots(llama_url) == 0, timeout_s=30, what="llama-server to free the slot")
