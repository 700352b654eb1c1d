"""ASGI entry point: HTTP to Django, /ws/ to Channels consumers behind auth and a full-origin check
(scheme, host and port: rigdash/origin.py). In front of both: the client's address and scheme as trusted proxies
report them (rigdash/proxies.py), and each route's body limit, enforced before the body is read
(rigdash/bodylimit.py)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rigdash.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from inference.routing import websocket_urlpatterns as inference_ws  # noqa: E402
from monitoring.routing import websocket_urlpatterns as monitoring_ws  # noqa: E402
from rigdash.bodylimit import BodyLimit  # noqa: E402
from rigdash.origin import SameOriginValidator  # noqa: E402
from rigdash.proxies import TrustedProxies  # noqa: E402
from rigdash.ws import auth_middleware_stack  # noqa: E402  (needs the app registry loaded)

application = TrustedProxies(
    ProtocolTypeRouter(
        {
            "http": BodyLimit(django_asgi_app),
            "websocket": SameOriginValidator(auth_middleware_stack(URLRouter(inference_ws + monitoring_ws))),
        }
    )
)
