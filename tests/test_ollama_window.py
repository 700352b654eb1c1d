"""Ollama's context window beyond the gauge: the replay cuts a chat's history to it as Ollama does, the worker marks a
turn whose history was cut (the chat's stats line, the board), the context quota counts no more than the window,
and the chat page sets num_ctx on Ollama rigs only. Ollama runs as the replay (tests/ollama_replay.py); the worker,
Redis and PostgreSQL are real."""

from __future__ import annotations

import json
import subprocess

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse

from inference import errors
from inference.models import ChatPreset, Quota, Rig, Turn
from inference.tokens import history_truncated
from inference.turns import board_rows, sessions, submit
from inference.turns import chats as chat_manage
from rigdash.launcher import ROOT
from tests.adminkit import make_session, quiet
from tests.conftest import TEST_QUEUE, session_cookie_for
from tests.ollama_replay import chat_prompt_tokens, ollama_fixture  # noqa: F401  (the ``ollama`` fixture)
from tests.wsclient import ChatSocket

LONG = " ".join(f"word{i}" for i in range(300))  # 300 words: 304 tokens to the replay, ~540 estimated


def _msg(role: str, words: int) -> dict[str, str]:
    return {"role": role, "content": " ".join(["w"] * words)}


# The replay's cut, as server/prompt.go chatPrompt makes it ------------------------------------------------


def test_replay_drops_the_oldest_messages_and_keeps_system_and_the_last():
    messages = [_msg("system", 10), _msg("user", 100), _msg("assistant", 100), _msg("user", 5)]
    assert chat_prompt_tokens(messages, 4096) == 14 + 104 + 104 + 9  # fits: nothing cut
    assert chat_prompt_tokens(messages, 150) == 14 + 104 + 9  # the first user message goes, the system one stays
    assert chat_prompt_tokens(messages, 30) == 14 + 9  # everything but the system prompt and the last message
    assert chat_prompt_tokens(messages, 20) == 20 - (20 - 5) // 2  # even those are over: the context shift cuts
    assert chat_prompt_tokens(messages, 150, truncate=False) == 231  # "truncate": false


def test_replay_context_shifts_a_last_message_over_the_window():
    # llama-server's context shift: keep num_keep (4) + BOS, drop about half of the rest (contextShiftPromptLimit).
    assert chat_prompt_tokens([_msg("user", 300)], 256) == 256 - (256 - 5) // 2


def test_history_cut_is_clear_of_the_estimates_error():
    assert history_truncated(sent_estimate=1000, read=300, window=512)
    assert not history_truncated(sent_estimate=1000, read=800, window=512)  # within the estimate's error
    assert not history_truncated(sent_estimate=400, read=100, window=512)  # under the window: Ollama cuts nothing
    assert history_truncated(sent_estimate=1000, read=400, window=None)
    assert not history_truncated(sent_estimate=1000, read=600, window=None)
    assert not history_truncated(sent_estimate=1000, read=None, window=512)


# A turn whose history Ollama cut ------------------------------------------------------------------------


async def _turn(sock: ChatSocket, text: str, params: dict) -> int:
    await sock.send({"type": "turn.send", "text": text, "params": params})
    turn_id = int((await sock.recv_until(lambda f: f["type"] == "turn.queued"))["turn"]["id"])
    return turn_id


@pytest.mark.django_db(transaction=True)
async def test_a_cut_history_is_marked_on_the_turn_the_page_and_the_board(celery_worker, owner, ollama):
    rig = await Rig.objects.acreate(name="ollama-cut", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue=TEST_QUEUE)
    session = await sync_to_async(sessions.session_create)(owner=owner, rig=rig, model_name="smollm2:135m")
    sock = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await sock.connect())[0]
    await sock.recv()
    first = await _turn(sock, LONG, {"num_ctx": 4096, "max_tokens": 20})
    await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == first)
    # The same chat with a 256-token window: Ollama drops the long first message and its reply, and says nothing.
    second = await _turn(sock, "And then?", {"num_ctx": 256, "max_tokens": 20})
    end = await sock.recv_until(lambda f: f["type"] == "turn.end" and f["turn"]["id"] == second)
    await sock.close()
    turns = {t.pk: t async for t in Turn.objects.select_related("session__owner", "session__rig")}
    assert "history_truncated" not in turns[first].stats
    cut = turns[second].stats["history_truncated"]
    # Read: the first reply (12 words + 4) and "And then?" (2 + 4); the 300-word message went.
    assert cut["read"] == turns[second].stats["backend_timings"]["prompt_eval_count"] == 16 + 6
    assert cut["window"] == 256 and cut["sent_estimate"] > 500
    assert end["turn"]["stats"]["history_truncated"] == cut  # what the chat's stats line reads
    row = await sync_to_async(board_rows.board_row)(turns[second], position=None, progress=None)
    assert row["history_truncated"] == cut


