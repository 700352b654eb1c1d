"""Content-Security-Policy: no inline script anywhere, so HTML that slips past the sanitiser cannot run.

Images may also be ``data:`` and ``blob:`` URLs, which Plotly makes of a chart for its "Download plot as a PNG"
button and to probe WebP support; neither can run anything, and the reply renderer keeps no ``<img>`` of model
output (static/rigdash/markdown.js), so no image reaches another host."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.setdefault("Content-Security-Policy", CSP)
        return response
