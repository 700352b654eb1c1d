"""ASGI entry point: HTTP to Django (the routes reached with an API key through their own handler, with the API's
middleware only: rigdash/apihandler.py), /ws/ to Channels consumers behind auth and a full-origin check
(scheme, host and port: rigdash/origin.py). In front of both: the client's address and scheme as trusted proxies
report them (rigdash/proxies.py), and each route's body limit, enforced before the body is read
(rigdash/bodylimit.py)."""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from inference.routing import websocket_urlpatterns as inference_ws  # noqa: E402
from monitoring.routing import websocket_urlpatterns as monitoring_ws  # noqa: E402
from rigdash.apihandler import ApiHandler, is_key_route  # noqa: E402
from rigdash.bodylimit import BodyLimit  # noqa: E402
from rigdash.origin import SameOriginValidator  # noqa: E402
from rigdash.proxies import TrustedProxies  # noqa: E402
from rigdash.ws import auth_middleware_stack  # noqa: E402  (needs the app registry loaded)

api_asgi_app = ApiHandler()


async def _http(scope: Any, receive: Any, send: Any) -> None:
    """Key routes (/v1/, Ollama's /api/...) to the API's handler, everything else to the pages'."""
    handler = api_asgi_app if is_key_route(scope["path"]) else django_asgi_app
    await handler(scope, receive, send)


application = TrustedProxies(
    ProtocolTypeRouter(
        {
            "http": BodyLimit(_http),
            "websocket": SameOriginValidator(auth_middleware_stack(URLRouter(inference_ws + monitoring_ws))),
        }
    )
)
