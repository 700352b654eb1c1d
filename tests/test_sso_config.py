"""Single sign-on's settings and role mapping, as plain data: no provider, no database."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from rigdash.access import ROLE_STAFF, ROLE_SUPERUSER, ROLE_USER
from rigdash.middleware import CSP, csp_with_form_action
from rigdash.sso.config import OidcConfig, authentication_backends, discovery_url_of, oidc_config_from_env
from rigdash.sso.roles import groups_of, role_for

MAPPED = OidcConfig(
    discovery_url="https://id.example/.well-known/openid-configuration",
    user_groups=frozenset({"users"}),
    staff_groups=frozenset({"staff"}),
    superuser_groups=frozenset({"admins"}),
    superuser_subjects=frozenset({"sub-root"}),
)


@pytest.mark.parametrize(
    ("subject", "groups", "role"),
    [
        ("a", ["users"], ROLE_USER),
        ("a", ["users", "staff"], ROLE_STAFF),
        ("a", ["staff"], ROLE_STAFF),  # a staff group lets them in without the user group
        ("a", ["admins"], ROLE_SUPERUSER),
        ("sub-root", [], ROLE_SUPERUSER),
        ("a", ["other"], None),
        ("a", [], None),
    ],
)
def test_groups_and_subjects_map_to_roles(subject, groups, role):
    assert role_for(MAPPED, subject=subject, groups=groups) == role


def test_without_user_groups_anyone_signed_in_is_a_user_and_never_more_by_default():
    assert role_for(OidcConfig(discovery_url="x"), subject="anyone", groups=["admins", "staff"]) == ROLE_USER


def test_groups_claim_takes_a_list_or_one_name():
    assert groups_of({"groups": ["a", 3, "b"]}, "groups") == ["a", "b"]
    assert groups_of({"roles": "staff"}, "roles") == ["staff"]
    assert groups_of({"groups": {"a": 1}}, "groups") == [] and groups_of({}, "groups") == []


def test_the_issuer_or_its_discovery_url_names_the_document():
    wanted = "https://id.example/realms/lab/.well-known/openid-configuration"
    assert discovery_url_of("https://id.example/realms/lab/") == wanted
    assert discovery_url_of(wanted) == wanted
    assert discovery_url_of("") == ""


@pytest.fixture
def oidc_env(monkeypatch):
    for name, value in {
        "RIGDASH_OIDC_ISSUER": "https://auth.example/application/o/rigdash/",
        "RIGDASH_OIDC_CLIENT_ID": "rigdash",
        "RIGDASH_OIDC_CLIENT_SECRET": "s3cret",
        "RIGDASH_PUBLIC_URL": "https://rig.example/",
        "RIGDASH_OIDC_STAFF_GROUPS": "rig-admins, ops",
        "RIGDASH_OIDC_SCOPES": "openid,email  profile",
    }.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_the_environment_configures_a_provider(oidc_env):
    config = oidc_config_from_env()
    assert config.discovery_url == "https://auth.example/application/o/rigdash/.well-known/openid-configuration"
    assert config.public_url == "https://rig.example" and config.staff_groups == {"rig-admins", "ops"}
    assert config.scopes == "openid email profile" and config.local_login
    assert config.provider_origin == "https://auth.example"


def test_the_client_secret_may_come_from_a_file(oidc_env, tmp_path):
    (tmp_path / "secret").write_text("from-a-file\n")
    oidc_env.delenv("RIGDASH_OIDC_CLIENT_SECRET")
    oidc_env.setenv("RIGDASH_OIDC_CLIENT_SECRET_FILE", str(tmp_path / "secret"))
    assert oidc_config_from_env().client_secret == "from-a-file"


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("RIGDASH_OIDC_CLIENT_ID", "", "RIGDASH_OIDC_CLIENT_ID"),
        ("RIGDASH_PUBLIC_URL", "", "RIGDASH_PUBLIC_URL"),
        ("RIGDASH_PUBLIC_URL", "rig.example", "must be an http"),
        ("RIGDASH_OIDC_SCOPES", "email profile", "openid"),
    ],
)
def test_a_half_configured_provider_fails_loudly(oidc_env, name, value, says):
    oidc_env.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=says):
        oidc_config_from_env()


def test_local_login_off_without_a_provider_is_refused(monkeypatch):
    monkeypatch.delenv("RIGDASH_OIDC_ISSUER", raising=False)
    monkeypatch.setenv("RIGDASH_LOCAL_LOGIN", "0")
    with pytest.raises(ImproperlyConfigured, match="nobody could log in"):
        oidc_config_from_env()


def test_passwords_are_checked_only_while_local_accounts_are_on():
    on = authentication_backends(OidcConfig())
    off = authentication_backends(OidcConfig(discovery_url="x", local_login=False))
    assert "django.contrib.auth.backends.ModelBackend" in on and "django.contrib.auth.backends.ModelBackend" not in off
    assert on[0] == off[0] == "axes.backends.AxesStandaloneBackend"


def test_without_a_provider_the_pages_post_only_to_rigdash():
    assert csp_with_form_action("") == CSP and "form-action 'self';" in CSP
