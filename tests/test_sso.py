"""Single sign-on against a real OpenID provider (node's certified oidc-provider, started by the test): sign-in lands
with the role the provider's groups map to, group changes apply at the next sign-in, a disabled or inactive user is
refused, logout ends both sessions, and local accounts can be switched off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client

from rigdash.sso.config import OidcConfig, authentication_backends
from rigdash.sso.discovery import forget_provider_metadata
from rigdash.sso.models import ExternalIdentity
from tests.oidckit import CLIENT_ID, CLIENT_SECRET, PUBLIC_URL, Provider, oidc_provider, walk_provider

__all__ = ["oidc_provider"]  # the session fixture, imported so pytest finds it here

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture
def provider(oidc_provider: Provider, settings: Any) -> Provider:
    """RigDash pointed at the provider: groups rigdash-users, rigdash-staff, rigdash-admins and the subject "root"."""
    settings.RIGDASH_OIDC = OidcConfig(
        discovery_url=f"{oidc_provider.issuer}/.well-known/openid-configuration",
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        public_url=PUBLIC_URL,
        provider_name="TestID",
        user_groups=frozenset({"rigdash-users"}),
        staff_groups=frozenset({"rigdash-staff"}),
        superuser_groups=frozenset({"rigdash-admins"}),
        superuser_subjects=frozenset({"root"}),
    )
    settings.AUTHENTICATION_BACKENDS = authentication_backends(settings.RIGDASH_OIDC)
    forget_provider_metadata()
    yield oidc_provider
    forget_provider_metadata()


def sign_in(provider: Provider, sub: str, *, client: Client | None = None, browser: httpx.Client | None = None):
    """The whole sign-in as a browser makes it: RigDash -> provider's login form -> RigDash's callback."""
    client = client or Client()
    start = client.get("/login/sso/")
    assert start.status_code == 302, start
    if browser is None:
        with httpx.Client() as own:
            back = walk_provider(own, start["Location"], username=sub, password=provider.password(sub))
    else:
        back = walk_provider(browser, start["Location"], username=sub, password=provider.password(sub))
    return client, client.get(back)


def signed_in_user(client: Client) -> Any:
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id) if user_id else None


def role_of(user: Any) -> str:
    return "superuser" if user.is_superuser else "staff" if user.is_staff else "user"


@pytest.mark.parametrize(
    ("sub", "groups", "role"),
    [
        ("alice", ["rigdash-users"], "user"),
        ("bob", ["rigdash-users", "rigdash-staff"], "staff"),
        ("carol", ["rigdash-admins"], "superuser"),
        ("root", ["rigdash-users"], "superuser"),  # by subject, RIGDASH_OIDC_SUPERUSER_SUBJECTS
    ],
)
def test_sign_in_lands_with_the_role_the_groups_map_to(provider, sub, groups, role):
    provider.set_account(sub, groups=groups)
    client, response = sign_in(provider, sub)
    assert response.status_code == 302 and response["Location"] == "/"
    user = signed_in_user(client)
    assert user.username == sub and user.email == f"{sub}@idp.test" and role_of(user) == role
    assert not user.has_usable_password()  # an account the provider made has no local password
    assert ExternalIdentity.objects.get(user=user).subject == sub
    assert client.get("/").status_code == 200


def test_someone_in_no_mapped_group_is_refused(provider):
    provider.set_account("mallory", groups=["marketing"])
    client, response = sign_in(provider, "mallory")
    assert response["Location"] == "/login/"
    assert signed_in_user(client) is None and not User.objects.filter(username="mallory").exists()
    assert b"TestID sign-in was refused" in client.get("/login/").content
    assert AccessAttempt.objects.filter(ip_address="127.0.0.1").exists()  # it counts towards the login throttle


def test_group_changes_take_effect_at_the_next_sign_in(provider):
    provider.set_account("dana", groups=["rigdash-users", "rigdash-staff"])
    client, _ = sign_in(provider, "dana")
    assert role_of(signed_in_user(client)) == "staff"

    provider.set_account("dana", groups=["rigdash-users"])  # removed from the staff group at the provider
    client, _ = sign_in(provider, "dana")
    assert role_of(signed_in_user(client)) == "user"

    provider.set_account("dana", groups=["rigdash-admins"])
    client, _ = sign_in(provider, "dana")
    assert role_of(signed_in_user(client)) == "superuser"

    provider.set_account("dana", groups=[])  # out of every group: refused, and the account keeps no role
    client, response = sign_in(provider, "dana")
    assert signed_in_user(client) is None and response["Location"] == "/login/"
    assert User.objects.filter(username="dana").count() == 1


def test_a_user_disabled_at_the_provider_is_refused(provider):
    provider.set_account("erin", groups=["rigdash-users"])
    client, _ = sign_in(provider, "erin")
    assert signed_in_user(client).username == "erin"

    provider.set_account("erin", disabled=True)
    client, response = sign_in(provider, "erin")
    assert response["Location"] == "/login/" and signed_in_user(client) is None
    assert b"TestID sign-in was refused" in client.get("/login/").content


def test_an_account_inactive_in_rigdash_is_refused(provider):
    provider.set_account("frank", groups=["rigdash-staff"])
    sign_in(provider, "frank")
    User.objects.filter(username="frank").update(is_active=False)
    client, response = sign_in(provider, "frank")
    assert response["Location"] == "/login/" and signed_in_user(client) is None
    assert not User.objects.get(username="frank").is_active


def test_an_admin_sees_which_subject_signs_in_as_which_account(provider, admin_user):
    provider.set_account("jo", groups=["rigdash-users"])
    sign_in(provider, "jo")
    client = Client()
    client.force_login(admin_user, backend="django.contrib.auth.backends.ModelBackend")
    page = client.get("/admin/sso/externalidentity/")
    assert page.status_code == 200 and b"jo at http://127.0.0.1:" in page.content


def test_a_local_account_with_the_same_name_is_not_taken_over(provider, admin_user):
    provider.set_account("admin", groups=["rigdash-users"])  # the provider's "admin" is not RigDash's admin
    client, _ = sign_in(provider, "admin")
    user = signed_in_user(client)
    assert user.pk != admin_user.pk and user.username.startswith("admin-") and role_of(user) == "user"
    admin_user.refresh_from_db()
    assert admin_user.is_superuser and admin_user.has_usable_password()


def test_logout_ends_the_session_here_and_at_the_provider(provider):
    provider.set_account("gina", groups=["rigdash-users"])
    with httpx.Client() as browser:
        client, _ = sign_in(provider, "gina", browser=browser)
        again = client.get("/login/sso/")["Location"]
        assert walk_provider(browser, again).startswith("/login/sso/callback/?code=")  # the provider's session: no form
        response = client.post("/logout/")
        assert signed_in_user(client) is None
        assert client.get("/")["Location"].startswith("/login/")
        end = urlsplit(response["Location"])
        assert f"{end.scheme}://{end.netloc}" == provider.issuer and end.path == "/session/end"
        query = parse_qs(end.query)
        assert query["post_logout_redirect_uri"] == [f"{PUBLIC_URL}/login/"] and query["id_token_hint"]
        assert walk_provider(browser, response["Location"]) == "/login/"  # the provider ended its session

        # So the provider asks for the password again (its session is gone): a wrong one is refused there.
        start = client.get("/login/sso/")
        with pytest.raises(AssertionError, match="401"):
            walk_provider(browser, start["Location"], username="gina", password="not-the-password")


def test_a_local_session_logs_out_without_the_provider(provider, owner):
    client = Client()
    client.force_login(owner, backend="django.contrib.auth.backends.ModelBackend")
    response = client.post("/logout/")
    assert response["Location"] == "/login/" and signed_in_user(client) is None


def test_the_login_page_offers_the_provider_and_the_local_form(provider, owner):
    page = Client().get("/login/").content.decode()
    assert "Sign in with TestID" in page and 'name="password"' in page
    client = Client()
    assert client.post("/login/", {"username": "owner", "password": "owner-pw-123"}).status_code == 302
    assert signed_in_user(client) == owner


def test_local_accounts_switched_off(provider, settings, owner, admin_user):
    settings.RIGDASH_OIDC = replace(settings.RIGDASH_OIDC, local_login=False)
    settings.AUTHENTICATION_BACKENDS = authentication_backends(settings.RIGDASH_OIDC)
    page = Client().get("/login/").content.decode()
    assert "Sign in with TestID" in page and 'name="password"' not in page

    client = Client()
    response = client.post("/login/", {"username": "owner", "password": "owner-pw-123"})
    assert response.status_code == 403 and signed_in_user(client) is None
    assert b"Local accounts are switched off" in response.content
    admin_page = Client().get("/admin/login/?next=/admin/")
    assert admin_page.status_code == 302 and admin_page["Location"] == "/login/?next=%2Fadmin%2F"
    assert Client().post("/admin/login/", {"username": "admin", "password": "admin-pw-123"}).status_code == 302
    assert signed_in_user(client) is None

    # A session a local account opened before is no longer anyone's.
    local = Client()
    local.force_login(admin_user, backend="django.contrib.auth.backends.ModelBackend")
    assert local.get("/")["Location"].startswith("/login/")

    provider.set_account("hana", groups=["rigdash-users"])
    client, _ = sign_in(provider, "hana")
    assert signed_in_user(client).username == "hana" and client.get("/").status_code == 200


def test_the_redirect_uri_comes_from_settings_with_state_nonce_and_pkce(provider):
    start = Client(HTTP_HOST="localhost").get("/login/sso/?next=/usage/")
    query = parse_qs(urlsplit(start["Location"]).query)
    assert query["redirect_uri"] == [f"{PUBLIC_URL}/login/sso/callback/"]
    assert query["client_id"] == [CLIENT_ID] and query["response_type"] == ["code"]
    assert query["state"] and query["nonce"] and query["code_challenge_method"] == ["S256"]
    assert "groups" in query["scope"][0].split()


def test_next_is_kept_and_a_callback_is_good_once(provider):
    provider.set_account("ivan", groups=["rigdash-users"])
    client = Client()
    start = client.get("/login/sso/?next=/usage/")
    with httpx.Client() as browser:
        back = walk_provider(browser, start["Location"], username="ivan", password=provider.password("ivan"))
    assert client.get(back)["Location"] == "/usage/"
    assert client.get(back).status_code == 400  # the state is used up: a replayed answer is refused
    client.post("/logout/")
    assert client.get(back)["Location"] == "/login/" and signed_in_user(client) is None


def test_a_callback_with_a_state_this_browser_never_sent_is_refused(provider):
    client = Client()
    client.get("/login/sso/")
    response = client.get("/login/sso/callback/?code=forged&state=not-ours")
    assert response.status_code == 400 and signed_in_user(client) is None


def test_a_provider_that_does_not_answer_is_said_on_the_login_page(provider, settings):
    settings.RIGDASH_OIDC = replace(settings.RIGDASH_OIDC, discovery_url=f"{provider.issuer}/nowhere/.well-known/x")
    client = Client()
    assert client.get("/login/sso/")["Location"] == "/login/"
    assert b"TestID cannot be reached" in client.get("/login/").content


def test_pages_may_post_to_the_provider_for_its_logout(provider):
    policy = Client().get("/login/")["Content-Security-Policy"]
    assert f"form-action 'self' {provider.issuer}" in policy


def test_without_a_provider_the_sso_routes_are_404_and_the_page_has_no_button(settings):
    settings.RIGDASH_OIDC = OidcConfig()
    assert Client().get("/login/sso/").status_code == 404
    assert Client().get("/login/sso/callback/?code=x&state=y").status_code == 404
    assert b"Sign in with" not in Client().get("/login/").content
