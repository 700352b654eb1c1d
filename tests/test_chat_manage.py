"""Chat settings, presets and chat management over HTTP: validation (a clear error, nothing stored), ownership
(another user's chat or preset is a 404 by every route), CSRF on every POST, and what reaches each backend."""

from __future__ import annotations

import dataclasses
import json

import pytest
from django.test import Client

from inference.backends.base import ChatRequest
from inference.backends.llamacpp import LlamaCppBackend
from inference.backends.ollama import OllamaBackend
from inference.errors import InvalidInput
from inference.live import state as live
from inference.models import ChatPreset, ChatSession, Turn
from inference.turns import params as chat_settings
from inference.turns import transfer as chat_transfer
from tests.conftest import page_json

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner_client(owner):
    client = Client()
    client.force_login(owner)
    return client


@pytest.fixture
def other_client(other_user):
    client = Client()
    client.force_login(other_user)
    return client


GOOD = {
    "system": "You are terse.",
    "temperature": 0.3,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.05,
    "repeat_penalty": 1.1,
    "max_tokens": 64,
    "seed": 7,
    "stop": ["###", "User:"],
}


def _post_settings(client, session_id, values):
    return client.post(
        f"/api/sessions/{session_id}/settings", json.dumps({"settings": values}), content_type="application/json"
    )


def test_settings_are_stored_whole_and_shown_at_a_glance(owner_client, chat_session):
    response = _post_settings(owner_client, chat_session.pk, GOOD)
    assert response.status_code == 200, response.content
    chat_session.refresh_from_db()
    assert chat_session.settings == GOOD
    summary = response.json()["summary"]
    assert summary.startswith("system prompt (14 chars)")
    assert "temperature 0.3" in summary and "2 stop strings" in summary
    page = owner_client.get(f"/sessions/{chat_session.pk}/").content.decode()
    assert "temperature 0.3" in page and "You are terse." in page


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"temperature": True}, "temperature must be a number"),
        ({"temperature": 2.5}, "between 0 and 2"),
        ({"top_p": -0.1}, "between 0 and 1"),
        ({"top_k": 1.5}, "top_k must be a whole number"),
        ({"top_k": 5000}, "between 0 and 1000"),
        ({"min_p": 1.01}, "between 0 and 1"),
        ({"repeat_penalty": 9}, "between 0 and 2"),
        ({"max_tokens": 0}, "between 1 and"),
        ({"max_tokens": 10**6}, "between 1 and"),
        ({"seed": -1}, "between 0 and"),
        ({"temperature": float("nan")}, "finite"),  # JSON's NaN: the API's strict reader refuses it first
        ({"system": ""}, "system prompt is empty"),
        ({"system": "   "}, "system prompt is empty"),
        ({"system": 42}, "system must be text"),
        ({"system": "x" * (chat_settings.SYSTEM_MAX_CHARS + 1)}, "the limit is 8000"),
        ({"stop": "###"}, "stop must be a list of strings"),
        ({"stop": [""]}, "stop string is empty"),
        ({"stop": ["a"] * 9}, "the limit is 8"),
        ({"stop": ["x" * 65]}, "the limit is 64"),
        ({"stop": [1]}, "stop must be a list of strings"),
        ({"grammar": "root ::= x"}, "unknown parameter 'grammar'"),
        ("hot", "params must be an object"),
    ],
)
def test_bad_settings_get_a_clear_error_and_nothing_is_stored(owner_client, chat_session, values, message):
    _post_settings(owner_client, chat_session.pk, {"temperature": 1.0})
    bad = {"top_p": 0.5, **values} if isinstance(values, dict) else values  # a good value beside the bad one
    response = _post_settings(owner_client, chat_session.pk, bad)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == ("bad_json" if message == "finite" else "bad_params")
    assert message in response.json()["error"]["message"]
    chat_session.refresh_from_db()
    assert chat_session.settings == {"temperature": 1.0}


def test_max_tokens_is_held_to_the_servers_cap(owner_client, chat_session, settings):
    settings.RIGDASH = dataclasses.replace(settings.RIGDASH, max_reply_tokens=100)
    response = _post_settings(owner_client, chat_session.pk, {"max_tokens": 101})
    assert response.status_code == 400 and "limited to 100" in response.json()["error"]["message"]


