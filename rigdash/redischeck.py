"""Whether RigDash's Redis answers, and if not, why in words an operator can act on (never the password).

/healthz's Redis check, ``wait_for_migrations`` (every long-running service's start in docker-compose.yml) and
``rigdash_bootstrap`` (the migrate service) say the same thing: a refused password names REDIS_PASSWORD, an
unreachable server names its address.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import redis
from redis.exceptions import AuthenticationError, RedisError


class RedisRefused(Exception):
    """Redis answers but refuses RigDash's credentials: waiting will not help, the configuration must change."""


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
    return f"Redis at {where(url)} is unreachable: {text or type(exc).__name__}"


def check(url: str, *, timeout_s: float = 2.0) -> str:
    """ "" when Redis answers PING; else why not. ``RedisRefused`` when it refuses the credentials."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except AuthenticationError as exc:
        raise RedisRefused(explain(exc, url)) from None
    except (RedisError, OSError) as exc:
        return explain(exc, url)
    finally:
        client.close()
    return ""