def test_the_stats_line_and_the_board_say_the_history_was_cut():
    """static/rigdash/turnstats.js, run by Node: the warning is plain text built from numbers only."""
    script = f"""
      global.window = {{}};
      require({json.dumps(str(ROOT / "static/rigdash/turnstats.js"))});
      const s = window.RigDashStats;
      const cut = {{sent_estimate: 612, read: 7, window: 256}};
      console.log(JSON.stringify([
        s.statsText({{status: "done", finish_reason: "stop", stats: {{history_truncated: cut}}}}),
        s.truncationText({{sent_estimate: "<b>1</b>", read: 2}}),
        s.statsText({{status: "done", finish_reason: "stop", stats: {{}}}}),
      ]));
    """
    out = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout)
    assert out[0].endswith(
        "⚠ history cut: the model read 7 of about 612 prompt tokens; older messages were dropped to fit its"
        " 256-token context"
    )
    assert out[1] == "" and "history cut" not in out[2]


# The context quota counts what Ollama reads -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_context_quota_counts_no_more_than_ollamas_window(owner, ollama):
    Quota.objects.create(user=owner, max_context_tokens=300)
    rig = quiet(Rig.objects.create(name="ollama-quota", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue="q1"))
    session = make_session(owner, rig, "smollm2:135m")
    # ~540 tokens estimated; the window unknown (no num_ctx, no turn yet): over the limit.
    with pytest.raises(errors.QuotaExceeded, match="about 5"):
        submit.turn_submit(session=session, text=LONG)
    # num_ctx 256: Ollama reads at most 256 tokens of it, under the 300 allowed.
    turn = submit.turn_submit(session=session, text=LONG, params={"num_ctx": 256})
    assert turn.status == Turn.Status.QUEUED
    # The window the chat's last turn ran with counts too (its stats' context_limit, from /api/ps).
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.DONE, stats={"context_limit": 256})
    assert submit.turn_submit(session=session, text="more").status == Turn.Status.QUEUED


@pytest.mark.django_db(transaction=True)
def test_context_quota_on_llama_server_ignores_num_ctx(owner):
    Quota.objects.create(user=owner, max_context_tokens=300)
    rig = quiet(Rig.objects.create(name="llama-q", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="q"))
    session = make_session(owner, rig, "m")
    with pytest.raises(errors.QuotaExceeded):  # llama-server refuses an over-long prompt; it does not cut it
        submit.turn_submit(session=session, text=LONG, params={"num_ctx": 256})


# num_ctx on the chat page -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_num_ctx_is_a_chat_setting_on_ollama_rigs_only(owner, ollama):
    client = Client()
    client.force_login(owner)
    ollama_rig = Rig.objects.create(name="ollama-page", kind=Rig.Kind.OLLAMA, base_url=ollama.url, queue="q2")
    llama_rig = Rig.objects.create(name="llama-page", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue="q3")
    on_ollama, on_llama = make_session(owner, ollama_rig, "smollm2:135m"), make_session(owner, llama_rig, "m")

    def page(session) -> str:
        return client.get(reverse("inference:session_detail", args=[session.pk])).content.decode()

    assert 'data-testid="set-num_ctx"' in page(on_ollama) and 'min="256"' in page(on_ollama)
    assert "reloads the model" in page(on_ollama)
    assert 'data-testid="set-num_ctx"' not in page(on_llama)

    url = reverse("inference:session_settings", args=[on_ollama.pk])
    response = client.post(url, {"action": "save", "num_ctx": "8192"})
    assert response.status_code == 302
    on_ollama.refresh_from_db()
    assert on_ollama.settings == {"num_ctx": 8192}
    assert "context (num_ctx) 8192" in page(on_ollama)
    for bad, message in (("100", "between 256 and"), ("2000000", "between 256 and"), ("4k", "whole number")):
        response = client.post(url, {"action": "save", "num_ctx": bad})
        assert response.status_code == 400 and message in response.content.decode()
    on_ollama.refresh_from_db()
    assert on_ollama.settings == {"num_ctx": 8192}  # a refusal stores nothing

    # A crafted form for the llama-server chat is refused; a preset made on Ollama applies without its num_ctx.
    llama_url = reverse("inference:session_settings", args=[on_llama.pk])
    response = client.post(llama_url, {"action": "save", "num_ctx": "8192"})
    assert response.status_code == 400 and "Ollama rigs only" in response.content.decode()
    preset = ChatPreset.objects.create(owner=owner, name="long", settings={"num_ctx": 8192, "temperature": 0.5})
    chat_manage.preset_apply(session=on_llama, preset=preset)
    assert on_llama.settings == {"temperature": 0.5}
