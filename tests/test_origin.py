"""The websocket origin check compares scheme, host and port: another service on the same host name cannot open an
authenticated socket."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from inference.models import ChatSession, Rig
from rigdash.origin import origin_allowed
from tests.conftest import session_cookie_for
from tests.wsclient import ChatSocket


def _scope(origin: str, host: str = "rig.lan:8000", scheme: str = "ws", **headers: str) -> dict:
    raw = [(b"origin", origin.encode()), (b"host", host.encode())]
    raw += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    return {"type": "websocket", "scheme": scheme, "headers": raw}


@pytest.fixture(autouse=True)
def _hosts(settings):
    settings.ALLOWED_HOSTS = ["rig.lan", "127.0.0.1"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://dash.example"]
    settings.SECURE_PROXY_SSL_HEADER = None


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "allowed"),
    [
        ("http://rig.lan:8000", "rig.lan:8000", "ws", True),
        ("HTTP://RIG.LAN:8000", "rig.lan:8000", "ws", True),
        ("http://rig.lan:8001", "rig.lan:8000", "ws", False),  # another port of the same host
        ("https://rig.lan:8000", "rig.lan:8000", "ws", False),  # another scheme
        ("http://rig.lan", "rig.lan:8000", "ws", False),
        ("https://rig.lan", "rig.lan", "wss", True),
        ("https://rig.lan:443", "rig.lan", "wss", True),
        ("http://rig.lan", "rig.lan", "wss", False),
        ("http://evil.example", "rig.lan", "ws", False),
        ("https://dash.example", "rig.lan", "ws", True),  # CSRF_TRUSTED_ORIGINS
        ("http://evil.example:8000", "evil.example:8000", "ws", False),  # a host not in ALLOWED_HOSTS
        ("null", "rig.lan", "ws", False),
        ("", "rig.lan", "ws", False),
        ("http://rig.lan:99999", "rig.lan", "ws", False),
    ],
)
def test_the_full_origin_is_compared(origin, host, scheme, allowed):
    assert origin_allowed(_scope(origin, host, scheme)) is allowed


def test_behind_a_tls_proxy_the_scheme_is_the_trusted_proxys_not_a_header(settings):
    """rigdash/proxies.py turns a trusted proxy's X-Forwarded-Proto into the scope's scheme; the header itself
    counts for nothing here (a client that reaches the port directly may send it)."""
    assert origin_allowed(_scope("https://rig.lan", "rig.lan", "wss"))
    assert not origin_allowed(_scope("https://rig.lan", "rig.lan", "ws", x_forwarded_proto="https"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("origin", "opens"), [("http://127.0.0.1", True), ("http://127.0.0.1:8080", False)])
async def test_a_socket_from_another_port_of_the_same_host_is_refused(owner, origin, opens):
    def setup() -> int:
        rig = Rig.objects.create(name="idle", kind="llamacpp", base_url="http://127.0.0.1:9", queue="rig.idle")
        return ChatSession.objects.create(owner=owner, rig=rig, model_name="m").pk

    sock = ChatSocket(await sync_to_async(setup)(), await sync_to_async(session_cookie_for)(owner), origin=origin)
    assert (await sock.connect())[0] is opens
    await sock.close()
