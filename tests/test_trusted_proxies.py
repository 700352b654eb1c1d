"""The client's address and scheme behind reverse proxies (rigdash/proxies.py): the walk over X-Forwarded-For, and
through the real web server (uvicorn, as scripts/run starts it) the login throttle seeing the real client.

The server here trusts 127.0.0.2 as its proxy: a connection from 127.0.0.2 is the proxy, one from 127.0.0.1 a client
that reached the web port directly and may write any header it likes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rigdash.launcher import Stack, free_port, port_open, web_command
from rigdash.proxies import TrustedProxies, client_address, forwarded_secure, trusted_networks
from tests.conftest import LOG_DIR, wait_until

PROXY = "127.0.0.2"
TRUSTED = trusted_networks([PROXY, "10.0.0.0/8"])
LIMIT = 5


def test_an_untrusted_peer_is_the_client_whatever_it_forwards():
    assert client_address("127.0.0.1", ["203.0.113.9"], TRUSTED) == "127.0.0.1"
    assert client_address("127.0.0.1", ["203.0.113.9"], ()) == "127.0.0.1"
    assert forwarded_secure("127.0.0.1", ["https"], TRUSTED) is None


def test_a_trusted_peer_names_the_first_untrusted_hop_from_the_right():
    # A client's own X-Forwarded-For (198.51.100.1) comes first; the proxy appends the address it saw.
    assert client_address(PROXY, ["198.51.100.1, 203.0.113.9"], TRUSTED) == "203.0.113.9"
    assert client_address(PROXY, ["198.51.100.1, 203.0.113.9, 10.1.2.3"], TRUSTED) == "203.0.113.9"
    assert client_address(PROXY, ["198.51.100.1", "203.0.113.9"], TRUSTED) == "203.0.113.9"  # two header lines
    assert client_address(PROXY, ["10.9.9.9, 10.1.2.3"], TRUSTED) == "10.9.9.9"  # all trusted: the farthest
    assert client_address(PROXY, [], TRUSTED) == PROXY
    assert client_address(f"::ffff:{PROXY}", ["[2001:db8::1]:4711"], TRUSTED) == "2001:db8::1"


def test_a_hop_that_is_not_an_address_ends_the_walk_at_the_proxy_that_wrote_it():
    assert client_address(PROXY, ["203.0.113.9, not-an-ip, 10.1.2.3"], TRUSTED) == "10.1.2.3"
    assert client_address(PROXY, ["unknown"], TRUSTED) == PROXY


def test_the_scheme_is_the_trusted_proxys_last_word():
    assert forwarded_secure(PROXY, ["https"], TRUSTED) is True
    assert forwarded_secure(PROXY, ["http, https"], TRUSTED) is True
    assert forwarded_secure(PROXY, ["https, http"], TRUSTED) is False
    assert forwarded_secure(PROXY, [], TRUSTED) is None


def test_a_bad_trusted_proxy_setting_is_named():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"proxy\.example"):
        trusted_networks(["10.0.0.1", "proxy.example"])


async def _scope_seen(scope: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def app(inner: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(inner)

    await TrustedProxies(app)(scope, None, None)
    return seen


async def test_the_middleware_rewrites_a_sockets_client_and_scheme_only_for_a_trusted_peer(settings):
    settings.TRUSTED_PROXIES = TRUSTED
    headers = [(b"x-forwarded-for", b"203.0.113.9"), (b"x-forwarded-proto", b"https")]
    trusted = await _scope_seen({"type": "websocket", "client": (PROXY, 5000), "scheme": "ws", "headers": headers})
    assert trusted["client"] == ("203.0.113.9", 0) and trusted["scheme"] == "wss"
    direct = await _scope_seen({"type": "http", "client": ("127.0.0.1", 5000), "scheme": "http", "headers": headers})
    assert direct["client"] == ("127.0.0.1", 5000) and direct["scheme"] == "http"
    settings.TRUSTED_PROXIES = ()
    nobody = await _scope_seen({"type": "http", "client": (PROXY, 5000), "scheme": "http", "headers": headers})
    assert nobody["client"] == (PROXY, 5000) and nobody["scheme"] == "http"


# --- through the real web server ---------------------------------------------------------------------------------


def _web_behind_proxy(service_env: dict[str, str], name: str, **env: str) -> Iterator[str]:
    processes = Stack()
    port = free_port()
    env = {**service_env, "RIGDASH_TRUSTED_PROXIES": PROXY, "RIGDASH_LOGIN_FAILURE_LIMIT": str(LIMIT), **env}
    proc = processes.start(name, web_command(host="127.0.0.1", port=port), env=env, log_path=LOG_DIR / f"{name}.log")
    # uvicorn listens once the application is loaded; RIGDASH_SECURE=1 redirects every plain request, so no page
    # would answer 200 to wait_http.
    try:
        wait_until(lambda: proc.poll() is not None or port_open("127.0.0.1", port), timeout_s=60, what="web server")
        assert proc.poll() is None, f"the web server exited; see {LOG_DIR / name}.log"
        yield f"http://127.0.0.1:{port}"
    finally:
        processes.stop()


@pytest.fixture(scope="module")
def proxied_web_url(stack: Stack, service_env: dict[str, str]) -> Iterator[str]:
    """A web server that trusts 127.0.0.2 as its reverse proxy (RIGDASH_TRUSTED_PROXIES), with the default
    login throttle (LIMIT failures)."""
    yield from _web_behind_proxy(service_env, "web-proxied")


@pytest.fixture(scope="module")
def secure_web_url(stack: Stack, service_env: dict[str, str]) -> Iterator[str]:
    """The same, with RIGDASH_SECURE=1: TLS ends at the proxy."""
    yield from _web_behind_proxy(service_env, "web-proxied-secure", RIGDASH_SECURE="1")


def _client(url: str, *, via_proxy: bool) -> httpx.Client:
    """An HTTP client that connects from the proxy's address (127.0.0.2) or straight from 127.0.0.1."""
    transport = httpx.HTTPTransport(local_address=PROXY if via_proxy else "127.0.0.1")
    return httpx.Client(base_url=url, transport=transport, timeout=10)