def test_the_settings_form_keeps_what_was_typed_on_an_error(owner_client, chat_session):
    response = owner_client.post(
        f"/sessions/{chat_session.pk}/settings", {"system": "Be kind.", "temperature": "warm", "stop": "END"}
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "temperature must be a number" in page and "Be kind." in page and 'value="warm"' in page
    chat_session.refresh_from_db()
    assert chat_session.settings == {}


def test_the_settings_form_saves_and_a_preset_is_stored_and_applied(owner_client, owner, chat_session, rig):
    response = owner_client.post(
        f"/sessions/{chat_session.pk}/settings",
        {"system": "Answer in French.", "temperature": "0.2", "top_k": "", "stop": "END\r\nSTOP\r\n",
         "action": "preset", "preset_name": "french"},
    )  # fmt: skip
    assert response.status_code == 302
    chat_session.refresh_from_db()
    expected = {"system": "Answer in French.", "temperature": 0.2, "stop": ["END", "STOP"]}
    assert chat_session.settings == expected
    preset = ChatPreset.objects.get(owner=owner, name="french")
    assert preset.settings == expected
    second = ChatSession.objects.create(owner=owner, rig=rig, model_name=chat_session.model_name)
    owner_client.post(f"/sessions/{second.pk}/preset", {"preset": preset.pk, "action": "apply"})
    second.refresh_from_db()
    assert second.settings == expected


def test_a_preset_without_a_name_stores_neither_it_nor_the_settings(owner_client, chat_session):
    response = owner_client.post(
        f"/sessions/{chat_session.pk}/settings", {"temperature": "0.2", "action": "preset", "preset_name": " "}
    )
    assert response.status_code == 400 and "Give the preset a name" in response.content.decode()
    chat_session.refresh_from_db()
    assert chat_session.settings == {} and not ChatPreset.objects.exists()


def test_a_turn_takes_the_chats_settings_and_its_own_on_top(owner_client, chat_session):
    chat_session.settings = {"system": "S", "temperature": 0.5, "stop": ["###"]}
    chat_session.save()
    session = ChatSession.objects.select_related("rig").get(pk=chat_session.pk)
    params = chat_settings.turn_params(session=session, raw={"temperature": 0.9, "seed": 3})
    assert params == {"system": "S", "temperature": 0.9, "stop": ["###"], "seed": 3}
    with pytest.raises(InvalidInput):
        chat_settings.turn_params(session=session, raw={"stop": [""]})


def test_the_backend_request_puts_the_system_prompt_first_and_passes_each_knob():
    params = {**GOOD}
    request = chat_settings.chat_request("m", [{"role": "user", "content": "hi"}], 64, params)
    assert request.messages[0] == {"role": "system", "content": "You are terse."}
    assert request.messages[1] == {"role": "user", "content": "hi"}
    llama = LlamaCppBackend("http://127.0.0.1:1")._payload(request)
    for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "max_tokens"):
        assert llama[name] == GOOD[name], name
    assert llama["stop"] == ["###", "User:"]
    # Ollama's names: under options, max_tokens as num_predict (api/types.go Options).
    options = OllamaBackend("http://127.0.0.1:1")._options(request)
    assert options["num_predict"] == 64 and options["stop"] == ["###", "User:"]
    for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed"):
        assert options[name] == GOOD[name], name
    bare = ChatRequest(model="m", messages=[], max_tokens=5)
    assert "stop" not in LlamaCppBackend("http://x")._payload(bare)


def test_rename_changes_the_title_and_refuses_an_empty_one(owner_client, chat_session):
    owner_client.post(f"/sessions/{chat_session.pk}/rename", {"title": "  Sea   poems "})
    chat_session.refresh_from_db()
    assert chat_session.title == "Sea poems"
    response = owner_client.post(f"/sessions/{chat_session.pk}/rename", {"title": "  "}, follow=True)
    assert "The title is empty." in response.content.decode()
    chat_session.refresh_from_db()
    assert chat_session.title == "Sea poems"


def test_delete_asks_first_then_removes_the_turns_and_their_live_state(owner_client, chat_session):
    done = Turn.objects.create(session=chat_session, user_text="a", reply_text="b", status=Turn.Status.DONE)
    running = Turn.objects.create(session=chat_session, user_text="c", status=Turn.Status.DECODING)
    client = live.sync_client()
    client.rpush(live.live_key(running.pk), live.encode_batch(1, 1, "partial"))
    page = owner_client.get(f"/sessions/{chat_session.pk}/delete")
    assert page.status_code == 200 and "cannot be undone" in page.content.decode()
    assert ChatSession.objects.filter(pk=chat_session.pk).exists()  # a GET deletes nothing
    with pytest.MonkeyPatch.context() as patch:  # this test runs in a transaction that is never committed
        patch.setattr("django.db.transaction.on_commit", lambda fn, robust=False: fn())
        response = owner_client.post(f"/sessions/{chat_session.pk}/delete")
    assert response.status_code == 302
    assert not ChatSession.objects.filter(pk=chat_session.pk).exists()
    assert not Turn.objects.filter(pk__in=[done.pk, running.pk]).exists()
    assert not client.exists(live.live_key(running.pk))
    assert client.get(live.cancel_key(running.pk)) == b"1"  # its worker stops decoding


