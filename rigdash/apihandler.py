"""The web server's handler for the routes reached with an API key (``inference.urls.key_urlpatterns``): Django's own
ASGI handler with the API's middleware only (``settings.API_MIDDLEWARE``) and a URLconf holding those routes alone
(``rigdash.urls_api``).

Why: every one of the pages' middleware (sessions, CSRF, login, messages, login throttling) is a thread hop under
ASGI on the way in or out, and an API request uses none of them: it authenticates by key (inference/views/openai.py)
and is exempt from CSRF. Those hops sat on every API request's time to first token (docs/benchmarks.md). For the
same reason this handler sends no ``request_started`` signal (``handle``). A route that is not a key route never
reaches this handler (``is_key_route``), and a path this handler's URLconf does not hold is a 404 in OpenAI's shape,
never a page.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, ASGIRequest, get_script_prefix
from django.http import HttpResponseBase
from django.urls import set_script_prefix

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

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        """Django's ``ASGIHandler.handle`` (Django 5.2) less two thread hops. It sends no ``request_started`` signal,
        and closes the response on the loop, not in a thread. Both hops ran the signals' database receivers
        (``close_old_connections``) in a thread of the request's own, made for that alone; the API's views hold no
        connection there. Their database work runs on threads that close old connections around each call
        (``on_db_thread`` in inference/views/turn_listener.py). The first hop sat before every request's view."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None
            body_file.close()
            await self.send_response(error_response, send)
            error_response.close()
            return

        async def process_request() -> HttpResponseBase:
            response = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # the client went away while it was sent
                await self.send_response(response, send)
            return response

        # As Django's: a disconnect while the response is made cancels the view, which may clean up.
        processing = asyncio.create_task(process_request())
        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)), processing]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:  # the client went away
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = processing.result()
        except asyncio.CancelledError:
            pass  # Django sends request_finished here; its receivers are the database's, as above
        else:
            response.close()  # sends request_finished, whose receivers find nothing of this thread's to close
        body_file.close()
