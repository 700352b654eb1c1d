"""The web server's handler for the routes reached with an API key (``inference.urls.key_urlpatterns``): Django's own
ASGI handler with the API's middleware only (``settings.API_MIDDLEWARE``) and a URLconf holding those routes alone
(``rigdash.urls_api``).

Why: every one of the pages' middleware (sessions, CSRF, login, messages, login throttling) is a thread hop under
ASGI on the way in or out, and an API request uses none of them: it authenticates by key (inference/views/openai.py)
and is exempt from CSRF. Those hops sat on every API request's time to first token (docs/benchmarks.md). A route
that is not a key route never reaches this handler (``is_key_route``), and a path this handler's URLconf does not
hold is a 404 in OpenAI's shape, never a page.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.http import HttpResponseBase

from inference.urls import key_urlpatterns

KEY_URLCONF = "rigdash.urls_api"
# The fixed paths of the key routes (Ollama's /api/...; /v1/ is all the API's).
_KEY_PATHS = frozenset("/" + str(p.pattern) for p in key_urlpatterns if not str(p.pattern).startswith("v1/"))


def is_key_route(path: str) -> bool:
    return path.startswith("/v1/") or path in _KEY_PATHS


class ApiHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        # BaseHandler builds its chain from settings.MIDDLEWARE: the API's list stands in for it while it does
        # (at start, before any request).
        pages = settings.MIDDLEWARE
        settings.MIDDLEWARE = settings.API_MIDDLEWARE
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = pages

    def create_request(self, scope: Any, body_file: Any) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
        made = super().create_request(scope, body_file)
        if made[0] is not None:
            made[0].urlconf = KEY_URLCONF  # type: ignore[attr-defined]  # Django's per-request URLconf
        return made
