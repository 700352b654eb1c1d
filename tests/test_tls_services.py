"""TLS to Redis and PostgreSQL (docs/deploy.md, "TLS to Redis and PostgreSQL"), against real servers this module
starts: a redis-server on a TLS port and a PostgreSQL cluster with ``ssl=on``, with certificates made here by the
openssl CLI (a CA, a server certificate for localhost and 127.0.0.1, a client certificate, and an unrelated CA).

Each Redis client of RigDash is driven over TLS: the channel layer's publish and subscribe, a Celery task through a
worker started as RigDash starts one, the live state's writes and reads (sync, async and the worker's pipelined
link), the events' pipelined publisher, and redischeck; the settings put the same verified URL in every place. A CA
that did not sign the server's certificate is an error that says so, at once, for Redis and for PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from rigdash import redischeck, redistls
from rigdash.launcher import PYTHON, ROOT, Stack, free_port, worker_command

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path  # signed the server's and the client's certificates
    other_ca: Path  # signed nothing here
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is not installed: no certificates for the TLS tests")
    d = tmp_path_factory.mktemp("tls")
    d.chmod(0o755)  # PostgreSQL's server (another user) reads the server's files
    days = ("-days", "2")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", *days,
             "-subj", "/CN=RigDash test CA", cwd=d)  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.crt", *days,
             "-subj", "/CN=Another CA", cwd=d)  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, cn, ext in (("server", "localhost", ["-extfile", "server.ext"]), ("client", "rigdash", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", *days, *ext, cwd=d)  # fmt: skip
    for path in d.iterdir():
        path.chmod(0o644)
    return Certs(d, d / "ca.crt", d / "other.crt", d / "server.crt", d / "server.key", d / "client.crt",
                 d / "client.key")  # fmt: skip


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 15.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            if "tls" in text.lower() and ("bad directive" in text.lower() or "not supported" in text.lower()):
                pytest.skip(f"this redis-server has no TLS support: {text.strip().splitlines()[-1]}")
            raise AssertionError(f"exited with {proc.returncode}: {text[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout_s} s: {log.read_text(errors='replace')[-2000:]}")


@dataclass(frozen=True)
class TlsRedis:
    port: int  # TLS, client certificates optional
    mtls_port: int  # TLS, client certificates required (a second server)
    plain_port: int  # the first server's plain port

    def url(self, db: int = 3, *, port: int | None = None, host: str = "localhost") -> str:
        return f"rediss://{host}:{port or self.port}/{db}"


@pytest.fixture(scope="module")
def tls_redis(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    logs = tmp_path_factory.mktemp("redis-tls")
    stack = Stack()
    ports = TlsRedis(free_port(), free_port(), free_port())
    common = ["--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
              "--tls-ca-cert-file", str(certs.ca), "--save", "", "--appendonly", "no",
              "--bind", "127.0.0.1", "127.0.0.2"]  # fmt: skip
    try:
        for name, args, port in (
            (
                "redis-tls",
                ["--port", str(ports.plain_port), "--tls-port", str(ports.port), "--tls-auth-clients", "optional"],
                ports.port,
            ),
            (
                "redis-mtls",
                ["--port", "0", "--tls-port", str(ports.mtls_port), "--tls-auth-clients", "yes"],
                ports.mtls_port,
            ),
        ):
            log = logs / f"{name}.log"
            proc = stack.start(name, [server, *args, *common, "--dir", str(logs)], log_path=log)
            _wait_port(port, proc, log)
        yield ports
    finally:
        stack.stop()


@pytest.fixture
def ca_env(monkeypatch: pytest.MonkeyPatch, certs: Certs) -> Certs:
    for var in redistls.FILE_VARIABLES.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RIGDASH_REDIS_CA_FILE", str(certs.ca))
    return certs


# --- the URL every client reads -------------------------------------------------------------------------------------


def test_with_tls_spells_out_verification(ca_env: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    url = redistls.with_tls("rediss://:p%40ss@redis.lan:6380/2")
    assert url.startswith("rediss://:p%40ss@redis.lan:6380/2?")
    assert redistls.ssl_options(url) == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca_env.ca)}
    assert redistls.with_tls(url) == url  # idempotent: the launcher and the settings both apply it
    # The URL's own parameters win; CERT_* spellings are written as both redis-py and kombu take them.
    given = redistls.with_tls(f"rediss://h/0?ssl_cert_reqs=CERT_OPTIONAL&ssl_ca_certs={ca_env.other_ca}")
    assert redistls.ssl_options(given) == {"ssl_cert_reqs": ssl.CERT_OPTIONAL, "ssl_ca_certs": str(ca_env.other_ca)}
    assert "ssl_cert_reqs=optional" in given
    monkeypatch.setenv("RIGDASH_REDIS_CERT_FILE", str(ca_env.client_cert))
    monkeypatch.setenv("RIGDASH_REDIS_KEY_FILE", str(ca_env.client_key))
    options = redistls.ssl_options(redistls.with_tls("rediss://h/0"))
    assert options is not None
    assert (options["ssl_certfile"], options["ssl_keyfile"]) == (str(ca_env.client_cert), str(ca_env.client_key))


def test_with_tls_refuses_what_cannot_work(ca_env: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImproperlyConfigured, match="RIGDASH_REDIS_CA_FILE set, but REDIS_URL is redis://"):
        redistls.with_tls("redis://h:6379/0")
    monkeypatch.setenv("RIGDASH_REDIS_CA_FILE", "/nonexistent/ca.pem")
    with pytest.raises(ImproperlyConfigured, match=r"RIGDASH_REDIS_CA_FILE \('/nonexistent/ca.pem'\) cannot be read"):
        redistls.with_tls("rediss://h/0")
    monkeypatch.delenv("RIGDASH_REDIS_CA_FILE")
    with pytest.raises(ImproperlyConfigured, match="ssl_cert_reqs must be"):
        redistls.with_tls("rediss://h/0?ssl_cert_reqs=maybe")
    monkeypatch.setenv("RIGDASH_REDIS_CERT_FILE", str(ca_env.client_cert))
    with pytest.raises(ImproperlyConfigured, match="needs both"):
        redistls.with_tls("rediss://h/0")
    assert redistls.with_tls("amqp://h//") == "amqp://h//"
    assert redistls.ssl_options("redis://h/0") is None


def _settings_in_subprocess(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-c", f"import django; django.setup()\n{code}"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "rigdash.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_settings_give_every_client_the_verified_url(certs: Certs) -> None:
    """REDIS_HOST parts with REDIS_TLS=1, or REDIS_URL: the same verifying URL for redis-py, the channel layer and
    the broker, whose transport stays RigDash's and whose ssl options verify (kombu alone would not)."""
    for env in (
        {"REDIS_URL": "rediss://:pw@redis.lan:6380/1"},
        {
            "REDIS_URL": "",
            "REDIS_HOST": "redis.lan",
            "REDIS_PORT": "6380",
            "REDIS_DB": "1",
            "REDIS_PASSWORD": "pw",
            "REDIS_TLS": "1",
        },
    ):
        done = _settings_in_subprocess(
            {**env, "RIGDASH_REDIS_CA_FILE": str(certs.ca), "CELERY_BROKER_URL": ""},  # empty: REDIS_URL's
            "import json; from django.conf import settings as s; from rigdash.celery import app\n"
            "print(json.dumps([s.REDIS_URL, s.CHANNEL_LAYERS['default']['CONFIG']['hosts'], s.CELERY_BROKER_URL,"
            " s.CELERY_BROKER_TRANSPORT, s.CELERY_BROKER_USE_SSL,"
            " app.connection_for_write().ssl, app.connection_for_write().transport_cls]))",
        )
        assert done.returncode == 0, done.stderr
        url, hosts, broker, transport, use_ssl, conn_ssl, conn_transport = json.loads(done.stdout.splitlines()[-1])
        assert url.startswith("rediss://:pw@redis.lan:6380/1?") and "ssl_cert_reqs=required" in url
        assert "ssl_ca_certs=" in url and hosts == [url] and broker == url
        assert transport == conn_transport == "rigdash.broker:Transport"
        assert use_ssl == conn_ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(certs.ca)}


