"""Whether RigDash's Redis answers, and if not, why in words an operator can act on (never the password).

/healthz's Redis check, ``wait_for_migrations`` (every long-running service's start in docker-compose.yml) and
``rigdash_bootstrap`` (the migrate service) say the same thing: a refused password names REDIS_PASSWORD, an
unreachable server names its address, a TLS certificate RigDash does not trust names RIGDASH_REDIS_CA_FILE.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import redis
from redis.exceptions import AuthenticationError, RedisError


class RedisRefused(Exception):
    """Redis answers but refuses RigDash's credentials, or RigDash refuses Redis's TLS certificate: waiting will not
    help, the configuration must change."""


def where(url: str) -> str:
    """``host:port/db`` of a Redis URL, without its credentials."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port or 6379}{parts.path or '/0'}"


def explain(exc: BaseException, url: str) -> str:
    text = str(exc)
    if isinstance(exc, AuthenticationError):
        if "without any password configured" in text:
            return (
                f"Redis at {where(url)} has no password, but RigDash sends one: leave REDIS_PASSWORD empty, or start "
                "Redis with requirepass"
            )
        if "required" in text.lower():
            return f"Redis at {where(url)} requires a password: set REDIS_PASSWORD (or REDIS_PASSWORD_FILE)"
        return (
            f"Redis at {where(url)} refused the password: REDIS_PASSWORD must be the one Redis was started with "
            "(docker-compose.yml gives the same REDIS_PASSWORD to both)"
        )
    tls = tls_problem(text, url)
    if tls:
        return tls
    return f"Redis at {where(url)} is unreachable: {text or type(exc).__name__}"


def tls_problem(text: str, url: str) -> str:
    """Why TLS to Redis failed, in words that name the setting to change; "" when ``text`` is no TLS failure."""
    tls = url.startswith("rediss://")
    if "CERTIFICATE_VERIFY_FAILED" in text:
        reason = text.split("certificate verify failed:", 1)[-1].split("(_ssl.c", 1)[0].strip(" .")
        if "mismatch" in reason:
            return (
                f"Redis at {where(url)} has a TLS certificate for another name ({reason}): connect by a name its "
                "certificate holds (REDIS_URL's host), or reissue the certificate with this one"
            )
        return (
            f"Redis at {where(url)} has a TLS certificate RigDash does not trust ({reason}): "
            "RIGDASH_REDIS_CA_FILE (or REDIS_URL's ssl_ca_certs) must name the CA that signed Redis's tls-cert-file"
        )
    if tls and ("WRONG_VERSION_NUMBER" in text or "Timeout connecting" in text):
        return (
            f"Redis at {where(url)} did not answer TLS: is that port Redis's tls-port? (rediss:// is TLS; a plain "
            "port takes redis://)"
        )
    if tls and ("EOF occurred in violation of protocol" in text or "CERTIFICATE_REQUIRED" in text):
        return (
            f"Redis at {where(url)} closed the TLS connection: with tls-auth-clients yes it wants a client "
            "certificate (RIGDASH_REDIS_CERT_FILE and RIGDASH_REDIS_KEY_FILE) signed by its tls-ca-cert-file"
        )
    if not tls and "Connection reset by peer" in text:
        return (
            f"Redis at {where(url)} reset the connection: if that port is Redis's tls-port, "
            "REDIS_URL must be rediss:// (or REDIS_TLS=1)"
        )
    return ""


def check(url: str, *, timeout_s: float = 2.0) -> str:
    """ "" when Redis answers PING; else why not. ``RedisRefused`` when it refuses the credentials."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except AuthenticationError as exc:
        raise RedisRefused(explain(exc, url)) from None
    except (RedisError, OSError) as exc:
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):  # a certificate RigDash will never trust: waiting will not help
            raise RedisRefused(explain(exc, url)) from None
        return explain(exc, url)
    finally:
        client.close()
    return ""
