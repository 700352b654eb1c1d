"""The admin board: who is using the rig now, live, and cancelling any user's turn from it."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from inference.live import progress as live_progress
from inference.models import AuditLog, Turn
from inference.turns import board_rows, submit
from inference.worker import start as starts
from tests.adminkit import make_session, quiet
from tests.conftest import llama_busy_slots, session_cookie_for
from tests.wsclient import BoardSocket, ChatSocket, token_frames

STORY = "Write a long story about a lighthouse keeper and a storm, with many details."


def test_context_fill_adds_the_reply_to_the_prompt():
    assert live_progress.context_fill(100, 28, 2048) == {"context_used": 128, "n_ctx": 2048, "context_ratio": 0.0625}
    assert live_progress.context_fill(None, 5, 2048)["context_used"] is None
    assert live_progress.context_fill(10, 0, None) == {"context_used": 10, "n_ctx": None, "context_ratio": None}


@pytest.mark.django_db
def test_board_pages_are_404_for_users_and_send_anonymous_people_to_log_in(owner, other_user, admin_user):
    routes = ["/board/", "/board/api/turns", "/board/users/", "/board/quotas/", "/board/audit/"]
    for user in (owner, other_user):
        client = Client()
        client.force_login(user)
        for route in routes:
            assert client.get(route).status_code == 404, (user, route)
        assert client.post("/board/api/turns/1/cancel").status_code == 404
    anonymous = Client()
    assert anonymous.get("/board/").status_code == 302
    staff = Client()
    staff.force_login(admin_user)
    assert all(staff.get(route).status_code == 200 for route in routes)


@pytest.mark.django_db(transaction=True)
async def test_board_socket_is_refused_to_users_anonymous_people_and_other_origins(owner, admin_user):
    user_sock = BoardSocket(await sync_to_async(session_cookie_for)(owner))
    assert await user_sock.connect() == (False, 4403)
    assert (await BoardSocket(None).connect()) == (False, 4401)
    admin_cookie = await sync_to_async(session_cookie_for)(admin_user)
    foreign = BoardSocket(admin_cookie, origin="http://evil.example")
    assert not (await foreign.connect())[0]
    sock = BoardSocket(admin_cookie)
    assert (await sock.connect())[0]
    snapshot = await sock.recv()
    assert snapshot["type"] == "board.snapshot" and snapshot["turns"] == []
    await sock.close()


@pytest.mark.django_db(transaction=True)
async def test_board_shows_every_users_turns_with_queue_positions(owner, other_user, admin_user, rig, model_name):
    """No worker listens to this rig's queue: turns stay queued. One slot: the rest wait in the fair queue."""
    rig.slots = 1
    await sync_to_async(rig.save)()
    await sync_to_async(quiet)(rig)
    sessions = [await sync_to_async(make_session)(u, rig, model_name) for u in (owner, owner, other_user)]
    sock = BoardSocket(await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.connect())[0]
    await sock.recv()
    turns = [await sync_to_async(submit.turn_submit)(session=s, text="hello") for s in sessions]
    rows = {}
    while len(rows) < 3:
        frame = await sock.recv_until(lambda f: f["type"] == "turn")
        rows[frame["turn"]["id"]] = frame["turn"]
    assert {r["user"] for r in rows.values()} == {"owner", "other"}
    assert all(r["rig"] == "test-rig" and r["model"] == model_name for r in rows.values())
    queue = [f for f in sock.frames if f["type"] == "queue" and len(f["positions"]) == 3][-1]
    # Owner's first turn holds the slot (0: starting); the other user's goes before the owner's second.
    assert queue["positions"] == {str(turns[0].pk): 0, str(turns[2].pk): 1, str(turns[1].pk): 2}
    await sock.send({"type": "board.resync"})
    snapshot = await sock.recv_until(lambda f: f["type"] == "board.snapshot")
    assert [(r["id"], r["queue_position"]) for r in snapshot["turns"]] == [
        (turns[0].pk, 0),
        (turns[1].pk, 2),
        (turns[2].pk, 1),
    ]
    await sock.close()


