"""The client's address and scheme, believed from X-Forwarded-* only as far as trusted proxies vouch for them.

``RIGDASH_TRUSTED_PROXIES`` lists the reverse proxies' addresses or networks (empty: trust nobody, the socket's
peer is the client). ``TrustedProxies`` wraps the whole ASGI application and rewrites ``scope["client"]`` and
``scope["scheme"]`` once, so Django's ``REMOTE_ADDR`` and ``request.is_secure()``, the login throttle
(``request_address``, django-axes' ``AXES_CLIENT_IP_CALLABLE``), the websocket origin check and every consumer read
the same answer. The walk is the one MDN describes for X-Forwarded-For ("the rightmost IP address that is not a
trusted proxy"): https://developer.mozilla.org/en-US/docs/Web/HTTP/Reference/Headers/X-Forwarded-For
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:  # settings.py imports this module: nothing of Django's request machinery at import
    from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
ASGIApp = Any


def trusted_networks(values: Iterable[str], *, name: str = "RIGDASH_TRUSTED_PROXIES") -> tuple[Network, ...]:
    """Each address (``10.0.0.2``) or network (``172.16.0.0/12``) as a network; ImproperlyConfigured names a bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {value!r} is not an IP address or network") from None
    return tuple(networks)


def _address(value: str) -> Address | None:
    """An address as a hop writes it (``1.2.3.4``, ``1.2.3.4:5678``, ``[2001:db8::1]:80``), or None."""
    value = value.strip()
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else ""
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:10.0.0.1 from a dual-stack socket is 10.0.0.1
    return mapped or address


def _trusted(address: Address | None, trusted: Sequence[Network]) -> bool:
    return address is not None and any(address in network for network in trusted)


def client_address(peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[Network]) -> str | None:
    """The client's address: the peer's, unless the peer is trusted; then X-Forwarded-For read right to left, the
    first hop that is not a trusted proxy. A hop that is not an address ends the walk at the proxy that wrote it."""
    nearest = _address(peer or "")
    if not _trusted(nearest, trusted):
        return peer
    hops = [hop for value in forwarded_for for hop in value.split(",") if hop.strip()]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            break
        nearest = address
        if not _trusted(address, trusted):
            break
    return str(nearest)


def forwarded_secure(peer: str | None, forwarded_proto: Sequence[str], trusted: Sequence[Network]) -> bool | None:
    """Whether the trusted peer says the client spoke TLS (the last X-Forwarded-Proto value, the peer's own);
    None when the peer is not trusted or says nothing."""
    if not forwarded_proto or not _trusted(_address(peer or ""), trusted):
        return None
    return forwarded_proto[-1].split(",")[-1].strip().lower() in ("https", "wss")


def request_address(request: HttpRequest) -> str | None:
    """The client's address of a Django request (``TrustedProxies`` has already resolved it into REMOTE_ADDR)."""
    return request.META.get("REMOTE_ADDR")


class TrustedProxies:
    """ASGI middleware: ``scope["client"]`` and ``scope["scheme"]`` as trusted proxies report them (http and
    websocket); with no trusted proxy, or a peer that is not one, the scope is left as the socket made it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        trusted = settings.TRUSTED_PROXIES
        if scope["type"] in ("http", "websocket") and trusted:
            scope = self.resolved(scope, trusted)
        return await self.app(scope, receive, send)

    @staticmethod
    def resolved(scope: dict[str, Any], trusted: Sequence[Network]) -> dict[str, Any]:
        client = scope.get("client")
        peer = client[0] if client else None
        forwarded_for: list[str] = []
        forwarded_proto: list[str] = []
        for name, value in scope.get("headers", ()):
            if name == b"x-forwarded-for":
                forwarded_for.append(value.decode("latin-1"))
            elif name == b"x-forwarded-proto":
                forwarded_proto.append(value.decode("latin-1"))
        address = client_address(peer, forwarded_for, trusted)
        secure = forwarded_secure(peer, forwarded_proto, trusted)
        if address == peer and secure is None:
            return scope
        scope = dict(scope)
        if address != peer:
            scope["client"] = (address, 0)  # the proxy's port to us says nothing about the client's
        if secure is not None:
            plain, tls = ("ws", "wss") if scope["type"] == "websocket" else ("http", "https")
            scope["scheme"] = tls if secure else plain
        return scope
