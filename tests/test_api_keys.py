"""Per-user API keys: created on the user's own page and shown once, stored only as a hash, listed and revoked by
their owner (staff: anyone's, audited), and the bearer authentication the /v1/ API uses."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from inference.board import apikeys
from inference.models import ApiKey, AuditLog

pytestmark = pytest.mark.django_db


def _client(user=None, **kwargs):
    client = Client(**kwargs)
    if user is not None:
        client.force_login(user)
    return client


def _create(client, name="laptop editor", expires=""):
    return client.post("/keys/", {"name": name, "expires_in_days": expires})


def _secret(response) -> str:
    found = re.search(r'data-testid="new-key-secret">(rdk_[A-Za-z0-9_-]+)<', response.content.decode())
    assert found, response.content.decode()[:2000]
    return found.group(1)


def test_a_key_is_shown_once_and_stored_only_as_its_hash(owner):
    client = _client(owner)
    response = _create(client, expires="30")
    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    secret = _secret(response)
    assert apikeys.KEY_RE.fullmatch(secret)
    key = ApiKey.objects.get()
    assert key.owner == owner and key.name == "laptop editor" and key.prefix == secret[:12]
    assert key.key_sha256 == apikeys.key_digest(secret)
    assert timedelta(days=29, hours=23) < key.expires_at - timezone.now() <= timedelta(days=30)
    stored = [str(value) for value in ApiKey.objects.values().get().values()]
    assert not any(secret in value or secret[12:] in value for value in stored)
    page = client.get("/keys/").content.decode()
    assert secret not in page and f"{secret[:12]}…" in page and "laptop editor" in page
    assert apikeys.api_key_authenticate(f"Bearer {secret}").pk == key.pk


@pytest.mark.parametrize(
    ("data", "message"),
    [({"name": ""}, "This field is required"), ({"name": "x", "expires_in_days": "0"}, "greater than or equal to 1"),
     ({"name": "x" * 101}, "at most 100"), ({"name": "x", "expires_in_days": "soon"}, "whole number")],
)  # fmt: skip
def test_bad_input_is_refused_and_nothing_is_stored(owner, data, message):
    response = _client(owner).post("/keys/", data)
    assert response.status_code == 400 and message in response.content.decode()
    assert not ApiKey.objects.exists()
    with pytest.raises(apikeys.InvalidInput):
        apikeys.api_key_create(owner=owner, name="   ")


def test_active_keys_are_capped_per_user(owner, monkeypatch):
    monkeypatch.setattr(apikeys, "MAX_KEYS_PER_USER", 2)
    first = apikeys.api_key_create(owner=owner, name="a")
    apikeys.api_key_create(owner=owner, name="b")
    response = _create(_client(owner))
    assert response.status_code == 400 and "revoke one first" in response.content.decode()
    apikeys.api_key_revoke(key_id=first.key.pk, actor=owner)
    assert _create(_client(owner)).status_code == 201


def test_the_page_needs_login_and_csrf(owner):
    assert _client().get("/keys/").status_code == 302
    assert _client().post("/keys/", {"name": "x"}).status_code == 302
    assert _create(_client(owner, enforce_csrf_checks=True)).status_code == 403
    key = apikeys.api_key_create(owner=owner, name="a").key
    assert _client(owner, enforce_csrf_checks=True).post(f"/keys/{key.pk}/revoke").status_code == 403
    assert _client(owner).get(f"/keys/{key.pk}/revoke").status_code == 405
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None


def test_the_other_user_cannot_see_or_revoke_the_owners_key(owner, other_user):
    new = apikeys.api_key_create(owner=owner, name="owner's key")
    assert "owner&#x27;s key" not in _client(other_user).get("/keys/").content.decode()
    assert _client(other_user).post(f"/keys/{new.key.pk}/revoke").status_code == 404
    assert _client(other_user).post("/keys/999999/revoke").status_code == 404
    assert apikeys.api_key_authenticate(f"Bearer {new.secret}").pk == new.key.pk


def test_the_owner_revokes_and_the_key_stops_working(owner):
    new = apikeys.api_key_create(owner=owner, name="a")
    response = _client(owner).post(f"/keys/{new.key.pk}/revoke")
    assert response.status_code == 302
    key = ApiKey.objects.get(pk=new.key.pk)
    assert key.revoked_at is not None and key.revoked_by == owner
    with pytest.raises(apikeys.KeyRejected, match="revoked"):
        apikeys.api_key_authenticate(f"Bearer {new.secret}")
    assert not AuditLog.objects.exists()  # one's own key: not an admin action


def test_staff_see_and_revoke_anyones_key_audited(owner, admin_user):
    new = apikeys.api_key_create(owner=owner, name="owner's key")
    page = _client(admin_user).get("/keys/").content.decode()
    assert 'data-testid="all-keys"' in page and "owner&#x27;s key" in page
    assert 'data-testid="all-keys"' not in _client(owner).get("/keys/").content.decode()
    assert _client(admin_user).post(f"/keys/{new.key.pk}/revoke").status_code == 302
    assert ApiKey.objects.get(pk=new.key.pk).revoked_by == admin_user
    entry = AuditLog.objects.get()
    assert (entry.action, entry.target, entry.detail["owner"]) == ("apikey.revoke", f"apikey:{new.key.pk}", "owner")
    assert "(by admin)" in _client(owner).get("/keys/").content.decode()


def test_authentication_rejects_every_bad_key(owner):
    new = apikeys.api_key_create(owner=owner, name="a", expires_in_days=1)
    for header in ("", "Bearer", "Basic abc", f"Token {new.secret}", "Bearer rdk_short", f"Bearer {new.secret}x",
                   "Bearer rdk_" + "A" * 43):  # fmt: skip
        with pytest.raises(apikeys.KeyRejected):
            apikeys.api_key_authenticate(header)
    ApiKey.objects.filter(pk=new.key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(apikeys.KeyRejected, match="expired"):
        apikeys.api_key_authenticate(f"Bearer {new.secret}")
    other = apikeys.api_key_create(owner=owner, name="b")
    owner.is_active = False
    owner.save()
    with pytest.raises(apikeys.KeyRejected, match="deactivated"):
        apikeys.api_key_authenticate(f"Bearer {other.secret}")


def test_last_used_is_written_at_most_once_a_minute(owner, django_assert_num_queries):
    new = apikeys.api_key_create(owner=owner, name="a")
    with django_assert_num_queries(2):  # the lookup and the first use
        apikeys.api_key_authenticate(f"Bearer {new.secret}")
    first = ApiKey.objects.get(pk=new.key.pk).last_used_at
    with django_assert_num_queries(1):  # the lookup only
        apikeys.api_key_authenticate(f"bearer {new.secret}")
    assert ApiKey.objects.get(pk=new.key.pk).last_used_at == first is not None
