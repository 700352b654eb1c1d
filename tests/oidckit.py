"""A real OpenID provider for the SSO tests (node's certified oidc-provider, tests/oidc/provider.mjs) and a browser
stand-in that walks its sign-in: httpx follows the provider's redirects and posts its login form, Django's test
client is RigDash's side of the same browser.

oidc-provider is installed outside the checkout by scripts/test (npm, cached); without node or it, the tests skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from rigdash.launcher import free_port

PROVIDER_SCRIPT = Path(__file__).parent / "oidc" / "provider.mjs"
PUBLIC_URL = "http://rigdash.test"  # RIGDASH_PUBLIC_URL: not the test client's host, so the Host header is not used
CLIENT_ID = "rigdash"
CLIENT_SECRET = "rigdash-test-client-secret-0123456789"


def provider_modules() -> Path:
    """Where scripts/test installs oidc-provider (npm install --prefix <this>/.. oidc-provider@8)."""
    cache = Path(os.environ.get("RIGDASH_CACHE_DIR", Path.home() / ".cache" / "rigdash"))
    return Path(os.environ.get("OIDC_PROVIDER_MODULES", cache / "oidc-provider" / "node_modules"))


@dataclass
class Provider:
    issuer: str
    accounts_path: Path
    accounts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def set_account(self, sub: str, **values: Any) -> None:
        """Add or change an account; the provider reads the file at every look-up."""
        fresh = {"password": f"{sub}-idp-pw", "email": f"{sub}@idp.test"}
        self.accounts[sub] = {**self.accounts.get(sub, fresh), **values}
        self.accounts_path.write_text(json.dumps(self.accounts))

    def password(self, sub: str) -> str:
        return str(self.accounts[sub]["password"])


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    node = shutil.which("node")
    modules = provider_modules()
    if node is None:
        pytest.skip("node is not installed: the single sign-on tests run node's oidc-provider")
    if not (modules / "oidc-provider").is_dir():
        pytest.skip(f"no oidc-provider in {modules}: scripts/test installs it with npm (npm install --prefix ...)")
    home = tmp_path_factory.mktemp("oidc-provider")
    port = free_port()
    provider = Provider(issuer=f"http://127.0.0.1:{port}", accounts_path=home / "accounts.json")
    provider.accounts_path.write_text("{}")
    client = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uris": [f"{PUBLIC_URL}/login/sso/callback/"],
        "post_logout_redirect_uris": [f"{PUBLIC_URL}/login/"],
        "token_endpoint_auth_method": "client_secret_basic",
    }
    config = home / "config.json"
    config.write_text(json.dumps({"port": port, "accounts": str(provider.accounts_path), "client": client}))
    log = home / "provider.log"  # its warnings: the in-memory store and development keys, as a test wants
    with log.open("w") as log_file:
        proc = subprocess.Popen(
            [node, str(PROVIDER_SCRIPT), str(config)],
            env={**os.environ, "OIDC_PROVIDER_MODULES": str(modules)},
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith("ready "):  # "" when it stopped
            raise RuntimeError(f"oidc-provider did not start: {log.read_text()}")
        yield provider
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class _Form(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.action = ""
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "form" and not self.action:
            self.action = named.get("action") or ""
        if tag == "input" and named.get("name"):
            self.fields[str(named["name"])] = named.get("value") or ""


def form_of(html: str) -> _Form:
    form = _Form()
    form.feed(html)
    return form


def walk_provider(browser: httpx.Client, url: str, *, username: str = "", password: str = "") -> str:
    """Follow the provider from ``url`` until it sends the browser back to RigDash; fill in its login form or press
    its logout button on the way. Returns RigDash's URL (path and query) it was sent to."""
    for _ in range(20):
        if url.startswith(PUBLIC_URL):
            parts = urlsplit(url)
            return f"{parts.path}?{parts.query}" if parts.query else parts.path
        response = browser.get(url)
        if response.status_code == 200:  # a form: the login, or the logout's confirmation
            form = form_of(response.text)
            fields = {**form.fields, "username": username, "password": password}
            if "xsrf" in form.fields:
                fields = {**form.fields, "logout": "yes"}
            response = browser.post(urljoin(url, form.action), data=fields)
        if response.status_code not in (302, 303):
            raise AssertionError(f"provider answered {response.status_code}: {response.text[:300]}")
        url = urljoin(url, response.headers["location"])
    raise AssertionError("the provider never sent the browser back")
