"""The gateway (``/v1/`` and Ollama's ``/api/``) in front of llama-server as people start it: default flags (only
``-m``: no ``--metrics``, ``/slots`` on, ``-np`` auto, no ``--embeddings``), ``-np 1`` (one slot: a second request
waits in RigDash's fair queue), ``-np 1 --embeddings`` (a chat and an embeddings request share the one slot), router
mode (``--models-dir``, no ``-m``: the request's ``model`` picks the instance, loaded on demand;
tools/server/server-models.cpp ``proxy_post``) and a router that loads only what it is told to
(``--no-models-autoload``).

Each request goes through RigDash's web server and worker with a real key and is a turn of that key; its text equals
what the server answers directly to the same request (temperature 0, a seed). Short replies, one thread: SmolLM2 for
text, a tiny zero-weight GGUF (tests/tiny_gguf.py) as a router's second model."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import ollama as ollama_client
import pytest

from inference.board import apikeys
from inference.live import served
from inference.models import Rig, Turn
from rigdash.launcher import Stack, free_port, wait_http
from tests import tiny_gguf
from tests.conftest import LOG_DIR, TEST_QUEUE

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]
HI = [{"role": "user", "content": "Name a colour."}]
SKY = [{"role": "system", "content": "Reply with a JSON object of one key."},
       {"role": "user", "content": 'What colour is the sky? Reply as JSON: {"colour": ...}'}]  # fmt: skip
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather", "parameters": WEATHER}}]
GREEDY = {"temperature": 0, "seed": 7}
TINY_TRAINED = 1024  # the tiny model's trained context
SMOL_TRAINED = 8192  # SmolLM2's


class Server:
    """One llama-server started as people start it: its URL, its log and the model ids its ``/v1/models`` lists.
    ``binary``: another build than the embedded one (tests/test_llama_server_versions.py); ``own``: the flags this
    module adds to every server's."""

    def __init__(
        self, stack: Stack, name: str, *args: str, binary: str | None = None, own: tuple[str, ...] = ("--no-webui",)
    ) -> None:
        port = free_port()
        command = [binary or os.environ["LLAMA_SERVER_BIN"], "--host", "127.0.0.1", "--port", str(port), "-t", "1",
                   "-tb", "1", *own, *args]  # fmt: skip
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log = LOG_DIR / f"gateway-matrix-{name}.log"  # appended to: a run's lines follow the last run's
        proc = stack.start(f"llama-server-{name}", command, log_path=self.log)
        self.url = f"http://127.0.0.1:{port}"
        wait_http(f"{self.url}/health", timeout_s=120, proc=proc)
        self.models = [m["id"] for m in httpx.get(f"{self.url}/v1/models").json()["data"]]

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=120)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    models = tmp_path_factory.mktemp("router-models")
    (models / "smol.gguf").symlink_to(os.environ["LLAMA_MODEL_PATH"])
    meta, tensors = tiny_gguf.llama_gqa(layers=2, kv_heads=1)
    # Trained on less than the router's -c: its slots get its trained context (tools/server n_ctx_slot).
    tiny_gguf.write_gguf(models / "tiny.gguf", {**meta, "llama.context_length": TINY_TRAINED}, tensors)
    stack = Stack()
    smol = os.environ["LLAMA_MODEL_PATH"]
    try:
        yield {
            "defaults": Server(stack, "defaults", "-m", smol),
            "np1": Server(stack, "np1", "-m", smol, "-np", "1", "-c", "2048"),
            # A chat model's GGUF names no pooling: without --pooling, b11434 refuses /v1/embeddings with 400 "Pooling
            # type 'none' is not OAI compatible. Please use a different pooling type".
            "np1-embeddings": Server(
                stack, "np1-embeddings", "-m", smol, "-np", "1", "-c", "2048", "--embeddings", "--pooling", "mean"
            ),
            "router": Server(stack, "router", "--models-dir", str(models), "-c", "2048"),
            "router-manual": Server(stack, "router-manual", "--models-dir", str(models), "--no-models-autoload"),
        }
    finally:
        stack.stop()


