"""Every command of docker-compose.yml and the Dockerfile, run here as Compose would run them (no Docker engine
here): on a fresh, unmigrated PostgreSQL database, in Compose's start order, each waiting for what its
depends_on names (a one-shot's exit 0, a healthcheck that passes: the compose file's own healthcheck commands).
Nothing exits; the sampler and a rig's worker started before migrations wait for them; SIGTERM stops each within
its stop_grace_period; and the sampler stops on SIGTERM as a PID 1 (the kernel drops signals it has no handler
for there), which a PID namespace of its own reproduces.

Redis runs as the compose file's own command (``requirepass`` from REDIS_PASSWORD, a password with characters a URL
must encode) and every RigDash service reaches it through the REDIS_* parts; the rig agent of the bundled llama.cpp
(agent-embedded) starts after migrate beside a real llama-server, finds it by its port, reads its GGUF, heartbeats,
and stops on SIGTERM like the others.

Translated from the compose network to this machine, and said here: the host names postgres and redis (to the
test PostgreSQL server and a private redis-server on a free port), /data and /models (to temporary folders), port
8000 (a free one). The backends' own images (llama.cpp, Ollama) are not RigDash's commands and do not run: the
suite's llama-server stands for the bundled one, on this machine's network and PID namespace (which the agent
shares with it in compose) and with its model at the path it was given rather than under /models.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import psycopg
import pytest
import redis

from inference.live import agents
from rigdash.launcher import ROOT, free_port
from tests import composekit

FRESH_DB = "rigdash_deploy_fresh"
EXTERNAL = {"postgres", "llamacpp", "ollama"}  # images that are not RigDash's; here the test's servers
REDIS_PASSWORD = "r3d/is#p@ss:w%rd $x"
VENV_BIN = str(Path(sys.executable).parent)


def _server() -> Any:
    return urlsplit(os.environ.get("TEST_DATABASE_URL") or os.environ["DATABASE_URL"])


def _admin_sql(*statements: str) -> None:
    server = _server()
    with psycopg.connect(host=server.hostname, port=server.port or 5432, user=server.username or "postgres",
                         password=server.password or "", dbname="postgres", autocommit=True) as conn:  # fmt: skip
        for statement in statements:
            conn.execute(statement)


@pytest.fixture
def fresh_database() -> Iterator[str]:
    drop = f"DROP DATABASE IF EXISTS {FRESH_DB} WITH (FORCE)"
    _admin_sql(drop, f"CREATE DATABASE {FRESH_DB}")
    yield FRESH_DB
    _admin_sql(drop)


class Services:
    """RigDash's services as processes, each with the environment Compose gives its container."""

    def __init__(self, compose: dict[str, Any], env_file: dict[str, str], tmp: Path) -> None:
        self.compose, self.env_file, self.tmp = compose, env_file, tmp
        self.port = free_port()
        self.redis_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        (tmp / "data").mkdir()
        (tmp / "log").mkdir()

    def _host_path(self, word: str) -> str:
        for inside, outside in (("/data", self.tmp / "data"), ("/models", self.tmp / "models"),
                                ("/agent", self.tmp / "agent")):  # fmt: skip
            if word == inside or word.startswith(inside + "/"):
                return str(outside) + word[len(inside) :]
        return word.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")

    def argv(self, words: list[str]) -> list[str]:
        words = [self._host_path(word) for word in words]
        if words[:2] == ["sh", "-c"]:  # the redis service's server and healthcheck, on the private port
            words[2] = words[2].replace("redis-server ", f"redis-server --port {self.redis_port} ")
            words[2] = words[2].replace("redis-cli ", f"redis-cli -p {self.redis_port} ")
        for index, word in enumerate(words[:-1]):
            if word == "--port" and words[index + 1] == "8000":
                words[index + 1] = str(self.port)
            if word == "--host" and words[index + 1] == "0.0.0.0":  # noqa: S104 - what the container binds
                words[index + 1] = "127.0.0.1"
        return words

    def env(self, name: str) -> dict[str, str]:
        server = _server()
        service = self.compose["services"][name]
        dropped = ("DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
        env = {key: value for key, value in os.environ.items() if key not in dropped}
        agent = "REDIS_URL_FILE" in (service.get("environment") or {})  # a bundled rig agent: no env_file
        if not agent:
            env.update(self.env_file)  # env_file: .env
        else:  # an agent: none of RigDash's secrets, not even from the suite's environment
            env = {key: value for key, value in env.items() if not key.startswith(("RIGDASH_", "POSTGRES_"))}
        env.update({key: str(value) for key, value in (service.get("environment") or {}).items()})
        env.pop("REDIS_URL", None)  # the suite's; the services build theirs from the REDIS_* parts
        if "REDIS_URL_FILE" in env:  # an agent: its ACL user's URL, from its init
            env["REDIS_URL_FILE"] = self._host_path(env["REDIS_URL_FILE"])
        elif name != "redis":
            assert env.get("POSTGRES_HOST") == "postgres" and env.get("REDIS_HOST") == "redis", name
        env.update(
            POSTGRES_HOST=server.hostname or "127.0.0.1",
            POSTGRES_PORT=str(server.port or 5432),
            REDIS_HOST="127.0.0.1",
            REDIS_PORT=str(self.redis_port),
            RIGDASH_VAR_DIR=self._host_path(env.get("RIGDASH_VAR_DIR", "/data")),
            RIGDASH_CHANNEL_PREFIX=f"rigdash-deploy-{os.getpid()}",
            HOSTNAME=socket.gethostname(),  # Docker sets it; the workers' healthchecks name the worker by it
            PATH=f"{VENV_BIN}:{os.environ['PATH']}",
        )
        if agent:
            for key in ("POSTGRES_HOST", "POSTGRES_PORT", "RIGDASH_VAR_DIR"):
                env.pop(key)
            assert not {"DATABASE_URL", "RIGDASH_SECRET_KEY", "POSTGRES_PASSWORD", "REDIS_PASSWORD"} & set(env), name
        return env

    def start(self, name: str) -> subprocess.Popen[bytes]:
        words = composekit.command_words(self.compose["services"][name])
        log = open(self.tmp / "log" / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(self.argv(words), cwd=ROOT, env=self.env(name), stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / "log" / f"{name}.log").read_text(errors="replace")

    def healthy(self, name: str) -> bool:
        argv = composekit.healthcheck_argv(self.compose["services"][name])
        assert argv is not None, name
        timeout = composekit.duration_s(self.compose["services"][name]["healthcheck"].get("timeout"), 30)
        try:
            result = subprocess.run(self.argv(argv), cwd=ROOT, env=self.env(name), capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False  # as Docker counts it: a failed attempt, tried again
        return result.returncode == 0

    def wait_for(self, dependency: str, condition: str) -> None:
        if dependency in EXTERNAL:
            return  # the test's PostgreSQL and Redis are up (the suite uses them)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            proc = self.procs[dependency]
            if condition == "service_completed_successfully":
                if proc.poll() is not None:
                    assert proc.returncode == 0, f"{dependency} exited {proc.returncode}:\n{self.log(dependency)}"
                    return
            elif condition == "service_healthy":
                assert proc.poll() is None, f"{dependency} exited:\n{self.log(dependency)}"
                if self.healthy(dependency):
                    return
            else:
                return
            time.sleep(0.5)
        raise AssertionError(f"{dependency} not {condition}:\n{self.log(dependency)}")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


METRICS_TOKEN = "deploy-test-metrics-token"


@pytest.fixture
def services(tmp_path: Path, fresh_database: str, llama_url: str) -> Iterator[Services]:
    compose = composekit.load()
    env_file = {
        **composekit.read_env_file(),
        "POSTGRES_PASSWORD": "p@ss/w#rd?%",  # parts, percent-encoded (the local server may not ask for it)
        "POSTGRES_USER": _server().username or "postgres",
        "POSTGRES_DB": fresh_database,
        "RIGDASH_SECRET_KEY": "deploy-test-" + "k" * 40,
        "RIGDASH_ADMIN_PASSWORD": "a-long-admin-password",
        "REDIS_PASSWORD": REDIS_PASSWORD,
        "LLAMA_SERVER_URL": llama_url,  # the suite's llama-server, standing for the bundled one (agent-embedded's)
        "RIGDASH_OLLAMA_URL": "http://ollama:11434",  # a single-label host, as on the compose network
        "RIGDASH_DB_CONN_MAX_AGE": "0",  # the fresh database can be dropped at the end
        "RIGDASH_METRICS_TOKEN": METRICS_TOKEN,  # /healthz's details are for the token (anonymous: up or down)
    }
    model = tmp_path / "SmolLM2-stand-in.gguf"
    model.write_bytes(b"GGUF" + bytes(1024))
    env_file["LLAMA_MODEL_PATH"] = str(model)  # rigdash.seedmodel's source here; in the image, the wheel's file
    compose = composekit.interpolate(compose, env_file)
    running = Services(compose, env_file, tmp_path)
    yield running
    running.stop_all()


def _still_running(services: Services, names: list[str]) -> None:
    for name in names:
        assert services.procs[name].poll() is None, f"{name} exited:\n{services.log(name)}"


def test_services_start_in_compose_order_on_a_fresh_database_and_stop_on_sigterm(services):
    profiles = set(composekit.read_env_file()["COMPOSE_PROFILES"].split(","))
    active = composekit.active_services(services.compose, profiles)
    order = [name for name in composekit.start_order(active) if name not in EXTERNAL]
    assert order[0] == "redis" and order.index("migrate") < order.index("web")
    assert order.index("migrate") < order.index("agent-embedded")
    services.start("redis")
    services.wait_for("redis", "service_healthy")  # the compose healthcheck, through the password
    anonymous = redis.Redis(port=services.redis_port)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()

    # Started on their own before migrate ran (`docker compose up sampler`, a restart): they wait, not die.
    early = ["sampler", "worker-embedded"]
    for name in early:
        services.start(name)
    deadline = time.monotonic() + 60
    while not all("waiting for migrations" in services.log(name) for name in early):
        _still_running(services, early)
        assert time.monotonic() < deadline, [services.log(name) for name in early]
        time.sleep(0.2)
    time.sleep(2)
    _still_running(services, early)

    for name in order[1:]:
        for dependency, condition in composekit.depends_on(active[name]).items():
            services.wait_for(dependency, condition)
        if name not in services.procs:
            services.start(name)
    long_running = [name for name in order if active[name].get("restart") != "no"]
    for name in long_running:  # every healthcheck the compose file has passes
        if "healthcheck" in active[name]:
            services.wait_for(name, "service_healthy")
    time.sleep(2)
    _still_running(services, long_running)
    for name in early:
        assert "migrations applied" in services.log(name)
    assert "admin account: admin (password from RIGDASH_ADMIN_PASSWORD)" in services.log("migrate")
    assert (services.tmp / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes()[:4] == b"GGUF"

    deadline = time.monotonic() + 60
    while "rig agent " not in services.log("agent-embedded"):  # its first heartbeat follows at once
        _still_running(services, ["agent-embedded"])
        assert time.monotonic() < deadline, services.log("agent-embedded")
        time.sleep(0.5)
    time.sleep(1.5)
    headers = {"Host": "localhost", "Authorization": f"Bearer {METRICS_TOKEN}"}
    body = httpx.get(f"http://127.0.0.1:{services.port}/healthz", headers=headers, timeout=30).json()
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]
    assert {name: check["ok"] for name, check in body["checks"]["queues"].items()} == {"embedded": True, "ollama": True}
    assert body["checks"]["rigs"]["ollama"]["url"] == "http://ollama:11434"
    assert body["down"] == ["rig:ollama"], "only the Ollama backend, which does not run here, is down"
    _check_the_agent(services, body["checks"]["rigs"]["embedded"])
    with httpx.Client(base_url=f"http://127.0.0.1:{services.port}", timeout=30) as web:
        # Static files come from the image's folders (no collectstatic into the data volume).
        assert web.get("/static/rigdash/app.css").status_code == 200
        assert web.get("/static/admin/css/base.css").status_code == 200
        # The admin account migrate created logs in through the web server (CSRF and all).
        web.get("/login/")
        login = web.post("/login/", data={"username": "admin", "password": "a-long-admin-password",
                                          "csrfmiddlewaretoken": web.cookies["csrftoken"]})  # fmt: skip
        assert login.status_code == 302, login.text[:500]
        assert web.get("/admin/inference/rig/").status_code == 200

    # `docker compose stop`: SIGTERM to each, then SIGKILL after its stop_grace_period.
    for name in reversed(long_running):
        grace = composekit.duration_s(active[name].get("stop_grace_period"))
        proc = services.procs[name]
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running {grace:.0f} s after SIGTERM:\n{services.log(name)}") from None
        assert proc.returncode in (0, -signal.SIGTERM), (name, proc.returncode, services.log(name))
        print(f"{name}: stopped {time.monotonic() - began:.1f} s after SIGTERM (grace {grace:.0f} s)")


def _check_the_agent(services: Services, embedded: dict[str, Any]) -> None:
    """agent-embedded-init issued the rig's key and made the agent's Redis user; agent-embedded, without the
    database, heartbeats, and samples the backend where it runs: its process
    found by the rig's port and its GGUF file's header read at the path llama-server reports."""
    assert embedded["ok"] and embedded["agent"]["up"], embedded
    assert "rig agent" in services.log("agent-embedded")
    server = _server()
    with psycopg.connect(host=server.hostname, port=server.port or 5432, user=server.username or "postgres",
                         password=server.password or "", dbname=FRESH_DB) as conn:  # fmt: skip
        row = conn.execute("SELECT id, agent_key FROM inference_rig WHERE name = 'embedded'").fetchone()
    assert row is not None and len(row[1]) >= 32, "the key was issued by the agent's init"
    assert (services.tmp / "agent" / "key").read_text().strip() == row[1]
    assert (services.tmp / "agent" / "key").stat().st_mode & 0o777 == 0o400
    assert "without the database" in services.log("agent-embedded")
    client = redis.Redis(port=services.redis_port, password=REDIS_PASSWORD)
    deadline = time.monotonic() + 60
    while True:
        sample = agents.open_envelope(row[1], row[0], client.get(agents.sample_key(row[0])))  # type: ignore[arg-type]
        detail = (sample or {}).get("detail", {})
        if detail.get("sources", {}).get("kv", {}).get("ok"):
            break
        assert time.monotonic() < deadline, detail
        time.sleep(1)
    client.close()
    assert detail["provenance"]["host"].startswith("agent on "), detail["provenance"]
    assert detail["sources"]["process"]["ok"], detail["sources"]
    assert detail["process"]["name"].startswith("llama-server"), detail["process"]
    assert detail["provenance"]["kv"] == "the GGUF file's header"


def _pid1(argv: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], psutil.Process]:
    """``argv`` as PID 1 of a PID namespace of its own, as in a container without an init."""
    with open(log, "ab") as out:
        outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *argv], cwd=ROOT, env=env,
                                 stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 10
    while not (children := psutil.Process(outer.pid).children()):
        assert time.monotonic() < deadline and outer.poll() is None, log.read_text()
        time.sleep(0.05)
    return outer, children[0]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is needed for a PID namespace")
@pytest.mark.django_db
def test_the_sampler_stops_on_sigterm_as_pid_1(service_env, tmp_path):
    env = {**os.environ, **service_env, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "RIGDASH_VAR_DIR": str(tmp_path)}
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here: {probe.stderr.decode().strip()}")
    # The harness reproduces PID 1: a process with no SIGTERM handler ignores SIGTERM there.
    outer, control = _pid1([sys.executable, "-c", "import time; time.sleep(60)"], env, tmp_path / "control.log")
    try:
        control.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            outer.wait(timeout=2)
    finally:
        outer.kill()
        outer.wait()
    compose = composekit.load()
    sampler = compose["services"]["sampler"]
    outer, pid1 = _pid1(composekit.command_words(sampler), env, tmp_path / "sampler.log")
    try:
        deadline = time.monotonic() + 60
        # A signal sent before the handler exists is dropped (PID 1): the sampler says when it has one.
        while "sampler running" not in (tmp_path / "sampler.log").read_text():
            assert time.monotonic() < deadline and outer.poll() is None, (tmp_path / "sampler.log").read_text()
            time.sleep(0.2)
        assert pid1.cmdline()[1:3] == ["manage.py", "rigdash_sampler"], "wait_for_migrations exec'd the sampler"
        pid1.send_signal(signal.SIGTERM)
        outer.wait(timeout=composekit.duration_s(sampler.get("stop_grace_period")))
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()
    assert outer.returncode == 0, (tmp_path / "sampler.log").read_text()
    assert "sampler stopped" in (tmp_path / "sampler.log").read_text()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is needed for a PID namespace")
def test_a_service_still_waiting_for_migrations_stops_on_sigterm_as_pid_1(tmp_path):
    """`docker compose stop` while the database is not there yet: the wait ends at once, even as PID 1."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here: {probe.stderr.decode().strip()}")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    env.update(POSTGRES_HOST="127.0.0.1", POSTGRES_PORT=str(free_port()), RIGDASH_VAR_DIR=str(tmp_path),
               PATH=f"{VENV_BIN}:{os.environ['PATH']}")  # fmt: skip
    log = tmp_path / "worker.log"
    outer, pid1 = _pid1(composekit.command_words(composekit.load()["services"]["worker"]), env, log)
    try:
        deadline = time.monotonic() + 60
        while "waiting for migrations" not in log.read_text():
            assert time.monotonic() < deadline and outer.poll() is None, log.read_text()
            time.sleep(0.2)
        pid1.send_signal(signal.SIGTERM)
        outer.wait(timeout=5)
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()
    assert outer.returncode == 128 + signal.SIGTERM, log.read_text()
