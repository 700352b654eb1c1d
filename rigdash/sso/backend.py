"""The authentication backend for the provider's callback: mozilla-django-oidc's code exchange, signature and nonce
checks, plus the ID token's issuer, audience and expiry (OpenID Connect Core 1.0, section 3.1.3.7), the
userinfo subject, and RigDash's accounts and roles (rigdash.sso.accounts)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from rigdash.sso.accounts import sso_user_sign_in
from rigdash.sso.config import OidcConfig
from rigdash.sso.discovery import provider_metadata
from rigdash.sso.library import callback_url, library_setting

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.http import HttpRequest

CLOCK_SKEW_S = 120


class OidcBackend(OIDCAuthenticationBackend):
    """Signs in the provider's users; answers nothing else (a username and password are ModelBackend's)."""

    get_settings = staticmethod(library_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No network here: Django builds the backends for every authenticate() and get_user() call.
        self.UserModel = get_user_model()

    @property
    def config(self) -> OidcConfig:
        config: OidcConfig = settings.RIGDASH_OIDC
        return config

    @property
    def metadata(self) -> dict[str, Any]:
        return provider_metadata(self.config)

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:
        return str(self.metadata["token_endpoint"])

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:
        return str(self.metadata["userinfo_endpoint"])

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:
        return str(self.metadata["jwks_uri"])

    @property
    def OIDC_RP_CLIENT_ID(self) -> str:
        return self.config.client_id

    @property
    def OIDC_RP_CLIENT_SECRET(self) -> str:
        return self.config.client_secret

    @property
    def OIDC_RP_SIGN_ALGO(self) -> str:
        return self.config.sign_algo

    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        # Only the callback view passes a nonce: a password login's request (even one with ?code= in its URL) is
        # never taken for a provider's answer.
        if request is None or "nonce" not in kwargs or not self.config.enabled:
            return None
        user: User | None = super().authenticate(request, **kwargs)
        return user

    def get_token(self, payload: dict[str, Any]) -> dict[str, Any]:
        payload["redirect_uri"] = callback_url()  # the one sent at the start, from settings, not the Host header
        token: dict[str, Any] = super().get_token(payload)
        return token

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        payload: dict[str, Any] = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if payload.get("iss") != self.metadata["issuer"]:
            raise SuspiciousOperation("ID token from another issuer")
        if self.config.client_id not in audiences:
            raise SuspiciousOperation("ID token for another client")
        if not isinstance(payload.get("exp"), (int, float)) or payload["exp"] < time.time() - CLOCK_SKEW_S:
            raise SuspiciousOperation("ID token expired")
        return payload

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User | None:
        claims = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(claims, dict) or claims.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("userinfo names another subject than the ID token")
        return sso_user_sign_in(config=self.config, issuer=self.metadata["issuer"], claims={**payload, **claims})

    def get_user(self, user_id: int) -> User | None:
        user: User | None = self.UserModel.objects.filter(pk=user_id).first()
        return user
