"""The web server's two HTTP handlers (rigdash/asgi.py, rigdash/apihandler.py): the routes reached with an API key go
through the API's middleware only, with a URLconf of their own; every other route, /api/ pages' JSON included, goes
through the pages' middleware. Against the real web server (uvicorn)."""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from inference.board import apikeys
from rigdash.apihandler import is_key_route
from tests.conftest import session_cookie_for


@pytest.mark.parametrize(
    ("path", "key_route"),
    [
        ("/v1/chat/completions", True),
        ("/v1/anything/else", True),
        ("/api/chat", True),
        ("/api/version", True),
        ("/api/chat/", False),
        ("/api/chats", False),
        ("/api/sessions/1/turns", False),
        ("/api/calculator", False),
        ("/v1", False),
        ("/keys/", False),
    ],
)
def test_which_paths_are_key_routes(path, key_route):
    assert is_key_route(path) is key_route


@pytest.mark.llama
@pytest.mark.django_db(transaction=True)
def test_key_routes_skip_the_pages_middleware_and_keep_the_security_headers(web_url, rig, model_name, owner):
    key = apikeys.api_key_create(owner=owner, name="handler")
    cookie = {settings.SESSION_COOKIE_NAME: session_cookie_for(owner)}
    api = httpx.get(f"{web_url}/v1/models", headers={"Authorization": f"Bearer {key.secret}"}, cookies=cookie)
    assert api.status_code == 200 and api.json()["data"][0]["id"] == model_name
    assert "default-src 'self'" in api.headers["Content-Security-Policy"]
    assert api.headers["X-Content-Type-Options"] == "nosniff"
    # No session middleware: the browser's session is neither read (it would refresh the cookie) nor set.
    assert "set-cookie" not in api.headers and "Cookie" not in api.headers.get("Vary", "")
    ollama = httpx.get(f"{web_url}/api/version", headers={"Authorization": f"Bearer {key.secret}"})
    assert ollama.status_code == 200 and "version" in ollama.json()

    # A path under /v1/ that no route holds: OpenAI's 404, in its shape, never a page.
    missing = httpx.post(f"{web_url}/v1/no/such/route", json={}, headers={"Authorization": f"Bearer {key.secret}"})
    assert missing.status_code == 404 and missing.headers["Content-Type"] == "application/json"
    said = missing.json()["error"]
    assert said["code"] == "unknown_url" and "/v1/no/such/route" in said["message"]

    # The pages keep theirs: a session's user, CSRF, the frame header; /api/ JSON of the pages is one of them.
    page = httpx.get(f"{web_url}/keys/", cookies=cookie)
    assert page.status_code == 200 and page.headers["X-Frame-Options"] == "DENY"
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    anonymous = httpx.get(f"{web_url}/api/rigs/{rig.pk}/models")
    assert anonymous.status_code == 401 and "unknown_url" not in anonymous.text  # the session check answered
    signed_in = httpx.get(f"{web_url}/api/rigs/{rig.pk}/models", cookies=cookie)
    assert signed_in.status_code == 200


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "https redirect and HSTS"])
async def test_the_api_security_middleware_answers_as_djangos_own_on_the_event_loop(settings, secure, monkeypatch):
    """``AsyncSecurityMiddleware`` gives what Django's ``SecurityMiddleware`` gives (the HTTPS redirect, HSTS, nosniff,
    Referrer-Policy, COOP), with its checks on the event loop's thread, where Django's async path runs each in
    another thread."""
    import threading

    from django.http import HttpResponse
    from django.middleware.security import SecurityMiddleware
    from django.test import RequestFactory

    from rigdash.middleware import AsyncSecurityMiddleware

    settings.SECURE_SSL_REDIRECT = secure
    settings.SECURE_HSTS_SECONDS = 3600 if secure else 0
    threads: list[int] = []
    checked = SecurityMiddleware.process_response

    def process_response(self, request, response):  # type: ignore[no-untyped-def]
        threads.append(threading.get_ident())
        return checked(self, request, response)

    monkeypatch.setattr(SecurityMiddleware, "process_response", process_response)

    async def view(request):  # type: ignore[no-untyped-def]
        return HttpResponse("ok")

    answers = []
    for middleware in (SecurityMiddleware, AsyncSecurityMiddleware):
        request = RequestFactory().get("/v1/models", secure=False)
        answers.append(await middleware(view)(request))
    theirs, ours = answers
    assert ours.status_code == theirs.status_code == (301 if secure else 200)
    assert dict(ours.headers) == dict(theirs.headers) and ours.headers.get("X-Content-Type-Options") == "nosniff"
    assert threads[0] != threading.get_ident() and threads[1] == threading.get_ident()
