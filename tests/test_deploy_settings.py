"""The database from POSTGRES_* parts and Redis from REDIS_* parts (docker-compose.yml): any password reaches
PostgreSQL and Redis as typed. A start on SQLite prints no system-check warning."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit

import dj_database_url
import psycopg
import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from rigdash.env import database_url, redis_url
from rigdash.launcher import ROOT

NASTY = "p@ss/w#rd?x%41:y z&'\"$"
PARTS = ("DATABASE_URL", "POSTGRES_HOST", "POSTGRES_PORT", "POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB")
REDIS_PARTS = ("REDIS_URL", "REDIS_HOST", "REDIS_PORT", "REDIS_DB", "REDIS_PASSWORD", "REDIS_PASSWORD_FILE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*PARTS, "POSTGRES_PASSWORD_FILE", *REDIS_PARTS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_without_either_the_default_stays(clean_env):
    assert database_url("sqlite:///x.sqlite3") == "sqlite:///x.sqlite3"


def test_parts_build_a_url_whose_password_and_names_survive_parsing(clean_env):
    clean_env.setenv("POSTGRES_HOST", "postgres")
    clean_env.setenv("POSTGRES_USER", "rig@dash")
    clean_env.setenv("POSTGRES_PASSWORD", NASTY)
    clean_env.setenv("POSTGRES_DB", "rig/dash#1")
    parsed = dj_database_url.parse(database_url("sqlite:///unused"))
    assert parsed["ENGINE"] == "django.db.backends.postgresql"
    assert (parsed["HOST"], parsed["PORT"]) == ("postgres", 5432)
    assert (parsed["USER"], parsed["PASSWORD"], parsed["NAME"]) == ("rig@dash", NASTY, "rig/dash#1")


def test_database_url_wins_over_parts(clean_env):
    clean_env.setenv("DATABASE_URL", "postgres://a@b:1/c")
    clean_env.setenv("POSTGRES_HOST", "postgres")
    assert database_url("sqlite:///unused") == "postgres://a@b:1/c"


def test_password_file_a_docker_secret(clean_env, tmp_path):
    secret = tmp_path / "pg_password"
    secret.write_text(NASTY + "\n")
    clean_env.setenv("POSTGRES_HOST", "10.0.0.5")
    clean_env.setenv("POSTGRES_PASSWORD_FILE", str(secret))
    assert dj_database_url.parse(database_url(""))["PASSWORD"] == NASTY
    clean_env.setenv("POSTGRES_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="POSTGRES_PASSWORD_FILE"):
        database_url("")


def test_ipv6_host_and_a_bad_port(clean_env):
    clean_env.setenv("POSTGRES_HOST", "::1")
    assert dj_database_url.parse(database_url(""))["HOST"] == "::1"
    clean_env.setenv("POSTGRES_PORT", "54x")
    with pytest.raises(ImproperlyConfigured, match="POSTGRES_PORT"):
        database_url("")


def test_redis_parts_build_a_url_whose_password_survives_parsing(clean_env, tmp_path):
    assert redis_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0", "without either, the default"
    clean_env.setenv("REDIS_HOST", "redis")
    assert redis_url("") == "redis://redis:6379/0", "no password: none in the URL"
    clean_env.setenv("REDIS_PASSWORD", NASTY)
    clean_env.setenv("REDIS_DB", "3")
    url = redis_url("")
    assert url.startswith("redis://:") and url.endswith("@redis:6379/3") and NASTY not in url
    # redis-py (the live state, the channel layer) and kombu (Celery's broker) each decode it to the password.
    kwargs = redis.connection.parse_url(url)
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("redis", 6379, 3, NASTY)
    from kombu.utils.url import url_to_parts

    assert url_to_parts(url).password == NASTY and url_to_parts(url).hostname == "redis"
    clean_env.setenv("REDIS_URL", "redis://elsewhere:1/2")
    assert redis_url("") == "redis://elsewhere:1/2", "REDIS_URL wins over the parts"
    clean_env.delenv("REDIS_URL")
    clean_env.delenv("REDIS_PASSWORD")
    secret = tmp_path / "redis_password"
    secret.write_text(NASTY + "\n")
    clean_env.setenv("REDIS_PASSWORD_FILE", str(secret))
    assert redis.connection.parse_url(redis_url(""))["password"] == NASTY
    clean_env.setenv("REDIS_HOST", "fd00::5")
    assert redis_url("").endswith("@[fd00::5]:6379/3")
    for name, bad in (("REDIS_PORT", "63x9"), ("REDIS_DB", "16"), ("REDIS_PASSWORD_FILE", str(tmp_path / "none"))):
        clean_env.setenv(name, bad)
        with pytest.raises(ImproperlyConfigured, match=name):
            redis_url("")
        clean_env.delenv(name)


def test_manage_check_on_sqlite_prints_no_warning(tmp_path):
    """Turn's covering index (INCLUDE, PostgreSQL's) and the alerts' constraint with nulls not distinct would make
    SQLite say models.W040 and W047 wherever the database's checks run: `migrate`, `runserver`, `check --database`
    (they did before the settings silenced them there)."""
    env = {k: v for k, v in os.environ.items() if k not in (*PARTS, "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'check.sqlite3'}", RIGDASH_VAR_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "manage.py", "check", "--database", "default"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "System check identified no issues (2 silenced).", result.stdout
    assert result.stderr == "", result.stderr
    # On PostgreSQL the index is built with its INCLUDE columns, and nothing is silenced there.
    env["DATABASE_URL"] = os.environ.get("TEST_DATABASE_URL") or os.environ["DATABASE_URL"]
    code = "import django; django.setup(); from django.conf import settings; print(settings.SILENCED_SYSTEM_CHECKS)"
    shown = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE":
                           "rigdash.settings"}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert shown.stdout.strip() == "[]", shown.stderr


def test_settings_connect_through_the_parts(tmp_path):
    """Django's settings, in a fresh process given only POSTGRES_* parts, reach the test server's PostgreSQL.

    The local server may trust 127.0.0.1 (then any password passes): what this proves is that a password with
    ``@``, ``/`` and ``#`` no longer cuts the URL into a wrong host or database name."""
    server = urlsplit(os.environ.get("TEST_DATABASE_URL") or os.environ["DATABASE_URL"])
    with psycopg.connect(host=server.hostname, port=server.port or 5432, user=server.username or "postgres",
                         dbname="postgres", password=server.password or "") as conn:  # fmt: skip
        trust = conn.execute("SELECT current_user").fetchone()
    assert trust is not None
    env = {k: v for k, v in os.environ.items() if k not in PARTS and k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(
        POSTGRES_HOST=server.hostname or "127.0.0.1",
        POSTGRES_PORT=str(server.port or 5432),
        POSTGRES_USER=server.username or "postgres",
        POSTGRES_PASSWORD=server.password or NASTY,
        POSTGRES_DB="postgres",
        RIGDASH_VAR_DIR=str(tmp_path),
    )
    code = (
        "import django; django.setup(); from django.db import connection; "
        "c = connection.cursor(); c.execute('SELECT current_database()'); print(c.fetchone()[0])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**env, "DJANGO_SETTINGS_MODULE": "rigdash.settings"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "postgres"


PROXY = {"HTTP_HOST": "rig.example.com", "HTTP_ORIGIN": "https://rig.example.com",
         "HTTP_REFERER": "https://rig.example.com/login/"}  # fmt: skip


def _login_through_a_tls_proxy(admin_user, *, forwarded_proto: bool) -> int:
    """``forwarded_proto``: the proxy is trusted and says https, so the request's scheme is https (what
    rigdash/proxies.py makes of it; tests/test_trusted_proxies.py checks that through the real server)."""
    client = Client(enforce_csrf_checks=True)
    extra = {**PROXY, "secure": forwarded_proto}
    assert client.get("/login/", **extra).status_code == 200
    data = {"username": admin_user.username, "password": "admin-pw-123",
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value}  # fmt: skip
    return client.post("/login/", data, **extra).status_code


@pytest.mark.django_db
def test_login_behind_a_tls_proxy(admin_user, settings):
    """docs/deploy.md's proxy contract: with RIGDASH_SECURE=1 and a trusted proxy that passes Host and
    X-Forwarded-Proto, the login works; a proxy RigDash does not trust (its X-Forwarded-Proto ignored, the page
    seen as plain HTTP) is the 403 of a CSRF origin mismatch, which RIGDASH_CSRF_TRUSTED_ORIGINS also lifts."""
    admin_user.set_password("admin-pw-123")
    admin_user.save()
    settings.ALLOWED_HOSTS = ["rig.example.com"]
    settings.CSRF_COOKIE_SECURE = settings.SESSION_COOKIE_SECURE = True  # RIGDASH_SECURE=1
    assert _login_through_a_tls_proxy(admin_user, forwarded_proto=True) == 302
    settings.CSRF_COOKIE_SECURE = settings.SESSION_COOKIE_SECURE = False
    assert _login_through_a_tls_proxy(admin_user, forwarded_proto=False) == 403
    settings.CSRF_TRUSTED_ORIGINS = ["https://rig.example.com"]
    assert _login_through_a_tls_proxy(admin_user, forwarded_proto=False) == 302