def test_search_finds_a_word_from_a_reply_and_a_title_but_not_another_users_chat(
    owner_client, chat_session, other_user, rig
):
    Turn.objects.create(session=chat_session, user_text="tell me", reply_text="The albatross glides.", status="done")
    titled = ChatSession.objects.create(owner=chat_session.owner, rig=rig, model_name="m", title="Kestrel notes")
    theirs = ChatSession.objects.create(owner=other_user, rig=rig, model_name="m", title="albatross too")
    Turn.objects.create(session=theirs, user_text="albatross", reply_text="albatross", status="done")
    page = owner_client.get("/", {"q": "albatross"}).content.decode()
    assert f"/sessions/{chat_session.pk}/" in page and "The albatross glides." in page
    assert f"/sessions/{theirs.pk}/" not in page
    assert f"/sessions/{titled.pk}/" in owner_client.get("/", {"q": "kestrel"}).content.decode()
    assert "1 chat match" in owner_client.get("/", {"q": "kestrel"}).content.decode()
    assert "0 chats match" in owner_client.get("/", {"q": "zebra"}).content.decode()


def test_export_then_import_gives_the_same_conversation(owner_client, owner, chat_session):
    chat_session.title = "Poems"
    chat_session.settings = {"system": "Rhyme.", "temperature": 0.4}
    chat_session.save()
    Turn.objects.create(session=chat_session, user_text="one", reply_text="**uno**", status="done", finish_reason="x")
    Turn.objects.create(session=chat_session, user_text="two", reply_text="dos", status="cancelled")
    exported = owner_client.get(f"/sessions/{chat_session.pk}/export.json")
    assert exported.status_code == 200 and "attachment" in exported["Content-Disposition"]
    markdown = owner_client.get(f"/sessions/{chat_session.pk}/export.md").content.decode()
    assert markdown.startswith("# Poems") and "## User\n\none" in markdown and "**uno**" in markdown
    response = owner_client.post("/api/sessions/import", exported.content, content_type="application/json")
    assert response.status_code == 201, response.content
    copy = ChatSession.objects.get(pk=response.json()["session"])
    assert (copy.owner, copy.title, copy.model_name, copy.settings) == (owner, "Poems", chat_session.model_name,
                                                                       chat_session.settings)  # fmt: skip
    pairs = list(copy.turns.order_by("created_at", "id").values_list("user_text", "reply_text", "status"))
    assert pairs == [("one", "**uno**", "done"), ("two", "dos", "cancelled")]
    sent = list(chat_session.turns.order_by("created_at", "id").values_list("created_at", flat=True))
    assert list(copy.turns.order_by("created_at", "id").values_list("created_at", flat=True)) == sent


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "not JSON"),
        (b'{"hello": 1}', "not a RigDash chat export"),
        (b"[]", "not a RigDash chat export"),
        (b'{"format": "rigdash.chat", "version": 2}', "version 2"),
        (b'{"format": "rigdash.chat", "version": 1, "model": "M", "turns": []}', "no turns"),
        (b'{"format": "rigdash.chat", "version": 1, "model": "M", "turns": [{"user": 1}]}', "Turn 1"),
        (b'{"format": "rigdash.chat", "version": 1, "model": "M", "settings": {"top_p": 5},'
         b' "turns": [{"user": "a", "reply": "b"}]}', "between 0 and 1"),
        (b'{"format": "rigdash.chat", "version": 1, "model": "no-such-model",'
         b' "turns": [{"user": "a", "reply": "b"}]}', "No rig serves the model 'no-such-model'"),
    ],
)  # fmt: skip
def test_an_import_that_is_not_an_export_or_names_an_unserved_model_stores_nothing(owner_client, rig, body, message):
    before = ChatSession.objects.count()
    response = owner_client.post("/api/sessions/import", body, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] in ("bad_import", "bad_params")
    assert message in response.json()["error"]["message"]
    assert ChatSession.objects.count() == before and not Turn.objects.exists()