def test_settings_refuse_tls_files_for_plain_redis(certs: Certs) -> None:
    done = _settings_in_subprocess({"REDIS_URL": "redis://127.0.0.1:6379/0", "RIGDASH_REDIS_CA_FILE": str(certs.ca)},
                                   "")  # fmt: skip
    assert done.returncode != 0
    assert "RIGDASH_REDIS_CA_FILE set, but REDIS_URL is redis:// (no TLS): use rediss://" in done.stderr


# --- Redis over TLS, each client ----------------------------------------------------------------------------------


def test_redischeck_over_tls(tls_redis: TlsRedis, ca_env: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    assert redischeck.check(redistls.with_tls(tls_redis.url())) == ""
    assert redischeck.check(redistls.with_tls(tls_redis.url(host="127.0.0.1"))) == ""
    # A CA that did not sign Redis's certificate: refused at once (waiting will not help), naming the variable.
    wrong = redistls.with_tls(f"{tls_redis.url()}?ssl_ca_certs={ca_env.other_ca}")
    started = time.monotonic()
    with pytest.raises(redischeck.RedisRefused) as refused:
        redischeck.check(wrong)
    assert time.monotonic() - started < 2
    assert str(refused.value).startswith(f"Redis at localhost:{tls_redis.port}/3 has a TLS certificate RigDash does "
                                         "not trust (self-signed certificate in certificate chain): "
                                         "RIGDASH_REDIS_CA_FILE")  # fmt: skip
    # No CA given: the system's CAs do not know the test CA either.
    monkeypatch.delenv("RIGDASH_REDIS_CA_FILE")
    with pytest.raises(redischeck.RedisRefused, match="RIGDASH_REDIS_CA_FILE"):
        redischeck.check(redistls.with_tls(tls_redis.url()))
    monkeypatch.setenv("RIGDASH_REDIS_CA_FILE", str(ca_env.ca))
    # A name the certificate does not hold.
    with pytest.raises(redischeck.RedisRefused, match=r"has a TLS certificate for another name .*127\.0\.0\.2"):
        redischeck.check(redistls.with_tls(tls_redis.url(host="127.0.0.2")))
    # TLS to the plain port, plain to the TLS port, no client certificate where one is required.
    plain_port = redistls.with_tls(tls_redis.url(port=tls_redis.plain_port))
    assert "did not answer TLS: is that port Redis's tls-port?" in redischeck.check(plain_port, timeout_s=0.5)
    assert "REDIS_URL must be rediss://" in redischeck.check(f"redis://localhost:{tls_redis.port}/3")
    mtls = redistls.with_tls(tls_redis.url(port=tls_redis.mtls_port))
    assert "wants a client certificate (RIGDASH_REDIS_CERT_FILE" in redischeck.check(mtls)


def test_client_certificate(tls_redis: TlsRedis, ca_env: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGDASH_REDIS_CERT_FILE", str(ca_env.client_cert))
    monkeypatch.setenv("RIGDASH_REDIS_KEY_FILE", str(ca_env.client_key))
    assert redischeck.check(redistls.with_tls(tls_redis.url(port=tls_redis.mtls_port))) == ""


@pytest.fixture
def tls_settings(tls_redis: TlsRedis, ca_env: Certs, settings: Any) -> Iterator[str]:
    """settings.REDIS_URL and the channel layer on the TLS Redis, as rigdash/settings.py would set them."""
    from inference import events
    from inference.live import state

    url = redistls.with_tls(tls_redis.url())
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = {
        "default": {**settings.CHANNEL_LAYERS["default"], "CONFIG": {"hosts": [url], "prefix": "tlstest"}}
    }
    state.sync_client.cache_clear()
    events._sync_redis.cache_clear()
    redis.Redis.from_url(url).flushdb()
    yield url
    state.sync_client.cache_clear()
    events._sync_redis.cache_clear()


def test_live_state_over_tls(tls_settings: str) -> None:
    """The live list through the sync client (views), the worker's pipelined link and its async client."""
    from inference.live import state
    from inference.live.link import RedisLink

    state.request_cancel(41)
    assert state.sync_client().get(state.cancel_key(41)) == b"1"
    assert state.sync_client().connection_pool.connection_class.__name__ == "SSLConnection"

    async def worker_writes() -> int:
        from inference.worker import loop

        link = RedisLink(tls_settings)
        pipe = link.pipeline()
        pipe.rpush(state.live_key(41), state.encode_batch(1, 2, "Hello", {}))
        pipe.rpush(state.live_key(41), state.encode_batch(3, 3, " world", {}))
        replies = await pipe.execute()
        assert replies == [1, 2]
        client = loop.redis_for_loop()
        length = int(await client.llen(state.live_key(41)))
        await client.aclose()
        return length

    assert asyncio.run(worker_writes()) == 2
    snapshot = state.snapshot(41)
    assert (snapshot.text, snapshot.seq) == ("Hello world", 3)
    state.forget(41)
    assert state.sync_client().get(state.cancel_key(41)) is None


@pytest.mark.django_db
def test_channel_layer_and_events_over_tls(tls_settings: str) -> None:
    """A group_send through the channel layer (channels_redis' pool from the URL) and the events' pipelined PUBLISH
    both reach a socket's channel subscribed over TLS."""
    from channels.layers import channel_layers, get_channel_layer

    from inference import events
    from rigdash.channel_layer import FanoutPubSubChannelLayer

    channel_layers.backends.clear()
    layer = get_channel_layer()
    assert isinstance(layer, FanoutPubSubChannelLayer)

    async def round_trip() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add("tls-group", channel)
        await layer.group_send("tls-group", {"type": "chat.ping", "n": 1})
        first = await asyncio.wait_for(layer.receive(channel), 5)
        await asyncio.to_thread(events.send_sync, ("tls-group", {"type": "chat.ping", "n": 2}))
        second = await asyncio.wait_for(layer.receive(channel), 5)
        await layer.group_discard("tls-group", channel)
        await layer.flush()
        return [first, second]

    try:
        assert asyncio.run(round_trip()) == [{"type": "chat.ping", "n": 1}, {"type": "chat.ping", "n": 2}]
    finally:
        channel_layers.backends.clear()


def test_channel_layer_wrong_ca_fails_fast(tls_redis: TlsRedis, certs: Certs) -> None:
    from rigdash.channel_layer import FanoutPubSubChannelLayer

    url = f"{tls_redis.url()}?ssl_cert_reqs=required&ssl_ca_certs={certs.other_ca}"
    layer = FanoutPubSubChannelLayer(hosts=[url], prefix="tlswrong")

    async def send() -> None:
        await asyncio.wait_for(layer.group_send("g", {"type": "x"}), 5)

    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(send())


@pytest.mark.django_db(transaction=True)
def test_celery_task_round_trip_over_tls(
    tls_redis: TlsRedis, certs: Certs, service_env: dict[str, str], tmp_path: Path
) -> None:
    """A worker started as RigDash starts one (rigdash.launcher.worker_command), on REDIS_URL=rediss:// with the
    CA from RIGDASH_REDIS_CA_FILE: a control ping and a task, sent by a process with the same settings, arrive and
    are answered; a worker given the wrong CA never connects and says why."""
    queue = f"tls.test{os.getpid()}"
    env = {**service_env, "REDIS_URL": tls_redis.url(db=4), "CELERY_BROKER_URL": "",
           "RIGDASH_REDIS_CA_FILE": str(certs.ca)}  # fmt: skip
    stack = Stack()
    name = f"tls{os.getpid()}@localhost"
    log = tmp_path / "worker.log"
    wrong_log = tmp_path / "wrong.log"
    try:
        stack.start("worker", worker_command(queues=[queue], concurrency=1, name=name, beat_schedule=None),
                    env={**os.environ, **env}, log_path=log)  # fmt: skip
        stack.start("wrong-ca", worker_command(queues=[queue], concurrency=1, name=f"wrong{name}", beat_schedule=None),
                    env={**os.environ, **env, "RIGDASH_REDIS_CA_FILE": str(certs.other_ca)},
                    log_path=wrong_log)  # fmt: skip
        sender = (
            "from rigdash.celery import app\n"
            "import time\n"
            "deadline = time.monotonic() + 60\n"
            f"while not (replies := app.control.ping(destination=[{name!r}], timeout=1)):\n"
            "    assert time.monotonic() < deadline, 'no worker answered'\n"
            "print('ping', replies)\n"
            f"app.send_task('inference.turn_reap_stale', kwargs={{'older_than_s': 3600}}, queue={queue!r})\n"
            "print('sent')\n"
        )
        done = _settings_in_subprocess({**env, "DJANGO_SETTINGS_MODULE": "rigdash.settings"}, sender)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"'{name}': {{'ok': 'pong'}}" in done.stdout
        assert "Defaulting to insecure SSL" not in done.stderr + log.read_text()
        deadline = time.monotonic() + 30
        while "inference.turn_reap_stale[" not in log.read_text() or "succeeded" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        while "CERTIFICATE_VERIFY_FAILED" not in wrong_log.read_text(errors="replace"):
            assert time.monotonic() < deadline, wrong_log.read_text()[-3000:]
            time.sleep(0.2)
        assert "ready." not in wrong_log.read_text(errors="replace")
    finally:
        stack.stop()


# --- PostgreSQL over TLS ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsPostgres:
    port: int

    def url(self, ca: Path, *, sslmode: str = "verify-full", host: str = "localhost") -> str:
        return f"postgres://rigdash:secret@{host}:{self.port}/postgres?sslmode={sslmode}&sslrootcert={ca}"


@pytest.fixture(scope="module")
def tls_postgres(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsPostgres]:
    """A PostgreSQL cluster of its own (initdb in a temporary folder), ``ssl=on``, TCP only with hostssl."""
    if PG_BIN is None or not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL's initdb is not installed")
    base = Path(tempfile.mkdtemp(prefix="rigdash-pg-tls-"))  # not under pytest's folder: the server's user reads it
    base.chmod(0o755)
    data = base / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start a PostgreSQL cluster")
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres")
    key = base / "server.key"
    shutil.copy(certs.server_key, key)
    key.chmod(0o600)
    cert = Path(shutil.copy(certs.server_cert, base / "server.crt"))
    if as_user:
        shutil.chown(key, "postgres")
        shutil.chown(cert, "postgres")
    (base / "pw").write_text("secret\n")
    port = free_port()
    subprocess.run([*as_user, str(PG_BIN / "initdb"), "-D", str(data), "-U", "rigdash", "--pwfile", str(base / "pw"),
                    "-A", "scram-sha-256"], check=True, capture_output=True, timeout=120)  # fmt: skip
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(f"port = {port}\nlisten_addresses = '127.0.0.1,127.0.0.2'\nunix_socket_directories = '{base}'\n"
                   f"ssl = on\nssl_cert_file = '{cert}'\nssl_key_file = '{key}'\n"
                   "fsync = off\nshared_buffers = 16MB\nmax_connections = 20\n")  # fmt: skip
    (data / "pg_hba.conf").write_text("hostssl all all 127.0.0.0/8 scram-sha-256\n")
    log = base / "pg.log"
    subprocess.run([*as_user, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "start"],
                   check=True, capture_output=True, timeout=90)  # fmt: skip
    try:
        yield TlsPostgres(port)
    finally:
        subprocess.run([*as_user, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


def test_database_url_ssl_options_reach_psycopg(tls_postgres: TlsPostgres, certs: Certs) -> None:
    """dj-database-url hands sslmode and sslrootcert to Django's OPTIONS, and Django to psycopg, unchanged: the
    connection is TLS, verified against the CA."""
    url = tls_postgres.url(certs.ca)
    done = _settings_in_subprocess(
        {"DATABASE_URL": url},
        "import json; from django.conf import settings as s; from django.db import connection as c\n"
        "c.ensure_connection()\n"
        "with c.cursor() as cur:\n"
        "    cur.execute('SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()')\n"
        "    row = cur.fetchone()\n"
        "print(json.dumps([s.DATABASES['default']['OPTIONS'], c.connection.info.get_parameters(), row]))",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    options, params, row = json.loads(done.stdout.splitlines()[-1])
    assert options == {"sslmode": "verify-full", "sslrootcert": str(certs.ca)}
    assert params["sslmode"] == "verify-full" and params["sslrootcert"] == str(certs.ca)
    assert row[0] is True and row[1].startswith("TLS")


def test_database_wrong_ca_stops_at_start(tls_postgres: TlsPostgres, certs: Certs) -> None:
    """verify-full with a CA that did not sign the server's certificate, or a name it does not hold: each service's
    start (wait_for_migrations) stops at once and says which setting to change, where it would wait 10 minutes."""
    cases = (
        (tls_postgres.url(certs.other_ca), "sslrootcert must name the CA that signed PostgreSQL's ssl_cert_file"),
        (tls_postgres.url(certs.ca, host="127.0.0.2"), "a name its certificate holds"),
        (tls_postgres.url(Path("/nonexistent/ca.crt")), "sslrootcert must name a readable CA file"),
    )
    for url, words in cases:
        started = time.monotonic()
        done = subprocess.run(
            [PYTHON, "manage.py", "wait_for_migrations", "--timeout", "60"],
            cwd=ROOT, env={**os.environ, "DATABASE_URL": url}, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert done.returncode != 0
        assert time.monotonic() - started < 30
        assert "CommandError: PostgreSQL's TLS: " in done.stderr, done.stderr[-2000:]
        assert words in done.stderr, done.stderr[-2000:]
    # POSTGRES_* parts (docker-compose.yml) with libpq's own PGSSLMODE and PGSSLROOTCERT: the same verification.
    parts = {"DATABASE_URL": "", "POSTGRES_HOST": "localhost", "POSTGRES_PORT": str(tls_postgres.port),
             "POSTGRES_USER": "rigdash", "POSTGRES_PASSWORD": "secret", "POSTGRES_DB": "postgres",
             "PGSSLMODE": "verify-full"}  # fmt: skip
    query = "from django.db import connection as c\nc.ensure_connection()\nprint(c.connection.pgconn.ssl_in_use)"
    done = _settings_in_subprocess({**parts, "PGSSLROOTCERT": str(certs.ca)}, query)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "True", done.stderr[-2000:]
    done = _settings_in_subprocess({**parts, "PGSSLROOTCERT": str(certs.other_ca)}, query)
    assert done.returncode != 0 and "certificate verify failed" in done.stderr
    # And Django's own error, for any other command: psycopg's, naming the certificate.
    done = _settings_in_subprocess(
        {"DATABASE_URL": tls_postgres.url(certs.other_ca)},
        "from django.db import connection\nconnection.ensure_connection()",
    )
    assert done.returncode != 0 and "certificate verify failed" in done.stderr
