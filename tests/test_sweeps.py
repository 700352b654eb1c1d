"""Decode sweeps without running one: bad input refused before anything runs, staff-only routes and sockets, CSRF,
the CSV export and the board's line. The sweeps that run on the real llama-server are in test_sweeps_rig.py."""

from __future__ import annotations

import csv
import io

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from inference import events
from inference.board import sweeps
from inference.errors import InvalidInput, NotFound
from inference.models import ChatSession, Quota, Rig, Sweep, SweepPoint, Turn
from tests.adminkit import make_user
from tests.conftest import session_cookie_for
from tests.wsclient import BoardSocket, Socket

DEAD_URL = "http://127.0.0.1:9"  # nothing listens: a rig that cannot answer


def _plan(**raw):
    return sweeps.sweep_plan_parse({"model": "m", "contexts": "256, 512", "sessions": "1, 2", **raw})


@pytest.mark.parametrize(
    ("raw", "code", "words"),
    [
        ({"model": ""}, "bad_model", "Name the model"),
        ({"model": 7}, "bad_model", "Name the model"),
        ({"contexts": ""}, "bad_contexts", "whole numbers"),
        ({"contexts": "512, lots"}, "bad_contexts", "'lots'"),
        ({"contexts": "-512"}, "bad_contexts", "-512; each must be"),
        ({"contexts": "16"}, "bad_contexts", "64 to"),
        ({"contexts": [512, 2.5]}, "bad_contexts", "2.5"),
        ({"contexts": [512, True]}, "bad_contexts", "True"),
        ({"contexts": ", ".join(str(64 * i) for i in range(1, 14))}, "bad_contexts", "the most is 12"),
        ({"sessions": "0"}, "bad_sessions", "1 to 256"),
        ({"sessions": "1, 300"}, "bad_sessions", "1 to 256"),
        ({"sessions": {"a": 1}}, "bad_sessions", "whole numbers"),
        ({"max_tokens": 0}, "bad_max_tokens", "8 to 4096"),
        ({"max_tokens": "9999"}, "bad_max_tokens", "8 to 4096"),
        ({"max_tokens": 1e400}, "bad_max_tokens", "whole number"),
    ],
)
def test_impossible_numbers_are_refused_with_what_is_wrong(raw, code, words):
    with pytest.raises(InvalidInput) as refused:
        _plan(**raw)
    assert refused.value.code == code
    assert words in refused.value.message


def test_a_good_plan_is_sorted_and_deduplicated():
    plan = _plan(contexts="1024 256,512, 256", sessions=[2, 1], max_tokens="32", force="on")
    assert (plan.contexts, plan.sessions, plan.max_tokens, plan.force) == ([256, 512, 1024], [1, 2], 32, True)
    assert _plan().force is False


@pytest.fixture
def dead_rig(db):
    return Rig.objects.create(name="dead", kind=Rig.Kind.LLAMACPP, base_url=DEAD_URL, queue="rig.dead", slots=2)


def _start(actor, rig, **raw):
    return sweeps.sweep_start(
        actor=actor, rig_id=rig.pk, raw={"model": "m", "contexts": "256", "sessions": "1", "max_tokens": 16, **raw}
    )


def _refused(actor, rig, **raw):
    with pytest.raises(InvalidInput) as refused:
        _start(actor, rig, **raw)
    assert not Sweep.objects.exists() or Sweep.objects.count() == 1  # nothing new stored
    return refused.value


@pytest.mark.django_db
def test_the_rig_side_checks_come_before_anything_runs(admin_user, owner, dead_rig):
    assert _refused(admin_user, dead_rig, sessions="1, 3").code == "ladder_past_slots"
    assert "2 turns at once" in _refused(admin_user, dead_rig, sessions="3").message
    assert _refused(admin_user, dead_rig).code == "rig_unreachable"  # the backend is asked last
    assert not Sweep.objects.exists()
    session = ChatSession.objects.create(owner=owner, rig=dead_rig, model_name="m")
    Turn.objects.create(session=session, user_text="hi")  # someone's turn is waiting on the rig
    busy = _refused(admin_user, dead_rig)
    assert busy.code == "rig_busy" and "1 turns waiting or running" in busy.message
    assert _refused(admin_user, dead_rig, force=True).code == "rig_unreachable"  # forced: past the busy check
    Sweep.objects.create(rig=dead_rig, owner=admin_user, model_name="m", contexts=[256], sessions=[1], max_tokens=8)
    assert _refused(admin_user, dead_rig, force=True).code == "sweep_running"
    with pytest.raises(NotFound):
        sweeps.sweep_start(actor=admin_user, rig_id=999_999, raw={})
    with pytest.raises(NotFound):
        sweeps.sweep_start(actor=admin_user, rig_id="1; drop", raw={})
    assert _refused(owner, dead_rig).code == "forbidden"


@pytest.mark.django_db
def test_a_ladder_over_the_owners_quota_is_refused_at_once(admin_user, dead_rig):
    Quota.objects.create(user=admin_user, max_concurrent_turns=1, max_tokens_per_reply=8, max_context_tokens=200)
    refused = _refused(admin_user, dead_rig, sessions="1, 2")
    assert refused.code == "ladder_past_quota"
    for part in ("2 sessions at once", "16 tokens per reply", "256-token prompt"):
        assert part in refused.message