def _login(client: httpx.Client, username: str, password: str, forwarded_for: str | None) -> int:
    client.cookies.clear()
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:500]
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    answer = client.post("/login/", data={"username": username, "password": password,
                                          "csrfmiddlewaretoken": token.group(1)}, headers=headers)  # fmt: skip
    return answer.status_code


def _attempt_addresses(username: str) -> set[str]:
    from axes.models import AccessAttempt

    return set(AccessAttempt.objects.filter(username=username).values_list("ip_address", flat=True))


over_the_network = pytest.mark.django_db(transaction=True)


@over_the_network
def test_a_forwarded_for_from_an_untrusted_peer_is_ignored(proxied_web_url, owner):
    with _client(proxied_web_url, via_proxy=False) as direct:
        for attempt in range(LIMIT - 1):
            assert _login(direct, "owner", "wrong", forwarded_for=f"198.51.100.{attempt}") == 200
        assert _attempt_addresses("owner") == {"127.0.0.1"}
        # A new made-up address each time changes nothing: the peer reached the limit.
        assert _login(direct, "owner", "wrong", forwarded_for="198.51.100.99") == 429
        assert _login(direct, "owner", "owner-pw-123", forwarded_for="198.51.100.100") == 429


@over_the_network
def test_a_trusted_proxy_gives_the_real_client_address(proxied_web_url, owner):
    with _client(proxied_web_url, via_proxy=True) as proxy:
        # What a client wrote itself (198.51.100.7) stays left of what the proxy saw (203.0.113.5).
        assert _login(proxy, "owner", "wrong", forwarded_for="198.51.100.7, 203.0.113.5") == 200
    assert _attempt_addresses("owner") == {"203.0.113.5"}


@over_the_network
def test_one_user_failing_logins_behind_the_proxy_locks_out_no_one_else(proxied_web_url, owner, other_user):
    with _client(proxied_web_url, via_proxy=True) as proxy:
        for _ in range(LIMIT - 1):
            assert _login(proxy, "other", "wrong", forwarded_for="203.0.113.66") == 200
        assert _login(proxy, "other", "wrong", forwarded_for="203.0.113.66") == 429
        assert _login(proxy, "other", "other-pw-123", forwarded_for="203.0.113.66") == 429  # that pair is locked
        assert _login(proxy, "owner", "owner-pw-123", forwarded_for="203.0.113.77") == 302  # the next user is not
        assert _login(proxy, "other", "other-pw-123", forwarded_for="203.0.113.88") == 302  # nor the account elsewhere


def test_the_scheme_is_https_only_when_the_trusted_proxy_says_so(secure_web_url):
    says_https = {"X-Forwarded-Proto": "https"}
    with _client(secure_web_url, via_proxy=False) as direct:
        answer = direct.get("/login/", headers=says_https)
        assert answer.status_code == 301 and answer.headers["location"].startswith("https://")
    with _client(secure_web_url, via_proxy=True) as proxy:
        assert proxy.get("/login/").status_code == 301  # the proxy spoke plain HTTP
        answer = proxy.get("/login/", headers=says_https)
        assert answer.status_code == 200
        assert "Strict-Transport-Security" in answer.headers
        assert "; secure" in answer.headers["set-cookie"].lower()  # the CSRF cookie
