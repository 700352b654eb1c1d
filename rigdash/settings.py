"""RigDash settings: every value comes from the environment (see the README's table); defaults run a fresh clone."""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from rigdash import redistls
from rigdash.env import (
    WS_MAX_BYTES,
    RigDashConfig,
    database_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
    redis_url,
)
from rigdash.proxies import trusted_networks
from rigdash.sso.config import authentication_backends, oidc_config_from_env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("RIGDASH_VAR_DIR", str(BASE_DIR / "var")))
# A database-free rig agent (`manage.py rigdash_agent --rig-id ID`, docs/monitoring.md "Rig agents"): it holds its
# rig's id, its rig's key and a Redis URL, nothing else. No database (any query raises), no secret key of RigDash's
# (a random one for this process: the agent signs nothing with it), and nothing written under VAR_DIR.
AGENT_ONLY = env_bool("RIGDASH_AGENT_ONLY", False)
if not AGENT_ONLY:
    VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("RIGDASH_DEBUG", False)


def _secret_key() -> str:
    """RIGDASH_SECRET_KEY, or a random key kept in var/ so a local run needs no configuration."""
    key = env_str("RIGDASH_SECRET_KEY", "")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = secrets.token_urlsafe(50) if AGENT_ONLY else _secret_key()
ALLOWED_HOSTS = env_list("RIGDASH_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("RIGDASH_CSRF_TRUSTED_ORIGINS", [])

# The reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (rigdash/proxies.py): addresses or
# networks. Empty trusts nobody: the socket's peer is the client and the scheme is what the socket spoke.
TRUSTED_PROXIES = trusted_networks(env_list("RIGDASH_TRUSTED_PROXIES", []))

# Request bodies past these are answered 413 before they are read (rigdash/bodylimit.py): the OpenAI-compatible
# API (/v1/: messages of at most RIGDASH_MAX_MESSAGE_CHARS each), and everything else (a chat export of up to 5 MiB
# is imported through a page's form or the JSON API). Django's own in-memory cap follows the larger.
API_MAX_BODY_BYTES = env_int("RIGDASH_API_MAX_BODY_BYTES", 1_048_576, minimum=1024)
MAX_BODY_BYTES = env_int("RIGDASH_MAX_BODY_BYTES", 6 * 1_048_576, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES, MAX_BODY_BYTES)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "inference",
    "monitoring",
    "monitoring.alerts",
    "rigdash.sso",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "rigdash.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: it answers a locked-out login
]
# The routes reached with an API key (/v1/, Ollama's /api/...) pass through these only (rigdash/apihandler.py): they
# read no session, user, CSRF token or message, and each middleware more is a thread hop on the reply's first token.
API_MIDDLEWARE = [
    "rigdash.middleware.AsyncSecurityMiddleware",  # Django's SecurityMiddleware, with no thread hop
    "rigdash.middleware.ContentSecurityPolicyMiddleware",
]

# Login throttling (django-axes, https://django-axes.readthedocs.io/): failed logins are counted in the database per
# account and, separately, per address; past the limit that account or address is refused until the cool-off ends
# or an admin deletes its lock (admin "Access attempts", or `manage.py axes_reset_username NAME` / `axes_reset_ip IP`).
# Single sign-on (rigdash/sso/, docs/admin.md "Single sign-on"): RIGDASH_OIDC_* name an OpenID Connect provider;
# RIGDASH_LOCAL_LOGIN=0 switches the username and password form off, and with it every local account's sessions.
RIGDASH_OIDC = oidc_config_from_env()
AUTHENTICATION_BACKENDS = authentication_backends(RIGDASH_OIDC)
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = env_int("RIGDASH_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("RIGDASH_LOGIN_LOCKOUT_MINUTES", 15.0, minimum=0.1))
# One account from one address: a burst of failures locks that pair only, so neither the account's owner elsewhere
# nor the other people behind the same address are locked out with it. The address is the client's, as trusted
# proxies report it (rigdash/proxies.py), never a header a client could write.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "rigdash.proxies.request_address"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False

# Websocket limits (rigdash/ws.py, rigdash/channel_layer.py): frames a user may send per second (a burst of twice
# that passes), and the events one socket may have waiting to be sent before it is closed (4408) to resync.
WS_FRAMES_PER_S = env_float("RIGDASH_WS_FRAMES_PER_S", 20.0, minimum=0.1)
WS_OUTBOX_MAX = env_int("RIGDASH_WS_OUTBOX_MAX", 2000, minimum=10)

ROOT_URLCONF = "rigdash.urls"
ASGI_APPLICATION = "rigdash.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            "builtins": ["rigdash.templatetags.pagejson"],
        },
    },
]

