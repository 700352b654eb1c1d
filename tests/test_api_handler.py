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
        ("/completion", True),
        ("/infill", True),
        ("/tokenize", True),
        ("/infill/", False),
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
    # Ollama's model management: its shape, saying where models are managed, not a 404 page; the key still checked.
    bearer = {"Authorization": f"Bearer {key.secret}"}
    managing = (("POST", "pull"), ("POST", "push"), ("POST", "create"), ("POST", "copy"), ("DELETE", "delete"))
    for method, path in managing:
        managed = httpx.request(method, f"{web_url}/api/{path}", json={"model": model_name}, headers=bearer)
        assert managed.status_code == 501 and "models page" in managed.json()["error"], (path, managed.text)
    assert httpx.post(f"{web_url}/api/pull", json={"model": "x"}).status_code == 401

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


async def _asgi_get(app, path: str) -> list[dict]:  # type: ignore[no-untyped-def]
    """One GET through an ASGI app, as a server calls it: what the app sent."""
    import asyncio

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": [],
        "server": ("testserver", 80), "client": ("127.0.0.1", 5000),
    }  # fmt: skip
    messages = [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_the_api_handler_sends_no_request_started_signal_and_closes_its_response_on_the_loop():
    """``ApiHandler.handle``: Django's, less the ``request_started`` signal and the thread it ran in, and with the
    response closed (``request_finished``) on the loop's thread. Django's own ``handle`` on the same handler does
    both in another thread: the test tells the two apart."""
    import threading

    from django.core import signals
    from django.core.handlers.asgi import ASGIHandler

    from rigdash.apihandler import ApiHandler

    class StockHandler(ApiHandler):
        handle = ASGIHandler.handle

    started: list[int] = []
    finished: list[int] = []

    def on_started(**kwargs: object) -> None:
        started.append(threading.get_ident())

    def on_finished(**kwargs: object) -> None:
        finished.append(threading.get_ident())

    signals.request_started.connect(on_started)
    signals.request_finished.connect(on_finished)
    try:
        ours = await _asgi_get(ApiHandler(), "/v1/no/such/route")
        assert (started, finished) == ([], [threading.get_ident()])
        stock = await _asgi_get(StockHandler(), "/v1/no/such/route")
        assert len(started) == 1 and started[0] != threading.get_ident()
        assert len(finished) == 2 and finished[1] != threading.get_ident()
    finally:
        signals.request_started.disconnect(on_started)
        signals.request_finished.disconnect(on_finished)
    # The same answer either way: OpenAI's 404 for a path no route holds.
    assert [m["type"] for m in ours] == [m["type"] for m in stock] == ["http.response.start", "http.response.body"]
    assert ours[0]["status"] == stock[0]["status"] == 404
    assert ours[1]["body"] == stock[1]["body"] and b"unknown_url" in ours[1]["body"]
