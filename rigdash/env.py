"""Small typed readers for settings from the environment that fail loudly on a bad value."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured

# The web server closes a websocket whose message is larger (1009; rigdash/webserver.py). RigDash's own
# limit on a frame, RIGDASH_MAX_WS_FRAME_BYTES, stays at or below it, so a frame over that gets a clear error.
WS_MAX_BYTES = 1 << 20


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ImproperlyConfigured(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


@dataclass(frozen=True)
class RigDashConfig:
    """RigDash's own settings (``settings.RIGDASH``); each maps to one RIGDASH_* variable."""

    max_message_chars: int
    max_ws_frame_bytes: int
    flush_interval_ms: int  # the longest a token waits for its batch (the coalescing ceiling)
    max_reply_tokens: int
    first_token_timeout_s: float
    stall_timeout_s: float
    checkpoint_interval_s: float
    backend_health_timeout_s: float
    default_rig_url: str
    sample_interval_s: float = 1.0
    sample_idle_interval_s: float = 5.0  # an idle rig's pace (monitoring.sampler); not above sample_interval_s: off
    sample_raw_retention_h: float = 24.0
    sample_downsampled_retention_d: float = 30.0
    metrics_token: str = ""
    agent_timeout_s: float = 5.0  # a rig agent silent this long is down (inference/live/agents.py)
    agent_down_fail_s: float = 60.0  # a rig's waiting turns fail once its agent has been down this long
    # The interval while one turn streams alone on a worker; each more streaming turn adds half as much, up to
    # flush_interval_ms (inference.worker.pace.FlushPace).
    flush_min_interval_ms: int = 10
    # How long a turn may wait for a model its server loads on demand (Ollama) beyond the first-token timeout: Ollama
    # gives a load 5 minutes before it calls it stalled (envconfig/config.go LoadTimeout, OLLAMA_LOAD_TIMEOUT).
    model_load_timeout_s: float = 300.0


def _secret(name: str) -> str:
    """``NAME``, else the contents of the file ``NAME_FILE`` names (a Docker secret), else ""."""
    value = os.environ.get(name, "")
    path = os.environ.get(f"{name}_FILE", "")
    if value or not path:
        return value
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().rstrip("\r\n")
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}_FILE {path!r} cannot be read: {exc}") from exc


def env_secret(name: str) -> str:
    """A secret: ``NAME``, else the contents of the file ``NAME_FILE`` names (a Docker secret), else ""."""
    return _secret(name)


def _url_or_parts(url_name: str, host_name: str, default: str, build: Callable[[str], str]) -> str:
    """``url_name`` when set; else ``build(host)`` when ``host_name`` is set (an IPv6 literal bracketed); else
    ``default``."""
    url = _secret(url_name)  # or the file NAME_FILE names (a Docker secret; compose's rig agents)
    if url:
        return url
    host = os.environ.get(host_name, "")
    if not host:
        return default
    return build(f"[{host}]" if ":" in host and not host.startswith("[") else host)


def database_url(default: str) -> str:
    """DATABASE_URL; else a PostgreSQL URL built from POSTGRES_* parts when POSTGRES_HOST is set; else ``default``.

    The parts are percent-encoded, so a password with ``/``, ``#``, ``@`` or ``%`` reaches PostgreSQL as typed
    (dj-database-url decodes them). POSTGRES_PASSWORD_FILE (a Docker secret) is read when POSTGRES_PASSWORD is unset.
    """

    def build(host: str) -> str:
        user = env_str("POSTGRES_USER", "postgres") or "postgres"
        password = _secret("POSTGRES_PASSWORD")
        port = env_int("POSTGRES_PORT", 5432, minimum=1, maximum=65535)
        name = env_str("POSTGRES_DB", user) or user
        credentials = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
        return f"postgres://{credentials}@{host}:{port}/{quote(name, safe='')}"

    return _url_or_parts("DATABASE_URL", "POSTGRES_HOST", default, build)


def redis_url(default: str) -> str:
    """REDIS_URL (or the file REDIS_URL_FILE names); else a Redis URL built from REDIS_HOST, REDIS_PORT, REDIS_DB and
    REDIS_PASSWORD when REDIS_HOST is set (docker-compose.yml), ``rediss://`` (TLS) with REDIS_TLS=1; else ``default``.

    The password is percent-encoded, so one with ``/``, ``#``, ``@``, ``:`` or ``%`` reaches Redis as typed (redis-py
    and kombu decode it). REDIS_PASSWORD_FILE (a Docker secret) is read when REDIS_PASSWORD is unset.
    """

    def build(host: str) -> str:
        password = _secret("REDIS_PASSWORD")
        port = env_int("REDIS_PORT", 6379, minimum=1, maximum=65535)
        db = env_int("REDIS_DB", 0, minimum=0, maximum=15)
        credentials = f":{quote(password, safe='')}@" if password else ""
        scheme = "rediss" if env_bool("REDIS_TLS", False) else "redis"
        return f"{scheme}://{credentials}{host}:{port}/{db}"

    return _url_or_parts("REDIS_URL", "REDIS_HOST", default, build)