def test_the_import_form_says_why_a_file_was_refused(owner_client, rig):
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("x.json", b'{"hello": 1}', content_type="application/json")
    response = owner_client.post("/sessions/import", {"file": upload}, follow=True)
    assert "Not imported: The file is not a RigDash chat export." in response.content.decode()
    assert not ChatSession.objects.exists()


def test_export_format_is_json_or_markdown_only(owner_client, chat_session):
    assert owner_client.get(f"/sessions/{chat_session.pk}/export.html").status_code == 404
    assert chat_transfer.session_export(chat_session)["format"] == "rigdash.chat"


def test_another_users_chat_and_preset_are_404_by_every_route(other_client, owner, chat_session):
    preset = ChatPreset.objects.create(owner=owner, name="mine", settings={"temperature": 1.0})
    s = chat_session.pk
    gets = [f"/sessions/{s}/", f"/sessions/{s}/delete", f"/sessions/{s}/export.json", f"/sessions/{s}/export.md",
            f"/api/sessions/{s}/settings"]  # fmt: skip
    for url in gets:
        assert other_client.get(url).status_code == 404, url
    posts = [
        (f"/sessions/{s}/settings", {"temperature": "1"}),
        (f"/sessions/{s}/preset", {"preset": preset.pk}),
        (f"/sessions/{s}/rename", {"title": "mine now"}),
        (f"/sessions/{s}/delete", {}),
    ]
    for url, data in posts:
        assert other_client.post(url, data).status_code == 404, url
    assert _post_settings(other_client, s, {"temperature": 1.0}).status_code == 404
    chat_session.refresh_from_db()
    assert ChatSession.objects.filter(pk=s).exists() and chat_session.title == "" and chat_session.settings == {}


def test_someone_elses_preset_cannot_be_applied_or_deleted(other_client, other_user, owner, chat_session):
    preset = ChatPreset.objects.create(owner=owner, name="mine", settings={"temperature": 1.0})
    theirs = ChatSession.objects.create(owner=other_user, rig=chat_session.rig, model_name="m")
    for action in ("apply", "delete"):
        response = other_client.post(f"/sessions/{theirs.pk}/preset", {"preset": preset.pk, "action": action})
        assert response.status_code == 404
    assert ChatPreset.objects.filter(pk=preset.pk).exists()
    theirs.refresh_from_db()
    assert theirs.settings == {}


def test_every_chat_post_needs_the_csrf_token(owner, chat_session):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    s = chat_session.pk
    for url in (f"/sessions/{s}/settings", f"/sessions/{s}/preset", f"/sessions/{s}/rename", f"/sessions/{s}/delete",
                "/sessions/import", f"/api/sessions/{s}/settings", "/api/sessions/import"):  # fmt: skip
        assert client.post(url, {}).status_code == 403, url
    assert ChatSession.objects.filter(pk=s).exists()


def test_anonymous_callers_are_sent_to_log_in(chat_session):
    client = Client()
    assert client.get(f"/sessions/{chat_session.pk}/export.json").status_code == 302
    assert client.post(f"/api/sessions/{chat_session.pk}/settings", {}).status_code in (401, 403)


def _branch(client, turn_id, body):
    return client.post(f"/api/turns/{turn_id}/branch", json.dumps(body), content_type="application/json")


def test_regenerate_makes_a_branch_with_the_earlier_turns_and_keeps_the_original(owner_client, chat_session):
    chat_session.settings = {"temperature": 0.7}
    chat_session.title = "Cats"
    chat_session.save()
    first = Turn.objects.create(session=chat_session, user_text="one", reply_text="uno", status="done",
                                output_tokens=3, prompt_tokens=5)  # fmt: skip
    second = Turn.objects.create(session=chat_session, user_text="two", reply_text="dos", status="done")
    Turn.objects.create(session=chat_session, user_text="three", reply_text="tres", status="done")
    response = _branch(owner_client, second.pk, {})
    assert response.status_code == 201, response.content
    branch = ChatSession.objects.get(pk=response.json()["session"])
    assert (branch.branch_of, branch.branch_of_turn, branch.branch_at) == (chat_session, second, 1)
    assert branch.title == "Cats (version 2)" and branch.settings == {"temperature": 0.7}
    turns = list(branch.turns.order_by("created_at", "id"))
    assert [(t.user_text, t.reply_text, t.status) for t in turns] == [("one", "uno", "done"), ("two", "", "queued")]
    assert turns[0].output_tokens is None  # usage counts the original's tokens once
    assert turns[1].params == {"temperature": 0.7}
    assert chat_session.turns.count() == 3  # the original keeps its version
    page = owner_client.get(f"/sessions/{chat_session.pk}/").content.decode()
    assert page_json(page)["versions"]["branches"][str(second.pk)][0]["session"] == branch.pk
    assert first.pk