@pytest.mark.django_db(transaction=True)
async def test_admin_cancels_a_waiting_turn_and_no_later_delivery_runs_it(owner, admin_user, rig, model_name):
    """The turn's task is in the broker (no worker listens); cancel, then deliver it as a restarted worker would."""
    await sync_to_async(quiet)(rig)
    session = await sync_to_async(make_session)(owner, rig, model_name)
    chat = ChatSocket(session.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await chat.connect())[0]
    await chat.recv()
    turn = await sync_to_async(submit.turn_submit)(session=session, text="hello")
    sock = BoardSocket(await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.connect())[0]
    await sock.recv()
    started = time.monotonic()
    await sock.send({"type": "turn.cancel", "turn": turn.pk})
    accepted = await sock.recv_until(lambda f: f["type"] in ("cancel.accepted", "error"))
    assert accepted == {"type": "cancel.accepted", "turn": turn.pk, "status": "cancelled"}
    end = await chat.recv_until(lambda f: f["type"] == "turn.end")
    assert time.monotonic() - started < 1.0
    assert end["turn"]["status"] == "cancelled" and end["turn"]["finish_reason"] == "cancelled"
    row = await sock.recv_until(lambda f: f["type"] == "turn" and f["turn"]["status"] == "cancelled")
    assert row["turn"]["id"] == turn.pk
    await chat.close()
    await sock.close()
    assert await sync_to_async(starts.turn_run)(turn.pk) == "not-claimed"  # the DB flag, not a memory revoke
    entry = await AuditLog.objects.aget()
    assert (entry.actor_name, entry.action, entry.target) == ("admin", "turn.cancel", f"turn:{turn.pk}")
    assert entry.detail == {"owner": "owner", "session": session.pk, "status_before": "queued"}


