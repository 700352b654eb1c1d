"""The Ollama plug-in's own behaviour, beyond the conformance suite.

No Ollama binary can run here: these run against tests/ollama_replay.py, a protocol replay of Ollama's
API (its documented NDJSON wire format and error answers), not against Ollama itself.
"""

from __future__ import annotations

import asyncio

import pytest

from inference.backends import backend_for, backend_supports
from inference.backends.base import (
    BackendError,
    BackendNotSupported,
    BackendUnavailable,
    ChatRequest,
    ModelNotFound,
)
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.ollama import OllamaBackend
from inference.backends.ollama.chat import stats_from_final
from inference.models import Rig
from tests.ollama_replay import API_VERSION, WORDS, ollama_fixture  # noqa: F401  (the ``ollama`` fixture)

MODEL = "smollm2:135m"


def _chat(backend: OllamaBackend, **fields):
    fields = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, **fields}
    request = ChatRequest(**fields)

    async def collect():
        chunks = []
        try:
            async for chunk in backend.stream_chat(request):
                chunks.append(chunk)
        except BackendError as exc:
            return chunks, exc
        return chunks, None

    return asyncio.run(collect())


def test_final_line_durations_are_converted_from_nanoseconds():
    # The final line of docs/api.md's generate example.
    final = {"total_duration": 10706818083, "load_duration": 6338219291, "prompt_eval_count": 26,
             "prompt_eval_duration": 130079000, "eval_count": 259, "eval_duration": 4232710000,
             "done_reason": "stop"}  # fmt: skip
    stats = stats_from_final(final)
    assert stats.prompt_tokens == 26 and stats.prompt_ms == 130.079
    assert stats.output_tokens == 259 and stats.decode_ms == 4232.71
    assert stats.decode_tps == round(259 / 4232710000 * 1e9, 2) == 61.19
    assert stats.raw == final  # kept as Ollama sent them


def test_health_reports_ollamas_version(ollama):
    health = asyncio.run(OllamaBackend(ollama.url).health())
    assert health.ok and health.version == API_VERSION


def test_chat_sends_options_and_keep_alive_and_reads_ollamas_counters(ollama):
    chunks, error = _chat(
        OllamaBackend(ollama.url), max_tokens=5, temperature=0.3, top_p=0.9, seed=7, num_ctx=2048, keep_alive="10m"
    )
    assert error is None
    sent = ollama.last_request("/api/chat")
    assert sent["stream"] is True and sent["keep_alive"] == "10m"
    assert sent["options"] == {"num_predict": 5, "temperature": 0.3, "top_p": 0.9, "seed": 7, "num_ctx": 2048}
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    final = chunks[-1]
    assert final.finish_reason == "length"  # num_predict reached
    assert "".join(c.text for c in chunks) == " ".join(WORDS[:5])
    raw = final.stats.raw
    assert raw["eval_count"] == 5 == final.stats.output_tokens
    assert final.stats.decode_ms == round(raw["eval_duration"] / 1e6, 3)
    assert final.stats.prompt_ms == round(raw["prompt_eval_duration"] / 1e6, 3)
    assert set(raw) == {"prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration",
                        "load_duration", "total_duration", "done_reason"}  # fmt: skip


def test_unset_options_are_not_sent(ollama):
    _chat(OllamaBackend(ollama.url), max_tokens=3)
    sent = ollama.last_request("/api/chat")
    assert sent["options"] == {"num_predict": 3} and "keep_alive" not in sent


def test_stream_cut_mid_reply_is_retryable_after_the_text_so_far(ollama):
    ollama.cut_after_tokens = 4
    chunks, error = _chat(OllamaBackend(ollama.url))
    assert isinstance(error, BackendUnavailable) and error.retryable
    assert "".join(c.text for c in chunks) == " ".join(WORDS[:4])
    assert all(c.finish_reason is None for c in chunks)


def test_stream_that_ends_without_done_is_unavailable(ollama):
    ollama.omit_done_line = True
    chunks, error = _chat(OllamaBackend(ollama.url))
    assert isinstance(error, BackendUnavailable) and "done:true" in str(error)
    assert len(chunks) == ollama.reply_tokens


def test_server_errors_are_retryable(ollama):
    ollama.fail_status = 503
    backend = OllamaBackend(ollama.url)
    with pytest.raises(BackendUnavailable) as listing:
        asyncio.run(backend.list_models())
    assert listing.value.retryable and "server busy" in str(listing.value)
    chunks, error = _chat(backend)
    assert isinstance(error, BackendUnavailable) and not chunks


def test_model_architecture_from_show(ollama):
    arch = asyncio.run(OllamaBackend(ollama.url).model_architecture(MODEL))
    assert (arch.arch, arch.block_count, arch.head_count, arch.head_count_kv) == ("llama", 30, 9, 3)
    assert (arch.embedding_length, arch.context_length, arch.key_length) == (576, 8192, None)
    with pytest.raises(ModelNotFound):
        asyncio.run(OllamaBackend(ollama.url).model_architecture("nope"))


