"""Login throttling (django-axes): per account at one address, a clear message, an admin unlock."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db
LIMIT = 5


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.AXES_FAILURE_LIMIT = LIMIT


def _login(username: str, password: str, address: str = "10.0.0.1") -> int:
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password}).status_code


def test_an_account_is_locked_at_the_failure_limit_from_that_address_only(owner):
    for _ in range(LIMIT - 1):
        assert _login("owner", "wrong", address="10.0.1.1") == 200  # the form again, with its error
    assert _login("owner", "wrong", address="10.0.1.1") == 429  # the failure that reaches the limit locks
    response = Client(REMOTE_ADDR="10.0.1.1").post("/login/", {"username": "owner", "password": "owner-pw-123"})
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    assert "_auth_user_id" not in response.wsgi_request.session
    # The owner elsewhere, and another person at the same address (a NAT, one reverse proxy), still log in.
    assert _login("owner", "owner-pw-123", address="10.0.2.1") == 302


def test_failures_on_one_account_do_not_lock_another_at_the_same_address(owner, other_user):
    """The lockout is per (account, address) pair (AXES_LOCKOUT_PARAMETERS): one user's typos behind a shared
    address lock out no one else there."""
    for _ in range(LIMIT):
        _login("other", "wrong", address="10.9.9.9")
    assert _login("other", "other-pw-123", address="10.9.9.9") == 429
    assert _login("owner", "owner-pw-123", address="10.9.9.9") == 302


def test_a_successful_login_below_the_limit_resets_the_count(owner):
    for _ in range(LIMIT - 1):
        _login("owner", "wrong")
    assert _login("owner", "owner-pw-123") == 302
    for _ in range(LIMIT - 1):
        _login("owner", "wrong")
    assert _login("owner", "owner-pw-123") == 302


def test_an_admin_unlocks_an_account_by_command_or_in_the_admin(owner, admin_user):
    for _ in range(LIMIT):
        _login("owner", "wrong", address="10.0.3.1")
    assert _login("owner", "owner-pw-123", address="10.0.3.1") == 429
    call_command("axes_reset_username", "owner")
    assert _login("owner", "owner-pw-123", address="10.0.3.1") == 302

    for _ in range(LIMIT):
        _login("owner", "wrong", address="10.0.6.1")
    assert _login("owner", "owner-pw-123", address="10.0.6.1") == 429
    admin = Client()
    admin.force_login(admin_user)
    assert admin.get("/admin/axes/accessattempt/").status_code == 200
    from axes.models import AccessAttempt

    ids = [str(pk) for pk in AccessAttempt.objects.filter(username="owner").values_list("pk", flat=True)]
    response = admin.post(
        "/admin/axes/accessattempt/", {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
    )
    assert response.status_code == 302
    assert _login("owner", "owner-pw-123", address="10.0.6.1") == 302
    assert get_user_model().objects.get(username="owner").is_active