# SQLite by default so a fresh clone runs; PostgreSQL (CI, production) through DATABASE_URL, or through
# POSTGRES_HOST and the other POSTGRES_* parts (docker-compose.yml), each percent-encoded (rigdash.env.database_url).
# Connections are kept for a minute (checked before reuse): opening one per request, with SQLite's PRAGMAs,
# would be part of each chat submit. The test suite sets 0 for its subprocesses,
# so its database can be dropped at the end.
DATABASES = {
    "default": dj_database_url.parse(
        database_url(f"sqlite:///{VAR_DIR / 'rigdash.sqlite3'}"),
        conn_max_age=env_int("RIGDASH_DB_CONN_MAX_AGE", 60, minimum=0),
        conn_health_checks=True,
    )
}
if AGENT_ONLY:
    DATABASES = {"default": {"ENGINE": "django.db.backends.dummy"}}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web server read while the worker writes; IMMEDIATE takes the write lock at BEGIN so
    # two writers queue on the busy timeout instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    # Turn's covering index (inference/models.py, turn_created_at) declares INCLUDE columns, which only PostgreSQL
    # builds; SQLite makes a plain index on created_at and Django says so at every start (models.W040). The
    # model keeps one declaration for every database, so that migrations are the same everywhere:
    # https://docs.djangoproject.com/en/5.2/ref/models/indexes/#include
    # Likewise the alerts' one-firing-alert-per-rule-and-rig constraint treats an empty rig as a value
    # (nulls_distinct=False), which SQLite cannot (models.W047): there the sampler, the alerts' only writer, keeps it.
    SILENCED_SYSTEM_CHECKS = ["models.W040", "models.W047"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "inference:session_list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
if not AGENT_ONLY:
    STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True  # serve straight from static/ without collectstatic for a local run

# REDIS_URL, or REDIS_HOST and the other REDIS_* parts (docker-compose.yml), the password percent-encoded
# (rigdash.env.redis_url). A rediss:// URL (or REDIS_TLS=1) is TLS, the server's certificate verified: against
# RIGDASH_REDIS_CA_FILE when set, with a client certificate from RIGDASH_REDIS_CERT_FILE and RIGDASH_REDIS_KEY_FILE
# (rigdash/redistls.py writes them onto the URL, which every Redis client of RigDash reads).
REDIS_URL = redistls.with_tls(redis_url("redis://127.0.0.1:6379/0"))
# The central sampler keeps a Redis ACL user per rig with an agent key (inference/live/agents.py acl_ensure), for
# database-free agents such as docker-compose.yml's: its Redis user needs ACL rights (the default user has them).
AGENT_ACL_USERS = env_bool("RIGDASH_AGENT_ACL_USERS", False)

# Pub/sub layer: one PUBLISH per group_send, several times cheaper than the list-based layer's per-member sends.
# It drops nothing silently by capacity; a consumer that misses a batch detects the seq gap and resyncs.
CHANNEL_LAYERS = {
    "default": {
        # channels_redis' pub/sub layer, fanning each message out to idle sockets once (rigdash/channel_layer.py)
        "BACKEND": "rigdash.channel_layer.FanoutPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": env_str("RIGDASH_CHANNEL_PREFIX", "rigdash")},
    }
}

