"""mozilla-django-oidc's settings, answered from ``settings.RIGDASH_OIDC`` and the provider's discovery document:
its views and backend read every setting through ``get_settings``, which RigDash's subclasses point here."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse
from mozilla_django_oidc.utils import import_from_settings

from rigdash.sso.config import OidcConfig
from rigdash.sso.discovery import provider_metadata

CALLBACK_ROUTE = "sso_callback"


def oidc_config() -> OidcConfig:
    config: OidcConfig = settings.RIGDASH_OIDC
    return config


def callback_url() -> str:
    """The redirect URI: RIGDASH_PUBLIC_URL and the callback's path, never the request's Host header."""
    return oidc_config().public_url + reverse(CALLBACK_ROUTE)


def library_setting(attr: str, *default: Any) -> Any:
    config = oidc_config()
    fixed: dict[str, Any] = {
        "OIDC_RP_CLIENT_ID": config.client_id,
        "OIDC_RP_CLIENT_SECRET": config.client_secret,
        "OIDC_RP_SCOPES": config.scopes,
        "OIDC_RP_SIGN_ALGO": config.sign_algo,
        "OIDC_TIMEOUT": config.timeout_s,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_STORE_ID_TOKEN": True,  # the id_token_hint of the provider's logout
        "OIDC_AUTHENTICATION_CALLBACK_URL": CALLBACK_ROUTE,
        "OIDC_REDIRECT_FIELD_NAME": "next",
    }
    if attr in fixed:
        return fixed[attr]
    if attr == "OIDC_OP_AUTHORIZATION_ENDPOINT":
        return provider_metadata(config)["authorization_endpoint"]
    if attr == "OIDC_TOKEN_USE_BASIC_AUTH":
        # client_secret_basic is the default where the provider names no method (OpenID Connect Discovery 1.0).
        methods = provider_metadata(config).get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        return "client_secret_basic" in methods
    return import_from_settings(attr, *default)
