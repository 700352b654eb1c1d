"""The security headers of every response.

Content-Security-Policy: no inline script anywhere, so HTML that slips past the sanitiser cannot run. Images may also
be ``data:`` and ``blob:`` URLs, which Plotly makes of a chart for its "Download plot as a PNG" button and to probe
WebP support; neither can run anything, and the reply renderer keeps no ``<img>`` of model output
(static/rigdash/markdown.js), so no image reaches another host.

Django's own security headers (HSTS, nosniff, Referrer-Policy, COOP, the HTTPS redirect) come from its
``SecurityMiddleware``; the API's routes run it on the event loop (``AsyncSecurityMiddleware``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.security import SecurityMiddleware

CSP_PARTS = (
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data: blob:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
)
CSP = "; ".join(CSP_PARTS)


@cache
def csp_with_form_action(origin: str) -> str:
    """The policy with ``origin`` also allowed as a form's target: the logout form ends at the sign-in provider
    (RP-initiated logout), and browsers check form-action on every redirect a form's submission follows."""
    if not origin:
        return CSP
    return "; ".join(f"form-action 'self' {origin}" if part == "form-action 'self'" else part for part in CSP_PARTS)


class ContentSecurityPolicyMiddleware:
    """Sets the policy on every response. Async-capable as well as sync, so that under ASGI it costs no thread hop
    of its own and does not make Django adapt the views behind it (a sync-only middleware would)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self._acall(request)
        return self._policy(self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self._policy(await self.get_response(request))

    @staticmethod
    def _policy(response: HttpResponse) -> HttpResponse:
        response.setdefault("Content-Security-Policy", csp_with_form_action(settings.RIGDASH_OIDC.provider_origin))
        return response


class AsyncSecurityMiddleware(SecurityMiddleware):
    """Django's ``SecurityMiddleware`` with its checks run on the event loop under ASGI. They read settings and set
    headers, no I/O; Django's async path for a ``MiddlewareMixin`` runs each in a thread, two hops per request, one
    of them on an API stream's first token (docs/benchmarks.md)."""

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponse | None = self.process_request(request)  # the HTTPS redirect, or None
        if response is None:
            response = await cast("Awaitable[HttpResponse]", self.get_response(request))  # async under ASGI
        return self.process_response(request, response)