CELERY_BROKER_URL = redistls.with_tls(env_str("CELERY_BROKER_URL", "") or REDIS_URL, name="CELERY_BROKER_URL")
# kombu's Redis transport, with one client object per channel, not one per command (rigdash/broker.py).
CELERY_BROKER_TRANSPORT = (
    "rigdash.broker:Transport" if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else None
)
# Over TLS, the broker verifies as the URL says (kombu alone would not verify a rediss:// URL without ssl_cert_reqs).
CELERY_BROKER_USE_SSL = redistls.ssl_options(CELERY_BROKER_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a turn's task survives a worker lost before it claimed the turn
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Threads, not prefork: a turn's task only waits on the process's one asyncio loop, where every stream of the
# worker runs. One process shares its Redis connections, TLS context and caches, which forked children would each
# hold again (docs/changelog.md compares the pools).
CELERY_WORKER_POOL = env_str("RIGDASH_WORKER_POOL", "threads")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_DEFAULT_QUEUE = env_str("RIGDASH_DEFAULT_QUEUE", "rigdash.default")
# Workers that consume the default queue also consume every enabled rig's queue no worker consumes, without a
# restart (inference/worker/queues.py). Off: each rig's queue is consumed only by workers started with it.
RIGDASH_WORKERS_FOLLOW_RIGS = env_bool("RIGDASH_WORKERS_FOLLOW_RIGS", True)
# An API request's backend request goes out while its turn is stored (docs/streaming.md, step 1a). Off: it goes out
# from the turn's task, as a chat page's does.
RIGDASH_EARLY_LANE = env_bool("RIGDASH_EARLY_LANE", True)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Celery's Django fix-up (5.7) closes a task thread's database connection before and after every task, so the
# beat's dispatch every 5 s would open a new one each time (a PostgreSQL backend started). With a reuse
# count it force-closes only every 2 x N tasks; rigdash.celery closes, around each task, what Django would close
# around a request instead: a connection past CONN_MAX_AGE or broken.
CELERY_DB_REUSE_MAX = 1000

# RigDash behaviour (typed: see rigdash/env.py)
_flush_ceiling_ms = env_int("RIGDASH_FLUSH_INTERVAL_MS", 20, minimum=1, maximum=33)
RIGDASH = RigDashConfig(
    max_message_chars=env_int("RIGDASH_MAX_MESSAGE_CHARS", 16_000, minimum=1),
    max_ws_frame_bytes=env_int("RIGDASH_MAX_WS_FRAME_BYTES", 65_536, minimum=1024, maximum=WS_MAX_BYTES),
    flush_interval_ms=_flush_ceiling_ms,
    flush_min_interval_ms=env_int(
        "RIGDASH_FLUSH_MIN_INTERVAL_MS", min(10, _flush_ceiling_ms), minimum=1, maximum=_flush_ceiling_ms
    ),
    max_reply_tokens=env_int("RIGDASH_MAX_REPLY_TOKENS", 1024, minimum=1, maximum=32_768),
    first_token_timeout_s=env_float("RIGDASH_FIRST_TOKEN_TIMEOUT_S", 120.0, minimum=1.0),
    stall_timeout_s=env_float("RIGDASH_STALL_TIMEOUT_S", 30.0, minimum=1.0),
    model_load_timeout_s=env_float("RIGDASH_MODEL_LOAD_TIMEOUT_S", 300.0, minimum=0.0),
    checkpoint_interval_s=env_float("RIGDASH_CHECKPOINT_INTERVAL_S", 5.0, minimum=0.5),
    backend_health_timeout_s=env_float("RIGDASH_BACKEND_HEALTH_TIMEOUT_S", 2.0, minimum=0.1),
    default_rig_url=env_str("LLAMA_SERVER_URL", "http://127.0.0.1:8081"),
    sample_interval_s=env_float("RIGDASH_SAMPLE_INTERVAL_S", 1.0, minimum=0.2),
    sample_idle_interval_s=env_float("RIGDASH_SAMPLE_IDLE_INTERVAL_S", 5.0, minimum=0.2),
    sample_raw_retention_h=env_float("RIGDASH_SAMPLE_RAW_RETENTION_H", 24.0, minimum=0.1),
    sample_downsampled_retention_d=env_float("RIGDASH_SAMPLE_DOWNSAMPLED_RETENTION_D", 30.0, minimum=1.0),
    metrics_token=env_str("RIGDASH_METRICS_TOKEN", ""),
    agent_timeout_s=env_float("RIGDASH_AGENT_TIMEOUT_S", 5.0, minimum=1.0),
    agent_down_fail_s=env_float("RIGDASH_AGENT_DOWN_FAIL_S", 60.0, minimum=1.0),
)

# Security headers; `manage.py check --deploy` is clean with RIGDASH_SECURE=1 behind TLS.
SECURE = env_bool("RIGDASH_SECURE", False)
SESSION_COOKIE_SECURE = SECURE
CSRF_COOKIE_SECURE = SECURE
SECURE_SSL_REDIRECT = SECURE
SECURE_HSTS_SECONDS = 31_536_000 if SECURE else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE
SECURE_HSTS_PRELOAD = SECURE
# The scheme comes from the socket, or from X-Forwarded-Proto of a trusted proxy (rigdash/proxies.py), never from
# a header any client may send: Django's header check stays off.
SECURE_PROXY_SSL_HEADER = None
if SECURE and not TRUSTED_PROXIES:
    raise ImproperlyConfigured(
        "RIGDASH_SECURE=1 expects a TLS proxy in front: set RIGDASH_TRUSTED_PROXIES to its address, so its "
        "X-Forwarded-Proto is believed (without it every request looks like plain HTTP and is redirected forever)"
    )
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("RIGDASH_LOG_LEVEL", "INFO")},
    # httpx logs every request at INFO: the sampler polls each rig every second, so that was three log lines a
    # second per rig, forever. Failures still reach the logs through RigDash's own warnings.
    # axes logs every login at INFO; its lockouts are WARNING.
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "axes": {"level": "WARNING"},
    },
}