class Gateway:
    """RigDash's web server with one key; every request it sends is counted, to match the key's turns."""

    def __init__(self, web_url: str, owner: Any, name: str) -> None:
        self.key = apikeys.api_key_create(owner=owner, name=name)
        self.http = httpx.Client(base_url=web_url, headers={"Authorization": f"Bearer {self.key.secret}"}, timeout=120)
        self.sent = 0

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        self.sent += 1
        return self.http.post(path, json=body)

    def stream(self, path: str, body: dict[str, Any]) -> list[Any]:
        """The events of a streamed answer: SSE ``data:`` objects (``[DONE]`` kept as a string) or NDJSON lines."""
        self.sent += 1
        with self.http.stream("POST", path, json=body) as response:
            assert response.status_code == 200, response.read()
            lines = [line for line in response.iter_lines() if line.strip()]
        if path.startswith("/api/"):
            return [json.loads(line) for line in lines]
        data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        return [d if d == "[DONE]" else json.loads(d) for d in data]

    def turns(self) -> list[Turn]:
        return list(Turn.objects.filter(session__api_key=self.key.key).order_by("pk"))


def _text(answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def _streamed(events: list[Any]) -> str:
    assert events[-1] == "[DONE]", events[-3:]
    pieces = [e["choices"][0] for e in events[:-1] if isinstance(e, dict) and e.get("choices")]
    return "".join(p["delta"].get("content") or "" if "delta" in p else p.get("text") or "" for p in pieces)


def _same_answers(server: Server, gateway: Gateway, path: str, body: dict[str, Any]) -> str:
    """The server's direct answer to ``body`` and RigDash's, whole and streamed, hold the same text; returns it."""
    direct = server.post(path, body)
    assert direct.status_code == 200, direct.text
    expected = _text(direct.json())
    whole = gateway.post(path, body)
    assert whole.status_code == 200, whole.text
    assert _text(whole.json()) == expected
    events = gateway.stream(path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert _streamed(events) == expected
    assert events[-2]["usage"]["completion_tokens"] == gateway.turns()[-1].output_tokens > 0
    return expected


def _openai_error(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and {"message", "type", "param", "code"} <= set(error), error


def _rig(name: str, server: Server, slots: int = 4) -> Rig:
    return Rig.objects.create(name=name, kind=Rig.Kind.LLAMACPP, base_url=server.url, queue=TEST_QUEUE, slots=slots)


def _all_turns_of_the_key(gateway: Gateway, rig: Rig, done: int) -> list[Turn]:
    turns = gateway.turns()
    assert len(turns) == gateway.sent, [(t.user_text, t.status) for t in turns]
    assert {t.rig_id for t in turns} == {rig.pk}
    assert sum(t.status == Turn.Status.DONE for t in turns) == done, [(t.status, t.error) for t in turns]
    return turns


def _embeddings_refused(gateway: Gateway, model: str) -> None:
    """llama-server without ``--embeddings`` refuses with 501 and says how to start it: the client gets both, in
    OpenAI's shape on ``/v1/`` and Ollama's on ``/api/``."""
    _openai_error(gateway.post("/v1/embeddings", {"model": model, "input": "hi"}), 501, "--embeddings")
    ollama = gateway.post("/api/embed", {"model": model, "input": ["hi"]})
    assert ollama.status_code == 501 and "--embeddings" in ollama.json()["error"], ollama.text


def test_default_flags_server_serves_every_gateway_path(servers, web_url, celery_worker, owner) -> None:
    server = servers["defaults"]
    rig = _rig("defaults", server)
    gateway = Gateway(web_url, owner, "matrix")
    (model,) = server.models
    listed = gateway.http.get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [model] and listed[0]["owned_by"] == "defaults"
    detail = gateway.http.get(f"/v1/models/{model}")  # without --alias, the model's id is its file's path
    assert detail.status_code == 200 and detail.json()["id"] == model, detail.text

    chat = {"model": model, "messages": HI, "max_tokens": 8, **GREEDY}
    assert _same_answers(server, gateway, "/v1/chat/completions", chat)
    assert "referring" not in _same_answers(server, gateway, "/v1/chat/completions", {**chat, "stop": ["referring"]})
    _same_answers(server, gateway, "/v1/chat/completions",
                  {**chat, "messages": SKY, "max_tokens": 16, "response_format": {"type": "json_object"}})  # fmt: skip
    _same_answers(server, gateway, "/v1/chat/completions", {**chat, "tools": TOOLS, "tool_choice": "auto"})
    _same_answers(server, gateway, "/v1/completions", {"model": model, "prompt": "def add(a, b):\n", "max_tokens": 8,
                                                       **GREEDY})  # fmt: skip
    suffix = gateway.post("/v1/completions", {"model": model, "prompt": "def f(", "suffix": ")", "max_tokens": 4})
    _openai_error(suffix, 501, "Infill is not supported")  # SmolLM2 has no fill-in-the-middle tokens
    _embeddings_refused(gateway, model)

    # Ollama's API: the same greedy request gives the same text.
    direct = _text(server.post("/v1/chat/completions", chat).json())
    options = {"num_predict": 8, **GREEDY}
    ollama = gateway.post("/api/chat", {"model": model, "messages": HI, "options": options, "stream": False})
    assert ollama.status_code == 200 and ollama.json()["message"]["content"] == direct, ollama.text
    lines = gateway.stream("/api/chat", {"model": model, "messages": HI, "options": options})
    assert "".join(line["message"]["content"] for line in lines) == direct and lines[-1]["done"]
    raw = _text(server.post("/v1/completions", {"model": model, "prompt": "def add(a, b):\n", "max_tokens": 8,
                                                **GREEDY}).json())  # fmt: skip
    generated = gateway.post("/api/generate", {"model": model, "prompt": "def add(a, b):\n", "raw": True,
                                               "options": options, "stream": False})  # fmt: skip
    assert generated.status_code == 200 and generated.json()["response"] == raw, generated.text
    assert [m["name"] for m in gateway.http.get("/api/tags").json()["models"]] == [model]
    assert [m["name"] for m in gateway.http.get("/api/ps").json()["models"]] == [model]
    shown = gateway.http.post("/api/show", json={"model": model})
    assert shown.status_code == 200 and shown.json()["model_info"]["general.context_length"] > 0, shown.text
    _all_turns_of_the_key(gateway, rig, done=gateway.sent - 3)  # the suffix and two embeddings were refused


def test_one_slot_server_queues_the_second_request_in_the_fair_queue(servers, web_url, celery_worker, owner) -> None:
    server = servers["np1"]
    rig = _rig("np1", server, slots=1)
    gateway = Gateway(web_url, owner, "matrix")
    (model,) = server.models
    bodies = [{"model": model, "messages": [{"role": "user", "content": "Write a story about a cat."}],
               "max_tokens": 60, **GREEDY}, {"model": model, "messages": HI, "max_tokens": 6, **GREEDY}]  # fmt: skip
    expected = [_text(server.post("/v1/chat/completions", body).json()) for body in bodies]
    answers: dict[int, httpx.Response] = {}

    def send(index: int) -> None:
        answers[index] = gateway.post("/v1/chat/completions", bodies[index])

    first = threading.Thread(target=send, args=(0,))
    first.start()
    _wait(lambda: Turn.objects.filter(status__in=Turn.RUNNING).exists(), "the first request running")
    second = threading.Thread(target=send, args=(1,))
    second.start()
    first.join(120)
    second.join(120)
    assert [_text(answers[i].json()) for i in (0, 1)] == expected
    one, two = _all_turns_of_the_key(gateway, rig, done=2)
    assert one.finished_at is not None and two.dispatched_at is not None
    assert two.created_at < one.finished_at <= two.dispatched_at  # sent while the first ran, held until it ended
    _embeddings_refused(gateway, model)


def test_router_mode_routes_by_model_and_lists_the_routers_models(servers, web_url, celery_worker, owner) -> None:
    server = servers["router"]
    rig = _rig("router", server)
    gateway = Gateway(web_url, owner, "matrix")
    assert sorted(server.models) == ["smol", "tiny"]
    listed = gateway.http.get("/v1/models").json()["data"]
    assert sorted(m["id"] for m in listed) == ["smol", "tiny"] and {m["owned_by"] for m in listed} == {"router"}
    assert sorted(m["name"] for m in gateway.http.get("/api/tags").json()["models"]) == ["smol", "tiny"]
    assert _running(gateway) == []  # Ollama's /api/ps: the models held in memory, none before a request
    # Before a load the router lists no meta: the context is what its -c gives a slot, capped by the file's training.
    assert _listed(gateway) == {"smol": (2048, "router_args", False), "tiny": (TINY_TRAINED, "router_args", False)}
    shown = gateway.http.post("/api/show", json={"model": "tiny"}).json()
    assert shown["model_info"]["general.context_length"] == TINY_TRAINED, shown
    assert shown["context_length_source"] == "router_args", shown

    for model in ("smol", "tiny"):  # each loaded on demand by the request naming it
        chat = {"model": model, "messages": HI, "max_tokens": 6, **GREEDY}
        _same_answers(server, gateway, "/v1/chat/completions", chat)
        _same_answers(server, gateway, "/v1/completions", {"model": model, "prompt": "Once upon", "max_tokens": 6,
                                                           **GREEDY})  # fmt: skip
        ollama = gateway.post("/api/chat", {"model": model, "messages": HI, "stream": False,
                                            "options": {"num_predict": 6, **GREEDY}})  # fmt: skip
        assert ollama.status_code == 200, ollama.text
        assert ollama.json()["message"]["content"] == _text(server.post("/v1/chat/completions", chat).json())
        assert _running(gateway) == (["smol"] if model == "smol" else ["smol", "tiny"])
    smol = _text(server.post("/v1/chat/completions", {"model": "smol", "messages": HI, "max_tokens": 6,
                                                      **GREEDY}).json())  # fmt: skip
    tiny = _text(server.post("/v1/chat/completions", {"model": "tiny", "messages": HI, "max_tokens": 6,
                                                      **GREEDY}).json())  # fmt: skip
    assert smol != tiny  # the two models answer differently: the text tells which one the router ran
    served.served_forget(rig.pk)  # as the sampler's next refresh of the kept list: loaded, each says its own n_ctx
    assert _listed(gateway) == {"smol": (2048, "server", True), "tiny": (TINY_TRAINED, "server", True)}
    assert {m["id"]: m["meta"]["n_ctx"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]} == {
        "smol": 2048, "tiny": TINY_TRAINED}  # fmt: skip
    suffix = gateway.post("/v1/completions", {"model": "smol", "prompt": "def f(", "suffix": ")", "max_tokens": 4})
    _openai_error(suffix, 501, "Infill is not supported")  # /infill, routed by the body's model
    _embeddings_refused(gateway, "smol")
    turns = _all_turns_of_the_key(gateway, rig, done=gateway.sent - 3)
    assert {t.session.model_name for t in turns} == {"smol", "tiny"}


def test_router_without_autoload_refuses_an_unloaded_model_by_name(servers, web_url, celery_worker, owner) -> None:
    """``--no-models-autoload``: the router answers a request for a model it has not loaded with 400 "model is not
    loaded" (server-models.cpp ``router_validate_model``), words that do not say why. RigDash's client gets 400
    ``model_not_loaded`` saying what to do, in OpenAI's shape and Ollama's, streamed or not, chat or embeddings, and
    the model lists say which models are loaded. Started without ``-c``, an unloaded model's context is its file's
    trained context (read on this host), which the server then takes."""
    server = servers["router-manual"]
    direct = server.post("/v1/chat/completions", {"model": "smol", "messages": HI, "max_tokens": 4})
    assert direct.status_code == 400 and direct.json()["error"]["message"] == "model is not loaded", direct.text
    rig = _rig("manual", server)
    gateway = Gateway(web_url, owner, "matrix")
    assert _listed(gateway) == {"smol": (SMOL_TRAINED, "model_file", False),
                                "tiny": (TINY_TRAINED, "model_file", False)}  # fmt: skip
    assert server.post("/models/load", {"model": "tiny"}).json() == {"success": True}
    _wait(lambda: _router_status(server)["tiny"] == "loaded", "the router loading tiny")
    served.served_forget(rig.pk)  # as the sampler's next refresh of the kept list
    assert _listed(gateway) == {"smol": (SMOL_TRAINED, "model_file", False), "tiny": (TINY_TRAINED, "server", True)}
    assert _running(gateway) == ["tiny"]
    _same_answers(server, gateway, "/v1/chat/completions", {"model": "tiny", "messages": HI, "max_tokens": 6,
                                                           **GREEDY})  # fmt: skip

    chat = {"model": "smol", "messages": HI, "max_tokens": 6}
    for body in (chat, {**chat, "stream": True}):  # a stream waits for its first piece: the refusal is its status
        refused = gateway.post("/v1/chat/completions", body)
        _openai_error(refused, 400, "not loaded")
        assert refused.json()["error"]["code"] == "model_not_loaded", refused.text
    ollama_chat = {"model": "smol", "messages": HI}
    for path, body in (("/api/chat", {**ollama_chat, "stream": False}), ("/api/chat", ollama_chat),
                       ("/api/embed", {"model": "smol", "input": "hi"})):  # fmt: skip
        ollama = gateway.post(path, body)
        assert ollama.status_code == 400 and "not loaded" in ollama.json()["error"], ollama.text
    embeddings = gateway.post("/v1/embeddings", {"model": "smol", "input": "hi"})  # refused before any instance
    _openai_error(embeddings, 400, "not loaded")
    assert embeddings.json()["error"]["code"] == "model_not_loaded", embeddings.text
    # Anthropic's token count: the loaded model's by its instance, as the router's own; the unloaded one refused.
    count = {"model": "tiny", "messages": [{"role": "user", "content": "Name a colour."}], "system": "Be brief."}
    counted = gateway.http.post("/v1/messages/count_tokens", json=count)
    assert counted.status_code == 200, counted.text
    assert counted.json() == server.post("/v1/messages/count_tokens", count).json() and counted.json()["input_tokens"]
    refused = gateway.http.post("/v1/messages/count_tokens", json={**count, "model": "smol"})
    assert refused.status_code == 409 and "not loaded on rig manual" in refused.json()["error"]["message"], refused.text
    # llama-server's own API through the router: /completion by the loaded model's instance, as the router's own;
    # /tokenize of the unloaded one refused (it would load it), the loaded one's the server's own.
    native = {"model": "tiny", "prompt": "Once", "n_predict": 4, **GREEDY}
    own, mine = server.post("/completion", native).json(), gateway.post("/completion", native).json()
    assert (mine["content"], mine["tokens_predicted"]) == (own["content"], own["tokens_predicted"]), mine
    tokenized = gateway.http.post("/tokenize", json={"model": "tiny", "content": "Once"})
    assert tokenized.json() == server.post("/tokenize", {"model": "tiny", "content": "Once"}).json()
    refused = gateway.http.post("/tokenize", json={"model": "smol", "content": "Once"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == 409, refused.text
    assert _running(gateway) == ["tiny"] and _router_status(server)["smol"] == "unloaded"  # nothing was loaded
    turns = _all_turns_of_the_key(gateway, rig, done=3)
    assert {t.finish_reason for t in turns if t.status == Turn.Status.FAILED} == {"model_not_loaded"}


def test_one_slot_embeddings_server_serves_a_chat_and_embeddings_in_turn(servers, web_url, celery_worker,
                                                                          owner) -> None:  # fmt: skip
    """``-np 1 --embeddings``: one slot for chats and embeddings. Through RigDash the embeddings request sent while a
    chat runs waits in the fair queue until the chat ends, then gets the vectors the server gives directly; nothing
    hangs, on ``/v1/`` or Ollama's ``/api/embed``."""
    server = servers["np1-embeddings"]
    rig = _rig("np1-embeddings", server, slots=1)
    gateway = Gateway(web_url, owner, "matrix")
    (model,) = server.models
    story = {"model": model, "messages": [{"role": "user", "content": "Write a story about a cat."}],
             "max_tokens": 60, **GREEDY}  # fmt: skip
    inputs = {"model": model, "input": ["a cat", "a dog"]}
    expected_text = _text(server.post("/v1/chat/completions", story).json())
    expected = [item["embedding"] for item in server.post("/v1/embeddings", inputs).json()["data"]]
    answers: dict[str, httpx.Response] = {}

    def send(name: str, path: str, body: dict[str, Any]) -> None:
        answers[name] = gateway.post(path, body)

    chat = threading.Thread(target=send, args=("chat", "/v1/chat/completions", story))
    chat.start()
    _wait(lambda: Turn.objects.filter(status__in=Turn.RUNNING).exists(), "the chat running")
    embed = threading.Thread(target=send, args=("embeddings", "/v1/embeddings", inputs))
    embed.start()
    for thread in (chat, embed):
        thread.join(120)
        assert not thread.is_alive(), "a request hung"
    assert answers["chat"].status_code == 200 and _text(answers["chat"].json()) == expected_text, answers["chat"].text
    assert answers["embeddings"].status_code == 200, answers["embeddings"].text
    vectors = [item["embedding"] for item in answers["embeddings"].json()["data"]]
    assert len(vectors) == 2 and all(v == pytest.approx(e, abs=1e-5) for v, e in zip(vectors, expected, strict=True))
    one, two = _all_turns_of_the_key(gateway, rig, done=2)
    assert one.finished_at is not None and two.dispatched_at is not None
    assert two.created_at < one.finished_at <= two.dispatched_at  # sent while the chat ran, held until it ended
    assert two.prompt_tokens and not two.output_tokens
    ollama = gateway.post("/api/embed", {"model": model, "input": ["a cat"]})
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["embeddings"][0] == pytest.approx(expected[0], abs=1e-5)
    # Ollama's older /api/embeddings, as the official ollama client's embeddings() asks it.
    bearer = {"Authorization": f"Bearer {gateway.key.secret}"}
    client = ollama_client.Client(host=str(gateway.http.base_url), headers=bearer)
    assert client.embeddings(model=model, prompt="a cat")["embedding"] == pytest.approx(expected[0], abs=1e-5)
    assert client.embeddings(model=model, prompt="")["embedding"] == []  # no vector, no turn
    missing = gateway.http.post("/api/embeddings", json={"prompt": "a cat"})
    assert missing.status_code == 400 and missing.json() == {"error": "model is required"}
    assert len(gateway.turns()) == 4  # the chat, the two embeddings before, and the older endpoint's one


def _listed(gateway: Gateway) -> dict[str, tuple[int | None, str | None, bool]]:
    """Each model of ``/v1/models``: its context, that figure's source, and whether it is loaded."""
    listed = gateway.http.get("/v1/models").json()["data"]
    return {m["id"]: (m["context_length"], m["context_length_source"], m["loaded"]) for m in listed}


def _router_status(server: Server) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]}


def _running(gateway: Gateway) -> list[str]:
    return sorted(m["name"] for m in gateway.http.get("/api/ps").json()["models"])


def _wait(predicate: Callable[[], bool], what: str) -> None:
    from tests.conftest import wait_until

    wait_until(predicate, timeout_s=60, what=what)
