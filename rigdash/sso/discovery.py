"""The provider's metadata from its discovery document (OpenID Connect Discovery 1.0,
https://openid.net/specs/openid-connect-discovery-1_0.html), read at the first sign-in and kept for an hour."""

from __future__ import annotations

import threading
import time
from typing import Any

import requests

from rigdash.sso.config import DISCOVERY_PATH, OidcConfig

KEEP_S = 3600.0
REQUIRED = ("issuer", "authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")

_lock = threading.Lock()
_cache: dict[str, tuple[float, dict[str, Any]]] = {}


class ProviderUnavailable(Exception):
    """The discovery document could not be read, or is not one."""


def provider_metadata(config: OidcConfig) -> dict[str, Any]:
    """The discovery document of ``config``'s provider, from memory when read less than an hour ago."""
    now = time.monotonic()
    with _lock:
        cached = _cache.get(config.discovery_url)
    if cached and now - cached[0] < KEEP_S:
        return cached[1]
    metadata = _fetch(config)
    with _lock:
        _cache[config.discovery_url] = (now, metadata)
    return metadata


def forget_provider_metadata() -> None:
    with _lock:
        _cache.clear()


def _fetch(config: OidcConfig) -> dict[str, Any]:
    try:
        response = requests.get(config.discovery_url, timeout=config.timeout_s)
        response.raise_for_status()
        metadata = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"{config.discovery_url}: {exc}") from exc
    if not isinstance(metadata, dict) or any(not isinstance(metadata.get(key), str) for key in REQUIRED):
        raise ProviderUnavailable(f"{config.discovery_url} is not a discovery document (needs {', '.join(REQUIRED)})")
    # The issuer must be the one the document is published under (Discovery 1.0, section 4.3).
    if metadata["issuer"].rstrip("/") + DISCOVERY_PATH != config.discovery_url:
        raise ProviderUnavailable(f"{config.discovery_url} names another issuer, {metadata['issuer']!r}")
    return metadata