@pytest.mark.django_db
def test_one_sweep_at_a_time_per_rig_even_in_the_database(admin_user, dead_rig):
    from django.db import IntegrityError, transaction

    Sweep.objects.create(rig=dead_rig, owner=admin_user, model_name="m", contexts=[256], sessions=[1], max_tokens=8)
    with pytest.raises(IntegrityError), transaction.atomic():
        Sweep.objects.create(rig=dead_rig, owner=admin_user, model_name="m", contexts=[256], sessions=[1], max_tokens=8)
    Sweep.objects.update(status=Sweep.Status.DONE)
    Sweep.objects.create(rig=dead_rig, owner=admin_user, model_name="m", contexts=[256], sessions=[1], max_tokens=8)


def _client(user=None, *, csrf=False):
    client = Client(enforce_csrf_checks=csrf)
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def finished_sweep(admin_user, dead_rig):
    sweep = Sweep.objects.create(
        rig=dead_rig,
        owner=admin_user,
        model_name="m",
        contexts=[256, 512],
        sessions=[1],
        max_tokens=8,
        status=Sweep.Status.DONE,
        step=2,
    )
    for step, (context, tps) in enumerate([(256, 90.5), (512, 80.25)]):
        SweepPoint.objects.create(
            sweep=sweep,
            step=step,
            context_target=context,
            sessions=1,
            status="done",
            prompt_tokens=context,
            output_tokens=8,
            decode_tps=tps,
            context_mean=context + 4,
            decoding_together=1,
        )
    return sweep


@pytest.mark.django_db
def test_every_sweep_route_is_staff_only(owner, admin_user, finished_sweep):
    pages = [
        "/monitoring/sweeps/",
        f"/monitoring/sweeps/{finished_sweep.pk}/",
        f"/board/sweeps/{finished_sweep.pk}.csv",
    ]
    posts = ["/board/api/sweeps", f"/board/api/sweeps/{finished_sweep.pk}/cancel"]
    for url in pages:
        assert _client().get(url).status_code == 302  # to the login page
        assert _client(owner).get(url).status_code == 404
        assert _client(admin_user).get(url).status_code == 200
    for url in posts:
        assert _client().post(url).status_code == 401
        assert _client(owner).post(url).status_code == 404
    assert _client(admin_user).get("/monitoring/sweeps/999999/").status_code == 404
    assert _client(admin_user).post("/board/api/sweeps/999999/cancel").status_code == 404


@pytest.mark.django_db
def test_the_sweep_posts_need_the_csrf_token(admin_user, dead_rig, finished_sweep):
    client = _client(admin_user, csrf=True)
    body = {"rig": dead_rig.pk, "model": "m", "contexts": "256", "sessions": "1"}
    assert client.post("/board/api/sweeps", body, content_type="application/json").status_code == 403
    assert client.post(f"/board/api/sweeps/{finished_sweep.pk}/cancel").status_code == 403
    page = client.get("/monitoring/sweeps/")
    token = page.cookies["csrftoken"].value
    answer = client.post("/board/api/sweeps", body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "rig_unreachable"  # past CSRF


@pytest.mark.django_db
def test_the_api_says_what_is_wrong_and_stores_nothing(admin_user, dead_rig):
    client = _client(admin_user)
    bad = client.post("/board/api/sweeps", {"rig": dead_rig.pk, "model": "m", "contexts": "x"}, "application/json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_contexts"
    assert client.post("/board/api/sweeps", "[1]", "application/json").json()["error"]["code"] == "bad_json"
    form = client.post("/board/api/sweeps", {"rig": dead_rig.pk, "model": "m", "contexts": "256", "sessions": "5"})
    assert form.status_code == 400 and form.json()["error"]["code"] == "ladder_past_slots"
    assert not Sweep.objects.exists() and not ChatSession.objects.exists()


@pytest.mark.django_db
def test_a_finished_sweep_cannot_be_cancelled(admin_user, finished_sweep):
    answer = _client(admin_user).post(f"/board/api/sweeps/{finished_sweep.pk}/cancel")
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "sweep_finished"


@pytest.mark.django_db
def test_the_csv_streams_every_point(admin_user, finished_sweep):
    response = _client(admin_user).get(f"/board/sweeps/{finished_sweep.pk}.csv")
    assert response.streaming and response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r["context_target"], r["decode_tps"], r["decoding_together"]) for r in rows] == [
        ("256", "90.5", "1"),
        ("512", "80.25", "1"),
    ]


