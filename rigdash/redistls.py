"""TLS to Redis: one ``rediss://`` URL that every Redis client of RigDash reads the same way.

RigDash talks to Redis through redis-py (live state, events, the rig agent, /healthz), channels_redis (the channel
layer, which builds its pool with ``ConnectionPool.from_url``) and kombu (Celery's broker). redis-py and
channels_redis read ``ssl_*`` query parameters off the URL; kombu reads them too, but a ``rediss://`` URL without
``ssl_cert_reqs`` makes kombu connect *without* verifying the server (CERT_NONE, a warning in the log) while
redis-py verifies. So ``with_tls`` spells verification out on the URL before any client sees it:

- ``ssl_cert_reqs=required`` unless the URL names another value;
- ``ssl_ca_certs``, ``ssl_certfile`` and ``ssl_keyfile`` from RIGDASH_REDIS_CA_FILE, RIGDASH_REDIS_CERT_FILE and
  RIGDASH_REDIS_KEY_FILE (a private CA; a client certificate when Redis has ``tls-auth-clients yes``) unless the URL
  names them.

A ``redis://`` URL is left as it is; the TLS variables with it are a mistake, said at start.
"""

from __future__ import annotations

import os
import ssl
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

# URL query parameter -> the environment variable that gives it
FILE_VARIABLES = {
    "ssl_ca_certs": "RIGDASH_REDIS_CA_FILE",
    "ssl_certfile": "RIGDASH_REDIS_CERT_FILE",
    "ssl_keyfile": "RIGDASH_REDIS_KEY_FILE",
}
CERT_REQS = {
    "required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
    "cert_required": ssl.CERT_REQUIRED,
    "cert_optional": ssl.CERT_OPTIONAL,
    "cert_none": ssl.CERT_NONE,
}


def is_tls(url: str) -> bool:
    return url.startswith("rediss://")


def with_tls(url: str, *, name: str = "REDIS_URL") -> str:
    """``url`` with its TLS parameters complete (see the module's docstring); a ``redis://`` URL unchanged.
    ImproperlyConfigured names the variable to fix: a file that cannot be read, an unknown ``ssl_cert_reqs``, or
    TLS files given for a plain ``redis://`` URL."""
    given = {var: os.environ.get(var, "") for var in FILE_VARIABLES.values()}
    if not is_tls(url):
        named = [var for var, value in given.items() if value]
        if named and url.startswith("redis://"):
            raise ImproperlyConfigured(
                f"{', '.join(named)} set, but {name} is redis:// (no TLS): use rediss:// to reach Redis over TLS"
            )
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    reqs = query.get("ssl_cert_reqs") or "required"
    if reqs.lower() not in CERT_REQS:
        raise ImproperlyConfigured(f"{name}: ssl_cert_reqs must be required, optional or none, got {reqs!r}")
    query["ssl_cert_reqs"] = reqs.lower().removeprefix("cert_")  # the spelling redis-py and kombu both take
    for param, var in FILE_VARIABLES.items():
        if not query.get(param) and given[var]:
            query[param] = given[var]
        path = query.get(param)
        if path and not os.access(path, os.R_OK):
            source = f"{var} ({path!r})" if given[var] == path else f"{name}'s {param} ({path!r})"
            raise ImproperlyConfigured(f"{source} cannot be read")
    if bool(query.get("ssl_certfile")) != bool(query.get("ssl_keyfile")):
        raise ImproperlyConfigured(
            "a client certificate needs both RIGDASH_REDIS_CERT_FILE and RIGDASH_REDIS_KEY_FILE "
            "(or ssl_certfile and ssl_keyfile)"
        )
    return urlunsplit(parts._replace(query=urlencode(query)))


def ssl_options(url: str) -> dict[str, Any] | None:
    """The ``ssl_*`` parameters of a ``rediss://`` URL (as ``with_tls`` left it) for Celery's ``broker_use_ssl``
    and ``redis_backend_use_ssl``, ``ssl_cert_reqs`` as the ``ssl`` constant; None for a plain URL."""
    if not is_tls(url):
        return None
    options: dict[str, Any] = {}
    for key, value in parse_qsl(urlsplit(url).query):
        if key == "ssl_cert_reqs":
            options[key] = CERT_REQS[value.lower()]
        elif key == "ssl_check_hostname":
            options[key] = value.lower() not in {"false", "0", "no", "off"}
        elif key.startswith("ssl_"):
            options[key] = value
    return options
