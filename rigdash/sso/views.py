"""The login page (local form and "Sign in with <provider>"), the provider's sign-in start and callback, and logout
(RigDash's session, then the provider's where it offers RP-initiated logout)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import requests
from django.contrib import admin, messages
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from django.views.generic import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from rigdash.sso.discovery import ProviderUnavailable, provider_metadata
from rigdash.sso.library import callback_url, library_setting, oidc_config

logger = logging.getLogger(__name__)


class LoginView(auth_views.LoginView):
    """Django's login page, with the provider's button; the password form only while local accounts are on."""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        config = oidc_config()
        context: dict[str, Any] = super().get_context_data(**kwargs)
        context.update(sso_enabled=config.enabled, sso_name=config.provider_name, local_login=config.local_login)
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not oidc_config().local_login:
            messages.error(request, "Local accounts are switched off: sign in through the provider.")
            return self.render_to_response(self.get_context_data(), status=403)
        return super().post(request, *args, **kwargs)


def admin_login(request: HttpRequest) -> HttpResponse:
    """Django admin's own password form, or RigDash's login page while local accounts are off."""
    if oidc_config().local_login:
        return admin.site.login(request)
    return redirect(f"{reverse('login')}?{urlencode({'next': request.GET.get('next', reverse('admin:index'))})}")


class SsoLoginView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider with the library's state, nonce and PKCE challenge in the session."""

    get_settings = staticmethod(library_setting)

    def __init__(self, **kwargs: Any) -> None:
        # The library reads the endpoints here; RigDash reads them (from discovery) when a sign-in starts.
        View.__init__(self, **kwargs)
        self.OIDC_RP_CLIENT_ID = oidc_config().client_id

    def get(self, request: HttpRequest) -> HttpResponse:
        config = oidc_config()
        if not config.enabled:
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider_metadata(config)["authorization_endpoint"]
        except ProviderUnavailable as exc:
            return _refused(request, f"{config.provider_name} cannot be reached; try again in a moment.", exc)
        response: HttpResponse = super().get(request)
        # The library builds the redirect URI from the Host header; RigDash's comes from RIGDASH_PUBLIC_URL.
        return HttpResponseRedirect(_with_query(response["Location"], redirect_uri=callback_url()))


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The provider's answer: the library checks the state, exchanges the code (with the PKCE verifier) and the
    backend (rigdash.sso.backend) checks the ID token and signs the account in."""

    get_settings = staticmethod(library_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not oidc_config().enabled:
            raise Http404("single sign-on is not configured")
        try:
            response: HttpResponse = super().get(request)
        except (ProviderUnavailable, requests.RequestException) as exc:
            return _refused(request, f"{oidc_config().provider_name} did not answer; try again in a moment.", exc)
        return response

    def login_failure(self) -> HttpResponse:
        reason = self.request.GET.get("error_description") or self.request.GET.get("error") or ""
        return _refused(self.request, f"{oidc_config().provider_name} sign-in was refused.", reason)

    @property
    def failure_url(self) -> str:
        return reverse("login")


class LogoutView(auth_views.LogoutView):
    """Ends RigDash's session; then, for a provider sign-in, the provider's own session where it offers
    RP-initiated logout (https://openid.net/specs/openid-connect-rpinitiated-1_0.html)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        provider_logout = _provider_logout_url(request)  # read before the session, and its ID token, are gone
        response: HttpResponse = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(provider_logout) if provider_logout else response


def _provider_logout_url(request: HttpRequest) -> str:
    config = oidc_config()
    id_token = request.session.get("oidc_id_token")
    if not config.enabled or not id_token:
        return ""
    try:
        endpoint = provider_metadata(config).get("end_session_endpoint")
    except ProviderUnavailable:
        return ""
    if not isinstance(endpoint, str) or not endpoint:
        return ""
    after = config.public_url + reverse("login")
    return _with_query(endpoint, id_token_hint=id_token, post_logout_redirect_uri=after, client_id=config.client_id)


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(key, value) for key, value in parse_qsl(parts.query, keep_blank_values=True) if key not in params]
    return urlunsplit(parts._replace(query=urlencode(query + list(params.items()))))


def _refused(request: HttpRequest, message: str, detail: object) -> HttpResponse:
    logger.warning("sso: %s (%s)", message, detail)
    messages.error(request, message)
    return redirect("login")
