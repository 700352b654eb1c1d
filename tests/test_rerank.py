"""Rerank requests through RigDash (inference/views/rerank.py) against the real llama-server started with
``--reranking``, each answer compared with the server's own answer to the same body: Jina's shape (Open WebUI's
external reranker) and TEI's. The reranker is a tiny model written here (tests/tiny_gguf.py ``reranker``): no
reranker GGUF can be fetched, and this one scores each text by its last byte, so the order is the server's to tell.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from inference.board import apikeys
from inference.models import Rig, Turn
from inference.turns.board_rows import board_row_for
from rigdash.launcher import Stack
from tests import tiny_gguf
from tests.conftest import TEST_QUEUE_2, wait_until
from tests.ollama_replay import ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.tinykit import tiny_llama_server, vllm_like_rig, vllm_rerank

pytestmark = [pytest.mark.llama, pytest.mark.django_db(transaction=True)]
QUERY = "Which animal is striped?"
DOCUMENTS = ["a cat", "the dog!", "hello world?", "zebra", "a striped horse."]
MODEL = "smollm2:135m"  # the Ollama replay's


@pytest.fixture(scope="module")
def rerank_url(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """llama-server with ``--reranking`` on the tiny reranker, named ``tiny-rerank``."""
    model = tiny_gguf.write_gguf(tmp_path_factory.mktemp("rerank") / "tiny-rerank.gguf", *tiny_gguf.reranker())
    return tiny_llama_server(stack, model, "tiny-rerank", ctx=2048, extra=("--reranking",))


def _post(url: str, path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=120)


def test_a_rerank_is_a_turn_answered_as_the_server_answers_it(web_url, celery_worker, rerank_url, owner):
    rig = Rig.objects.create(name="rerank-rig", kind=Rig.Kind.LLAMACPP, base_url=rerank_url, queue=TEST_QUEUE_2)
    key = apikeys.api_key_create(owner=owner, name="open-webui")
    jina = {"model": "tiny-rerank", "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    direct = _post(rerank_url, "/v1/rerank", jina).json()
    mine = _post(web_url, "/v1/rerank", jina, key.secret)
    assert mine.status_code == 200, mine.text
    assert mine.json() == direct and len(direct["results"]) == 3
    scores = [result["relevance_score"] for result in direct["results"]]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 3  # the server's order, not ties
    tei = {"model": "tiny-rerank", "query": QUERY, "texts": DOCUMENTS[:2], "return_text": True}
    assert _post(web_url, "/rerank", tei, key.secret).json() == _post(rerank_url, "/rerank", tei).json()

    first, second = Turn.objects.filter(session__api_key=key.key).order_by("pk")
    assert (first.status, first.rig_id, first.stats["reranked"]) == (Turn.Status.DONE, rig.pk, len(DOCUMENTS))
    assert first.prompt_tokens == direct["usage"]["prompt_tokens"] > 0 and first.output_tokens == 0
    assert second.stats["reranked"] == 2  # its texts (and the turn's text) were wiped once answered
    row = board_row_for(first.pk)
    assert row is not None and row["via_api"] and row["status"] == "done", row
    wait_until(lambda: "passthrough" not in Turn.objects.get(pk=first.pk).params, timeout_s=10, what="texts wiped")
    assert first.session.hidden and apikeys.api_key_usage([key.key])[key.key.pk].turns == 2


def test_a_server_without_reranking_refuses_in_its_own_words(web_url, celery_worker, rig, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="open-webui").secret
    body = {"model": model_name, "query": QUERY, "documents": DOCUMENTS}
    direct = _post(rig.base_url, "/v1/rerank", body)
    mine = _post(web_url, "/v1/rerank", body, key)
    assert mine.status_code == direct.status_code == 501
    assert mine.json()["error"]["message"] == direct.json()["error"]["message"] and "--reranking" in mine.text
    (turn,) = Turn.objects.all()
    assert turn.status == Turn.Status.FAILED and turn.stats["backend_refused"]["status"] == 501


def test_an_openai_compatible_rig_reranks_as_vllm_answers(web_url, celery_worker, owner):
    """vLLM's ``/v1/rerank`` (a stand-in: vLLM cannot run here): its answer as it gave it, the model the client's id;
    its usage names only ``total_tokens``, which are the prompt's."""
    key = apikeys.api_key_create(owner=owner, name="open-webui")
    body = {"model": "vllm-model", "query": QUERY, "documents": DOCUMENTS, "top_n": 2}
    with vllm_like_rig("vllm-rig", TEST_QUEUE_2):
        mine = _post(web_url, "/v1/rerank", body, key.secret)
        assert mine.status_code == 200, mine.text
        assert mine.json() == vllm_rerank(body)
    (turn,) = Turn.objects.filter(session__api_key=key.key)
    assert turn.status == Turn.Status.DONE and turn.prompt_tokens == vllm_rerank(body)["usage"]["total_tokens"]


def test_bad_rerank_requests_are_refused_in_llama_servers_shape(web_url, rig, model_name, ollama, owner):
    Rig.objects.create(name="ollama-rig", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue="rig.rerank-ollama")
    key = apikeys.api_key_create(owner=owner, name="bad").secret
    good = {"model": model_name, "query": QUERY, "documents": DOCUMENTS}
    cases = [
        ({**good, "query": None}, 400, '"query"'),
        ({**good, "query": 7}, 400, '"query"'),
        ({**good, "documents": []}, 400, '"documents"'),
        ({**good, "documents": ["a", {"text": "b"}]}, 400, '"documents"'),
        ({**good, "top_n": 0}, 400, '"top_n"'),
        ({**good, "top_n": True}, 400, '"top_n"'),
        ({**good, "model": "no-such"}, 404, "no-such"),
        ({**good, "model": MODEL}, 501, "does not rerank"),  # Ollama has no rerank API: refused, not asked
    ]
    for body, status, words in cases:
        answer = _post(web_url, "/v1/rerank", body, key)
        error = answer.json()["error"]
        assert (answer.status_code, error["code"]) == (status, status) and words in error["message"], answer.text
    assert _post(web_url, "/v1/rerank", good).status_code == 401
    garbled = httpx.post(f"{web_url}/rerank", content=b'{"query": ', headers={"Authorization": f"Bearer {key}"})
    assert garbled.status_code == 400 and garbled.json()["error"]["type"] == "invalid_request_error"
    assert not Turn.objects.exists()
