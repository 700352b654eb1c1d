"""Roles: superuser > staff > user. Nobody changes the role or active state of someone at or above their own role,
creating admins needs a superuser, and the last active superuser stays (the board's actions and Django's admin)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from inference import errors
from inference.board import actions
from tests.adminkit import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def boss(db) -> User:
    return make_user("boss", is_staff=True, is_superuser=True)


@pytest.fixture
def staff(db) -> User:
    user = make_user("staffer", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_user", "change_user", "delete_user"]))
    return User.objects.get(pk=user.pk)  # a fresh copy: the permission cache is empty


@pytest.mark.parametrize(
    "action",
    [
        lambda actor, user: actions.user_set_active(actor=actor, user=user, active=False),
        lambda actor, user: actions.user_set_staff(actor=actor, user=user, staff=False),
        lambda actor, user: actions.user_set_groups(actor=actor, user=user, groups=[]),
    ],
)
def test_staff_cannot_change_a_superuser_or_another_staff_member(boss, staff, action):
    peer = make_user("peer", is_staff=True)
    for target in (boss, peer):
        with pytest.raises(errors.InvalidInput) as info:
            action(staff, target)
        assert info.value.code == "forbidden"
    boss.refresh_from_db()
    peer.refresh_from_db()
    assert boss.is_active and boss.is_staff and boss.is_superuser and peer.is_active and peer.is_staff


def test_staff_can_still_deactivate_and_reactivate_an_ordinary_user(staff):
    user = make_user("plain")
    assert not actions.user_set_active(actor=staff, user=user, active=False).is_active
    assert actions.user_set_active(actor=staff, user=user, active=True).is_active


def test_only_a_superuser_creates_or_promotes_admins(boss, staff):
    with pytest.raises(errors.InvalidInput):
        actions.user_create(actor=staff, username="newadmin", password="a-Long-pass-123", is_staff=True)
    plain = make_user("plain")
    with pytest.raises(errors.InvalidInput):
        actions.user_set_staff(actor=staff, user=plain, staff=True)
    assert not User.objects.filter(username="newadmin").exists()
    assert not User.objects.get(pk=plain.pk).is_staff
    assert actions.user_create(actor=boss, username="newadmin", password="a-Long-pass-123", is_staff=True).is_staff
    assert actions.user_set_staff(actor=boss, user=plain, staff=True).is_staff


def test_a_superuser_cannot_demote_or_deactivate_another_superuser_or_themselves(boss):
    other = make_user("boss2", is_staff=True, is_superuser=True)
    for change in (
        lambda: actions.user_set_active(actor=boss, user=other, active=False),
        lambda: actions.user_set_staff(actor=boss, user=other, staff=False),
        lambda: actions.user_set_active(actor=boss, user=boss, active=False),
        lambda: actions.user_set_staff(actor=boss, user=boss, staff=False),
    ):
        with pytest.raises(errors.InvalidInput):
            change()
    assert User.objects.filter(is_superuser=True, is_active=True).count() == 2


def _admin_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _change_form(user: User, **changes: object) -> dict[str, object]:
    form: dict[str, object] = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }
    flags = {"is_active": user.is_active, "is_staff": user.is_staff, "is_superuser": user.is_superuser}
    flags.update(changes)  # type: ignore[arg-type]
    form.update({name: "on" for name, value in flags.items() if value})
    return form


def test_in_django_admin_staff_cannot_edit_a_superuser_nor_raise_their_own_role(boss, staff):
    client = _admin_client(staff)
    response = client.post(f"/admin/auth/user/{boss.pk}/change/", _change_form(boss, is_active=False, is_staff=False))
    assert response.status_code == 403
    client.post(f"/admin/auth/user/{staff.pk}/change/", _change_form(staff, is_superuser=True))
    boss.refresh_from_db()
    staff.refresh_from_db()
    assert boss.is_active and boss.is_staff and boss.is_superuser
    assert not staff.is_superuser
    assert client.post(f"/admin/auth/user/{boss.pk}/delete/", {"post": "yes"}).status_code == 403
    assert User.objects.filter(pk=boss.pk).exists()


def test_in_django_admin_the_last_active_superuser_cannot_leave_the_role(boss):
    client = _admin_client(boss)
    client.post(f"/admin/auth/user/{boss.pk}/change/", _change_form(boss, is_superuser=False, is_active=False))
    boss.refresh_from_db()
    assert boss.is_superuser and boss.is_active
    assert client.post(f"/admin/auth/user/{boss.pk}/delete/", {"post": "yes"}).status_code == 403