# Turns whose worker died (no checkpoint for RIGDASH_REAP_AFTER_S) end as "interrupted" with their text kept, at the
# next pass (every RIGDASH_REAP_EVERY_S): a user sees a killed worker's turn end within the sum. The wait must stay
# well above the checkpoint interval, which is a running turn's heartbeat.
_reap_after_s = env_float("RIGDASH_REAP_AFTER_S", 60.0, minimum=1.0)
CELERY_BEAT_SCHEDULE = {
    "reap-stale-turns": {
        "task": "inference.turn_reap_stale",
        "schedule": env_float("RIGDASH_REAP_EVERY_S", 30.0, minimum=0.5),
        "kwargs": {"older_than_s": max(_reap_after_s, 2 * RIGDASH.checkpoint_interval_s)},
    },
    # The fair queue's safety net: dispatch waiting turns to free slots (also done on submit and at every
    # turn end) and resend tasks dispatched but never started (a lost message).
    "dispatch-waiting-turns": {"task": "inference.dispatch_all", "schedule": 5.0, "kwargs": {"resend_after_s": 120.0}},
    # A decode sweep whose driver's message was lost (its worker died holding it) is looked at again.
    "resume-sweeps": {"task": "inference.sweeps_resume", "schedule": 30.0, "kwargs": {"silent_s": 60.0}},
    # A rig added, deleted or disabled: the running workers consume its queue or stop (inference/worker/queues.py),
    # also told on every rig save; this pass catches a lost message.
    "reconcile-worker-queues": {
        "task": "inference.worker_queues_reconcile",
        "schedule": env_float("RIGDASH_QUEUES_RECONCILE_S", 30.0, minimum=1.0),
    },
    # An API key past its expiry: its waiting and running requests are cancelled, once (docs/openai.md, "Keys").
    "expire-api-keys": {
        "task": "inference.api_keys_expire",
        "schedule": env_float("RIGDASH_KEY_EXPIRY_EVERY_S", 30.0, minimum=1.0),
    },
    # The texts of a key that stores nothing, of requests whose view did not wipe them (the client went away before
    # the end): wiped once the turn has been over this long (docs/openai.md, "What is stored").
    "forget-api-texts": {
        "task": "inference.api_texts_forget",
        "schedule": 60.0,
        "kwargs": {"older_than_s": env_float("RIGDASH_API_FORGET_AFTER_S", 900.0, minimum=1.0)},
    },
}

# Mail, for alert emails (monitoring/alerts/transports.py): Django's SMTP backend with these settings. Nothing is
# sent unless an email channel is set up on the alerts page.
EMAIL_HOST = env_str("RIGDASH_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("RIGDASH_EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("RIGDASH_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env_str("RIGDASH_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("RIGDASH_EMAIL_STARTTLS", False)
EMAIL_USE_SSL = env_bool("RIGDASH_EMAIL_SSL", False)
EMAIL_TIMEOUT = env_int("RIGDASH_EMAIL_TIMEOUT_S", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("RIGDASH_EMAIL_FROM", "rigdash@localhost")
