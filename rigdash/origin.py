"""The websocket origin check: a socket opens only from RigDash's own pages.

The page's Origin must equal the socket's own origin, scheme, host and port alike (``https://rig.lan:8443`` is not
``http://rig.lan:8000``), or be one of ``CSRF_TRUSTED_ORIGINS``; and the Host must be one of ``ALLOWED_HOSTS``.
Behind a trusted proxy that ends TLS, its X-Forwarded-Proto has already made the scope's scheme ``wss``
(rigdash/proxies.py), as for HTTP.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def normal_origin(value: str) -> str | None:
    """``scheme://host[:port]`` lower-cased, without its scheme's default port; None when not an http(s) origin."""
    try:
        parts = urlsplit(value.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + ("" if port in (None, DEFAULT_PORTS[parts.scheme]) else f":{port}")


def _scheme(scope: dict[str, Any]) -> str:
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def origin_allowed(scope: dict[str, Any]) -> bool:
    headers = {name.lower(): value for name, value in scope.get("headers") or []}
    origin = normal_origin(headers.get(b"origin", b"").decode("latin-1"))
    host = headers.get(b"host", b"").decode("latin-1").strip().lower()
    if origin is None or not host:
        return False
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    own = normal_origin(f"{_scheme(scope)}://{host}")
    trusted = {normal_origin(value) for value in settings.CSRF_TRUSTED_ORIGINS}
    return origin == own or origin in trusted


class SameOriginValidator:
    """ASGI middleware: refuses (403) a websocket whose Origin is not RigDash's own (``origin_allowed``)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