def test_loaded_models_after_a_chat_and_after_unload(ollama):
    backend = OllamaBackend(ollama.url)
    assert asyncio.run(backend.loaded_models()) == []
    _chat(backend, num_ctx=2048)
    [loaded] = asyncio.run(backend.loaded_models())
    assert loaded.name == MODEL and loaded.context_length == 2048
    assert loaded.size_bytes > 0 and loaded.size_vram_bytes == 0 and loaded.expires_at
    asyncio.run(backend.unload_model(MODEL))
    sent = ollama.last_request("/api/generate")  # the documented unload: no prompt, keep_alive 0
    assert sent["model"] == MODEL and sent["keep_alive"] == 0 and not sent.get("prompt")
    assert asyncio.run(backend.loaded_models()) == []


def test_pull_streams_progress_to_success_and_installs_the_model(ollama):
    backend = OllamaBackend(ollama.url)

    async def pull(name):
        return [step async for step in backend.pull_model(name)]

    steps = asyncio.run(pull("tinyllama"))
    assert steps[0].status == "pulling manifest" and steps[-1].done
    downloads = [s for s in steps if s.digest]
    assert downloads and all(s.total and s.status.startswith("pulling ") for s in downloads)
    assert max(s.completed or 0 for s in downloads) == max(s.total for s in downloads)
    assert "tinyllama:latest" in [m.name for m in asyncio.run(backend.list_models())]


def test_pull_of_a_name_the_registry_lacks_is_model_not_found(ollama):
    async def pull():
        return [step async for step in OllamaBackend(ollama.url).pull_model("no-such-model")]

    with pytest.raises(ModelNotFound) as info:
        asyncio.run(pull())
    assert "file does not exist" in str(info.value)


def test_delete_removes_the_model_and_unknown_is_not_found(ollama):
    backend = OllamaBackend(ollama.url)
    asyncio.run(backend.delete_model(MODEL))
    assert asyncio.run(backend.list_models()) == []
    with pytest.raises(ModelNotFound):
        asyncio.run(backend.delete_model(MODEL))


def test_llamacpp_pulls_and_deletes_nothing_and_swaps_models_only_in_router_mode():
    """llama-server has no model store to pull into or delete from; it loads and unloads models only in router mode
    (--models-dir), which it says in /props: a server that cannot be asked is unreachable, not "not supported"
    (tests/test_llama_server_matrix.py runs the router)."""
    backend = LlamaCppBackend("http://127.0.0.1:9")
    with pytest.raises(BackendNotSupported):
        backend.pull_model("m")
    with pytest.raises(BackendNotSupported):
        asyncio.run(backend.delete_model("m"))
    with pytest.raises(BackendUnavailable):
        asyncio.run(backend.unload_model("m"))
    assert not backend_supports("llamacpp", "pull_model") and backend_supports("ollama", "pull_model")
    assert backend_supports("llamacpp", "load_model") and backend_supports("llamacpp", "unload_model")


def test_an_ollama_rig_gets_the_ollama_backend():
    rig = Rig(name="o", kind=Rig.Kind.OLLAMA, base_url="http://127.0.0.1:11434", queue="q")
    assert isinstance(backend_for(rig), OllamaBackend)


def test_a_raw_completion_goes_to_generate_raw_and_streams_its_response_lines(ollama):
    """OpenAI's /v1/completions on an Ollama rig: /api/generate with ``raw`` (the prompt as written, no template),
    thoughts off, the turn's cap and stop sequences as options; the lines' ``response`` is the text."""
    ollama.reply_tokens = 9
    chunks, error = _chat(OllamaBackend(ollama.url), messages=[], prompt="def add(a, b):", max_tokens=64,
                          stop=("\n\n",), temperature=0.0)  # fmt: skip
    assert error is None
    sent = ollama.last_request("/api/generate")
    assert sent["prompt"] == "def add(a, b):" and sent["raw"] is True and sent["think"] is False
    assert "suffix" not in sent and "messages" not in sent
    assert sent["options"]["num_predict"] == 64 and sent["options"]["stop"] == ["\n\n"]
    assert "".join(c.text for c in chunks) == " ".join(WORDS[:9])
    assert chunks[-1].finish_reason == "stop" and chunks[-1].stats.output_tokens == 9


def test_a_completion_with_a_suffix_asks_the_models_fill_in_the_middle(ollama):
    """With ``suffix``: not raw (Ollama fills the middle through the model's template, and raw mode takes no
    suffix); a model whose template cannot is refused with Ollama's status and words."""
    backend = OllamaBackend(ollama.url)
    chunks, error = _chat(backend, messages=[], prompt="def add(a, b):\n    ", extra={"suffix": "\n    return c"})
    assert isinstance(error, BackendError) and not error.retryable and "does not support insert" in str(error)
    assert not chunks
    ollama.models[MODEL].inserts = True
    chunks, error = _chat(backend, messages=[], prompt="def add(a, b):\n    ", extra={"suffix": "\n    return c"})
    assert error is None and chunks[-1].finish_reason
    sent = ollama.last_request("/api/generate")
    assert sent["suffix"] == "\n    return c" and "raw" not in sent
    # An OpenAI field /api/generate has no equivalent of is refused by name, before anything is sent.
    chunks, error = _chat(backend, messages=[], prompt="x", extra={"logit_bias": {"1": 2}})
    assert isinstance(error, BackendNotSupported) and "logit_bias" in str(error)
