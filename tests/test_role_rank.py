"""Nobody acts on someone at or above their role (superuser > staff > user), by every board route: quotas, API keys,
sessions (deactivate), turns (HTTP and the board's socket) and roles. Staff get a 403 (an error frame on the socket)
and nothing changes; a superuser may act on staff. The one rule is ``rigdash.access.may_act_on``."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from django.test import Client

from inference.board import apikeys
from inference.models import ApiKey, ChatSession, Quota, Rig, Turn
from tests.adminkit import make_user
from tests.conftest import session_cookie_for
from tests.wsclient import BoardSocket

pytestmark = pytest.mark.django_db


@pytest.fixture
def boss(db) -> User:
    return make_user("boss", is_staff=True, is_superuser=True)


@pytest.fixture
def staff(db) -> User:
    return make_user("staffer", is_staff=True)


@pytest.fixture
def peer(db) -> User:
    return make_user("peer", is_staff=True)


def _client(user: User) -> Client:
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


def _queued_turn(user: User) -> Turn:
    rig = Rig.objects.get_or_create(
        name="quiet", defaults={"kind": "llamacpp", "base_url": "http://127.0.0.1:9", "queue": "rig.nobody-listens"}
    )[0]
    session = ChatSession.objects.create(owner=user, rig=rig, model_name="m")
    return Turn.objects.create(session=session, user_text="hello")


# Each action: (do it as actor on target -> response status, did it happen to target?)
def _quota_set(actor: User, target: User) -> tuple[int, bool]:
    response = _client(actor).post("/board/quotas/", {"user": target.pk, "max_concurrent_turns": 1})
    return response.status_code, Quota.objects.filter(user=target).exists()


def _quota_delete(actor: User, target: User) -> tuple[int, bool]:
    quota = Quota.objects.create(user=target, max_concurrent_turns=5)
    response = _client(actor).post(f"/board/quotas/{quota.pk}/delete")
    return response.status_code, not Quota.objects.filter(pk=quota.pk).exists()


def _key_revoke(actor: User, target: User) -> tuple[int, bool]:
    key = apikeys.api_key_create(owner=target, name="tool").key
    response = _client(actor).post(f"/keys/{key.pk}/revoke")
    return response.status_code, ApiKey.objects.get(pk=key.pk).revoked_at is not None


def _end_sessions(actor: User, target: User) -> tuple[int, bool]:
    response = _client(actor).post(f"/board/users/{target.pk}/", {"action": "deactivate"})
    return response.status_code, not User.objects.get(pk=target.pk).is_active


def _turn_cancel(actor: User, target: User) -> tuple[int, bool]:
    turn = _queued_turn(target)
    response = _client(actor).post(f"/board/api/turns/{turn.pk}/cancel")
    return response.status_code, Turn.objects.get(pk=turn.pk).status == "cancelled"


def _demote(actor: User, target: User) -> tuple[int, bool]:
    response = _client(actor).post(f"/board/users/{target.pk}/", {"action": "demote"})
    return response.status_code, not User.objects.get(pk=target.pk).is_staff


def _groups(actor: User, target: User) -> tuple[int, bool]:
    group = Group.objects.get_or_create(name="team")[0]
    response = _client(actor).post(f"/board/users/{target.pk}/", {"action": "groups", "groups": [group.pk]})
    return response.status_code, User.objects.get(pk=target.pk).groups.filter(pk=group.pk).exists()


ACTIONS = [_quota_set, _quota_delete, _key_revoke, _end_sessions, _turn_cancel, _demote, _groups]


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.__name__.strip("_"))
def test_staff_cannot_act_on_a_superuser(action, staff, boss):
    status, happened = action(staff, boss)
    assert (status, happened) == (403, False)


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.__name__.strip("_"))
def test_staff_cannot_act_on_another_staff(action, staff, peer):
    status, happened = action(staff, peer)
    assert (status, happened) == (403, False)


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: a.__name__.strip("_"))
def test_superuser_can_act_on_staff(action, boss, peer):
    status, happened = action(boss, peer)
    assert status in (200, 202, 302) and happened


@pytest.mark.parametrize("action", [_quota_set, _key_revoke, _turn_cancel], ids=lambda a: a.__name__.strip("_"))
def test_staff_can_still_act_on_an_ordinary_user(action, staff, owner):
    status, happened = action(staff, owner)
    assert status in (200, 202, 302) and happened


def test_staff_may_cancel_their_own_turn_and_revoke_their_own_key(staff):
    assert _turn_cancel(staff, staff)[1] and _key_revoke(staff, staff)[1]


def test_the_default_quota_and_a_group_with_staff_in_it_are_a_superusers(staff, boss, owner):
    team = Group.objects.create(name="team")
    team.user_set.add(owner, boss)
    assert _client(staff).post("/board/quotas/", {"max_concurrent_turns": 1}).status_code == 403
    assert _client(staff).post("/board/quotas/", {"group": team.pk, "max_concurrent_turns": 1}).status_code == 403
    assert not Quota.objects.exists()
    assert _client(boss).post("/board/quotas/", {"group": team.pk, "max_concurrent_turns": 1}).status_code == 302


def test_staff_cannot_move_a_users_quota_onto_a_superuser(staff, boss, owner):
    quota = Quota.objects.create(user=owner, max_concurrent_turns=5)
    response = _client(staff).post(f"/board/quotas/{quota.pk}/", {"user": boss.pk, "max_concurrent_turns": 1})
    assert response.status_code == 403
    quota.refresh_from_db()
    assert (quota.user_id, quota.max_concurrent_turns) == (owner.pk, 5)


def test_in_django_admin_staff_cannot_set_a_superusers_quota(staff, boss):
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(*Permission.objects.filter(codename__in=["add_quota", "change_quota"]))
    response = _client(User.objects.get(pk=staff.pk)).post(
        "/admin/inference/quota/add/", {"user": boss.pk, "max_concurrent_turns": 1}
    )
    assert response.status_code == 403 and not Quota.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_staff_cannot_cancel_a_superusers_turn_on_the_board_socket(staff, boss):
    turn = await sync_to_async(_queued_turn)(boss)
    sock = BoardSocket(await sync_to_async(session_cookie_for)(staff))
    try:
        assert (await sock.connect())[0]
        await sock.recv()  # the snapshot
        await sock.send({"type": "turn.cancel", "turn": turn.pk})
        frame = await sock.recv()
        assert (frame["type"], frame["code"]) == ("error", "forbidden") and "role" in frame["message"]
    finally:
        await sock.close()
    assert (await Turn.objects.aget(pk=turn.pk)).status == "queued"