@pytest.mark.django_db(transaction=True)
async def test_cancel_of_a_finished_or_forged_turn_gets_a_clear_error_and_changes_nothing(
    owner, admin_user, chat_session
):
    done = await Turn.objects.acreate(
        session=chat_session, user_text="q", reply_text="answer", status=Turn.Status.DONE, finish_reason="stop"
    )
    sock = BoardSocket(await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.connect())[0]
    await sock.recv()
    await sock.send({"type": "turn.cancel", "turn": done.pk})
    reply = await sock.recv()
    assert (reply["type"], reply["code"]) == ("error", "turn_finished")
    assert "already finished" in reply["message"]
    for forged in (999_999, "abc", None, True, [done.pk], {"id": done.pk}):
        await sock.send({"type": "turn.cancel", "turn": forged})
        reply = await sock.recv()
        assert (reply["type"], reply["code"]) == ("error", "not_found"), forged
    await sock.send({"type": "nope"})
    assert (await sock.recv())["code"] == "unknown_type"
    await sock.comm.send_to(text_data="not json")
    assert (await sock.recv())["code"] == "bad_json"
    await sock.close()
    client = Client()
    await sync_to_async(client.force_login)(admin_user)
    response = await sync_to_async(client.post)(f"/board/api/turns/{done.pk}/cancel")
    assert response.status_code == 409 and response.json()["error"]["code"] == "turn_finished"
    assert (await sync_to_async(client.post)("/board/api/turns/999999/cancel")).status_code == 404
    done_after = await Turn.objects.aget(pk=done.pk)
    assert (done_after.status, done_after.reply_text, done_after.cancel_requested) == ("done", "answer", False)
    assert not await AuditLog.objects.aexists()


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
async def test_admin_cancels_a_running_turn_within_a_second_and_touches_no_other(
    celery_worker, owner, other_user, admin_user, rig, model_name, llama_url
):
    mine = await sync_to_async(make_session)(owner, rig, model_name)
    theirs = await sync_to_async(make_session)(other_user, rig, model_name)
    chat = ChatSocket(mine.pk, await sync_to_async(session_cookie_for)(owner))
    assert (await chat.connect())[0]
    await chat.recv()
    sock = BoardSocket(await sync_to_async(session_cookie_for)(admin_user))
    assert (await sock.connect())[0]
    await sock.recv()
    params = {"temperature": 0.7, "seed": 5, "max_tokens": 600}
    target = await sync_to_async(submit.turn_submit)(session=mine, text=STORY, params=params)
    bystander = await sync_to_async(submit.turn_submit)(
        session=theirs, text=STORY, params={**params, "seed": 6, "max_tokens": 150}
    )
    await chat.recv_until(lambda f: f["type"] == "token" and f["seq_to"] >= 10)
    progress = await sock.recv_until(lambda f: f["type"] == "progress" and f["turn"] == target.pk and f["tokens"] > 0)
    n_ctx = httpx.get(f"{llama_url}/props").json()["default_generation_settings"]["n_ctx"]
    assert progress["n_ctx"] == n_ctx and progress["context_used"] > progress["tokens"]

    started = time.monotonic()
    await sock.send({"type": "turn.cancel", "turn": target.pk})
    end = await chat.recv_until(lambda f: f["type"] == "turn.end", timeout=5)
    cancel_s = time.monotonic() - started
    assert cancel_s < 1.0, f"cancel took {cancel_s:.2f} s"
    streamed = "".join(f["text"] for f in token_frames(chat.frames, target.pk))
    stopped = await Turn.objects.aget(pk=target.pk)
    assert (stopped.status, stopped.finish_reason) == ("cancelled", "cancelled")
    assert stopped.reply_text == streamed == end["turn"]["reply"] and len(streamed) > 0
    # llama-server stopped decoding it; the bystander's turn still runs and ends normally.
    busy = []
    for _ in range(40):  # llama-server notices the closed stream at its next token
        other = await Turn.objects.aget(pk=bystander.pk)
        busy.append(await sync_to_async(llama_busy_slots)(llama_url))
        if busy[-1] <= (1 if other.status in Turn.RUNNING else 0):
            break
        await asyncio.sleep(0.05)
    assert busy[-1] <= 1, busy
    deadline = time.monotonic() + 120
    while other.status in Turn.ACTIVE and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        other = await Turn.objects.aget(pk=bystander.pk)
    assert other.status == Turn.Status.DONE and not other.cancel_requested
    assert await sync_to_async(llama_busy_slots)(llama_url) == 0

    # Progress reached the board at most about twice a second per turn, not with every batch.
    def bystander_done(frame: dict) -> bool:
        return frame["type"] == "turn" and frame["turn"]["id"] == bystander.pk and frame["turn"]["status"] == "done"

    await sock.recv_until(bystander_done, timeout=10)
    ticks = [f for f in sock.frames if f["type"] == "progress" and f["turn"] == bystander.pk]
    duration_s = (other.finished_at - other.started_at).total_seconds()
    assert 1 <= len(ticks) <= duration_s * 2 + 2, (len(ticks), duration_s, other.stats["output_events"])
    assert [t["tokens"] for t in ticks] == sorted(t["tokens"] for t in ticks)
    await chat.close()
    await sock.close()


@pytest.mark.django_db
def test_a_turns_board_row_is_built_only_while_a_board_is_open(
    owner, rig, model_name, settings, django_assert_num_queries
):
    """No board subscribed anywhere: no queries and nothing published (a board reads the database when it opens).
    One subscribed (here a bare Redis subscriber on the board group's channel): the row is built and sent."""
    import redis

    from inference import events

    prefix = f"boardwatch{time.monotonic_ns()}"
    settings.CHANNEL_LAYERS = {**settings.CHANNEL_LAYERS}
    settings.CHANNEL_LAYERS["default"] = {
        **settings.CHANNEL_LAYERS["default"],
        "CONFIG": {**settings.CHANNEL_LAYERS["default"]["CONFIG"], "prefix": prefix},
    }
    turn = Turn.objects.create(session=make_session(owner, rig, model_name), user_text="hello")
    with django_assert_num_queries(0):
        board_rows.publish_turn(turn.pk)

    listener = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    listener.subscribe(f"{prefix}__group__{events.BOARD_GROUP}")
    try:
        assert listener.get_message(timeout=5)["type"] == "subscribe"
        board_rows.publish_turn(turn.pk)
        message = listener.get_message(timeout=5)
        assert message is not None and message["type"] == "message"
        from channels.layers import get_channel_layer

        sent = get_channel_layer().deserialize(message["data"])
        assert sent["type"] == "board.turn" and sent["turn"]["id"] == turn.pk
    finally:
        listener.close()