def test_edit_and_resend_sends_the_new_text_and_refuses_an_empty_one(owner_client, chat_session):
    turn = Turn.objects.create(session=chat_session, user_text="old", reply_text="x", status="done")
    response = _branch(owner_client, turn.pk, {"text": "new question"})
    assert response.status_code == 201
    branch = ChatSession.objects.get(pk=response.json()["session"])
    assert list(branch.turns.values_list("user_text", flat=True)) == ["new question"]
    before = ChatSession.objects.count()
    response = _branch(owner_client, turn.pk, {"text": "  "})
    assert response.status_code == 400 and response.json()["error"]["code"] == "empty_message"
    assert ChatSession.objects.count() == before  # no half-made branch


def test_a_running_turn_cannot_be_branched(owner_client, chat_session):
    turn = Turn.objects.create(session=chat_session, user_text="q", status=Turn.Status.DECODING)
    response = _branch(owner_client, turn.pk, {})
    assert response.status_code == 400 and response.json()["error"]["code"] == "turn_in_progress"
    assert ChatSession.objects.count() == 1


def test_another_users_turn_cannot_be_branched(other_client, chat_session):
    turn = Turn.objects.create(session=chat_session, user_text="q", reply_text="a", status="done")
    assert _branch(other_client, turn.pk, {}).status_code == 404
    assert ChatSession.objects.count() == 1
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(chat_session.owner)
    assert _branch(csrf, turn.pk, {}).status_code == 403


def test_continue_branches_with_the_reply_so_far_as_the_start_of_the_next(owner_client, chat_session):
    cut = Turn.objects.create(session=chat_session, user_text="q", reply_text="Once upon", status="done",
                              finish_reason="length")  # fmt: skip
    response = _branch(owner_client, cut.pk, {"continue": True})
    assert response.status_code == 201, response.content
    branch = ChatSession.objects.get(pk=response.json()["session"])
    assert branch.title.endswith("(continued)")
    turn = branch.turns.get()
    assert (turn.user_text, turn.params) == ("q", {"prefill": "Once upon"})
    request = chat_settings.chat_request("m", [{"role": "user", "content": "q"}], 8, turn.params)
    assert request.messages[-1] == {"role": "assistant", "content": "Once upon"}
    empty = Turn.objects.create(session=chat_session, user_text="q2", reply_text="", status="cancelled")
    assert _branch(owner_client, empty.pk, {"continue": True}).json()["error"]["code"] == "nothing_to_continue"


def test_a_prefill_is_a_turns_own_never_a_chat_setting(owner_client, chat_session):
    response = _post_settings(owner_client, chat_session.pk, {"prefill": "Sure,"})
    assert response.status_code == 400 and "unknown parameter 'prefill'" in response.json()["error"]["message"]
    with pytest.raises(InvalidInput, match="prefill must be non-empty text"):
        chat_settings.params_validate({"prefill": ""}, turn=True)


def test_compare_refuses_bad_picks_and_unserved_models_storing_nothing(owner_client, rig, model_name):
    good = f"{rig.pk}:{model_name}"
    for left, right, message in [
        (good, "", "Choose a model for each side."),
        (good, "nonsense", "Choose a model for each side."),
        (good, f"{rig.pk + 99}:{model_name}", "does not exist or is disabled"),
        (good, f"{rig.pk}:no-such-model", "does not serve a model named &#x27;no-such-model&#x27;"),
    ]:
        response = owner_client.post("/compare/", {"left": left, "right": right, "text": "hi"})
        assert response.status_code == 400 and message in response.content.decode(), (right, response.content[:300])
    response = owner_client.post("/compare/", {"left": good, "right": good, "text": " "})
    assert response.status_code == 400 and "The message is empty." in response.content.decode()
    assert not ChatSession.objects.exists() and not Turn.objects.exists()


def test_compare_page_is_404_with_another_users_chat(other_client, other_user, chat_session):
    theirs = ChatSession.objects.create(owner=other_user, rig=chat_session.rig, model_name="m")
    assert other_client.get(f"/compare/{theirs.pk}/{chat_session.pk}/").status_code == 404
    assert other_client.get(f"/compare/{chat_session.pk}/{theirs.pk}/").status_code == 404
    assert other_client.get(f"/compare/{theirs.pk}/{theirs.pk}/").status_code == 200