@pytest.mark.django_db
def test_the_sweep_page_plots_its_points_beside_the_prediction(admin_user, finished_sweep):
    from monitoring.models import RigProfile

    page = _client(admin_user).get(
        f"/monitoring/sweeps/{finished_sweep.pk}/", {"hw": "rtx-4090", "model": "smollm2-135m"}
    )
    config = page.context["page_config"]
    (trace,) = [t for t in config["figures"]["context"]["data"] if t["name"] == config["trace"]]
    assert trace["x"] == [260, 516] and trace["y"] == [90.5, 80.25]
    first, second = config["predicted"]  # each step's own prediction: the longer prompt reads more KV cache
    assert first > second > 0
    # The rig's own figures: no bandwidth known yet, so the page says why there is no prediction.
    bare = _client(admin_user).get(f"/monitoring/sweeps/{finished_sweep.pk}/")
    assert bare.context["page_config"]["figures"] is None and "No prediction" in bare.content.decode()
    # Its measured bandwidth is the rig's own figure (the memory size comes from a sample, or the address).
    RigProfile.objects.create(rig=finished_sweep.rig, bandwidth_gbs=50.0)
    own = _client(admin_user).get(f"/monitoring/sweeps/{finished_sweep.pk}/", {"model": "smollm2-135m", "vram_gib": 64})
    assert own.context["page_config"]["figures"] is not None, own.context["prediction_errors"]
    assert "vram_gbs=50.0" in own.context["calculator_url"]


@pytest.mark.django_db(transaction=True)
async def test_the_sweep_socket_is_staff_only_and_sends_progress(owner, admin_user, dead_rig):
    sweep = await Sweep.objects.acreate(
        rig=dead_rig, owner=admin_user, model_name="m", contexts=[256], sessions=[1, 2], max_tokens=8
    )
    path = f"/ws/monitoring/sweeps/{sweep.pk}/"
    assert (await Socket(path, None).connect()) == (False, 4401)
    owner_cookie = await sync_to_async(session_cookie_for)(owner)
    assert (await Socket(path, owner_cookie).connect()) == (False, 4403)
    cookie = await sync_to_async(session_cookie_for)(admin_user)
    assert (await Socket("/ws/monitoring/sweeps/999999/", cookie).connect()) == (False, 4404)
    assert not (await Socket(path, cookie, origin="http://evil.example").connect())[0]
    sock, board = Socket(path, cookie), BoardSocket(cookie)
    try:
        assert (await sock.connect())[0] and (await board.connect())[0]
        first = await sock.recv()
        assert first["type"] == "sweep.snapshot" and first["sweep"]["steps"] == 2 and first["sweep"]["points"] == []
        snapshot = await board.recv_until(lambda f: f["type"] == "board.snapshot")
        assert [s["id"] for s in snapshot["sweeps"]] == [sweep.pk]
        from inference.turns import sweep_rows

        state = await sync_to_async(sweep_rows.sweep_snapshot)(sweep, points=False)
        point = {"step": 0, "turn": 5, "decode_tps": 50.0}
        await sync_to_async(events.sweep_progress_sync)(sweep=state, points=[point])
        progress = await sock.recv_until(lambda f: f["type"] == "progress")
        assert progress["points"] == [point] and progress["sweep"]["running_step"] == {"context": 256, "sessions": 1}
        on_board = await board.recv_until(lambda f: f["type"] == "sweep")
        assert on_board["sweep"]["id"] == sweep.pk
        await sock.send({"type": "sweep.cancel"})
        assert (await sock.recv_until(lambda f: f["type"] == "error"))["code"] == "read_only"
    finally:
        await sock.close()
        await board.close()


@pytest.mark.django_db
def test_a_demoted_admin_can_neither_start_nor_cancel(dead_rig, finished_sweep):
    demoted = make_user("demoted", is_staff=True)
    client = _client(demoted)
    demoted.is_staff = False
    demoted.save()
    assert client.post(f"/board/api/sweeps/{finished_sweep.pk}/cancel").status_code == 404
    with pytest.raises(InvalidInput) as refused:
        sweeps.sweep_cancel(actor=demoted, sweep_id=finished_sweep.pk)
    assert refused.value.code == "forbidden"


@pytest.mark.django_db
def test_beat_resumes_a_sweep_whose_driver_went_silent(admin_user, dead_rig):
    from datetime import timedelta

    from django.utils import timezone

    silent = Sweep.objects.create(
        rig=dead_rig, owner=admin_user, model_name="m", contexts=[256], sessions=[1], max_tokens=8
    )
    Sweep.objects.filter(pk=silent.pk).update(looked_at=timezone.now() - timedelta(seconds=90))
    other = Rig.objects.create(name="other", kind=Rig.Kind.LLAMACPP, base_url=DEAD_URL, queue="rig.other")
    fresh = Sweep.objects.create(
        rig=other, owner=admin_user, model_name="m", contexts=[256], sessions=[1], max_tokens=8
    )
    assert sweeps.sweeps_resume(silent_s=60) == [silent.pk]  # the one just created is not silent yet
    silent.refresh_from_db()
    assert silent.looked_at > timezone.now() - timedelta(seconds=5)
    assert sweeps.sweeps_resume(silent_s=60) == []  # resumed once, not again while its look is due
    Sweep.objects.filter(pk=fresh.pk).update(status=Sweep.Status.DONE, looked_at=None)
    assert sweeps.sweeps_resume(silent_s=0) == [silent.pk]  # an ended sweep is never resumed
