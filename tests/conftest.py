"""Real services for the tests: PostgreSQL (pytest-django's test database), Redis, the embedded
llama-server with SmolLM2, a Celery worker process and, for browser tests, Daphne and Chromium.

Personas: ``owner`` (a user with a chat session), ``other_user`` (must never see the owner's things),
``admin_user``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from rigdash.launcher import ROOT, Stack, free_port, llama_server_command, wait_http, web_command, worker_command

TEST_QUEUE = f"rig.test{os.getpid()}"
TEST_QUEUE_2 = f"{TEST_QUEUE}.second"  # a second rig's (a rig's queue is its own): the test worker consumes both
LOG_DIR = Path(os.environ.get("RIGDASH_VAR_DIR", ROOT / "var" / "test")) / "log"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, and before it is dropped, the end of every other connection to it.

    Threads of this process keep connections that outlive their tests: asgiref's one sync thread (where an async
    test's ``sync_to_async`` calls run) and the worker's claim thread (inference/worker/start.py), which keeps its
    connection open by design.
    Dropping the database failed with "being accessed by other users" and left it behind.

    pytest-django sets up the test database only when a collected test asks for one. Without it the connection
    still names the real database (a RigDash running on this machine), whose connections this must not end."""
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql" and connection.settings_dict["NAME"].startswith("test_"):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture
def broker_down(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """The Celery broker refuses every turn's task (mocked: stopping the machine's Redis would stop every other
    test). Returns what brings it back."""
    from inference.tasks import turns_run_task

    real = turns_run_task.apply_async

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(turns_run_task, "apply_async", refuse)
    return lambda: monkeypatch.setattr(turns_run_task, "apply_async", real)


@pytest.fixture(scope="session", autouse=True)
def _clean_redis() -> None:
    """Tests use their own Redis database (REDIS_URL, db 14 in scripts/test): start it empty."""
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture(scope="session")
def stack(django_db_setup: Any) -> Iterator[Stack]:
    """Processes the tests start; set up after (so stopped before) the test database."""
    processes = Stack()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    yield processes
    processes.stop()


@pytest.fixture(scope="session")
def llama_url(stack: Stack) -> str:
    """The real llama-server (2 slots of 2,048 tokens) serving SmolLM2-135M-Instruct Q4_1."""
    port = free_port()
    proc = stack.start(
        "llama-server",
        llama_server_command(port=port, slots=2, ctx=4096),
        log_path=LOG_DIR / "llama-server.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout_s=120, proc=proc)
    return url


@pytest.fixture
def second_llama(stack: Stack) -> tuple[str, int]:
    """A second llama-server (another 'host'): one slot of 2,048 tokens where the first has two of 2,048."""
    port = free_port()
    proc = stack.start(
        "llama-server-b", llama_server_command(port=port, slots=1, ctx=2048), log_path=LOG_DIR / "llama-b.log"
    )
    wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
    return f"http://127.0.0.1:{port}", proc.pid


def _test_database_url() -> str:
    from django.db import connection

    db = connection.settings_dict
    return f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="session")
def service_env(django_db_setup: Any, django_db_blocker: Any) -> dict[str, str]:
    """Environment for processes that must use the test database and the test Redis."""
    with django_db_blocker.unblock():
        return {
            "DATABASE_URL": _test_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "RIGDASH_CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
            # Replies through the worker stop at 768 tokens: the suite's time stays bounded on a busy machine, and a
            # long story still decodes for 5 s (at 256, ~1.8 s, a page could open after the turn had ended).
            "RIGDASH_MAX_REPLY_TOKENS": "768",
            # No connection outlives its request or task, so the test database can be dropped at the end; a benchmark
            # measures production's connection reuse with RIGDASH_TEST_DB_CONN_MAX_AGE=60 (the processes stop
            # before the database is dropped, and their connections with them).
            "RIGDASH_DB_CONN_MAX_AGE": os.environ.get("RIGDASH_TEST_DB_CONN_MAX_AGE", "0"),
            # The suite's worker consumes only the queues it names: tests add rigs whose queue no worker serves.
            "RIGDASH_WORKERS_FOLLOW_RIGS": "0",
        }


@pytest.fixture(scope="session")
def celery_worker(stack: Stack, service_env: dict[str, str], llama_url: str) -> str:
    """A real Celery worker process consuming the test rig's queue (2 threads: settings.CELERY_WORKER_POOL)."""
    name = f"test{os.getpid()}@localhost"
    stack.start(
        "worker",
        worker_command(queues=[TEST_QUEUE, TEST_QUEUE_2, "rigdash.default"], concurrency=2, name=name,
                       beat_schedule=None),
        env=service_env,
        log_path=LOG_DIR / "worker.log",
    )  # fmt: skip
    from rigdash.celery import app

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(name in reply for reply in app.control.ping(timeout=0.5)):
            return name
    raise TimeoutError(f"celery worker did not answer; see {LOG_DIR / 'worker.log'}")


@pytest.fixture
def sampler_process(service_env: dict[str, str]) -> Iterator[None]:
    """The monitoring sampler process (``manage.py rigdash_sampler``) for one test, against the test database."""
    processes = Stack()
    processes.start(
        "sampler",
        [sys.executable, "manage.py", "rigdash_sampler"],
        env=service_env,
        log_path=LOG_DIR / "sampler.log",
    )
    yield
    processes.stop()


@pytest.fixture(autouse=True)
def _worker_idle_after_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Let the worker finish what it is doing before the test's tables are flushed: a turn's last writes
    (its end, the next dispatch) racing the flush's TRUNCATE can deadlock PostgreSQL."""
    yield
    if "celery_worker" not in request.fixturenames:
        return
    from rigdash.celery import app

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        active = app.control.inspect(timeout=0.5).active() or {}
        if not any(active.values()):
            return


@pytest.fixture(scope="session")
def web_url(stack: Stack, service_env: dict[str, str]) -> str:
    """The web server (uvicorn, as scripts/run starts it) on a free port, against the test database."""
    port = free_port()
    proc = stack.start(
        "web",
        web_command(host="127.0.0.1", port=port),
        env=service_env,
        log_path=LOG_DIR / "web.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/static/rigdash/app.css", timeout_s=60, proc=proc)
    return url


def _user(username: str, **extra: Any) -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username=username, password=f"{username}-pw-123", **extra)


@pytest.fixture
def owner(db: Any) -> Any:
    return _user("owner")


@pytest.fixture
def other_user(db: Any) -> Any:
    return _user("other")


@pytest.fixture
def decode_on_last_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """RIGDASH_DECODE_CPUS naming this machine's last CPU, LLAMA_THREADS* unset; the split's cache cleared around."""
    from rigdash import launcher

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    monkeypatch.delenv("LLAMA_THREADS", raising=False)
    monkeypatch.delenv("LLAMA_THREADS_BATCH", raising=False)
    monkeypatch.setenv("RIGDASH_DECODE_CPUS", str(allowed[-1]))
    launcher._split_of.cache_clear()
    yield allowed
    launcher._split_of.cache_clear()


@pytest.fixture
def admin_user(db: Any) -> Any:
    return _user("admin", is_staff=True, is_superuser=True)


@pytest.fixture
def rig(db: Any, llama_url: str) -> Any:
    from inference.models import Rig

    return Rig.objects.create(name="test-rig", kind=Rig.Kind.LLAMACPP, base_url=llama_url, queue=TEST_QUEUE)


@pytest.fixture
def model_name(llama_url: str) -> str:
    import httpx

    return str(httpx.get(f"{llama_url}/v1/models").json()["data"][0]["id"])


@pytest.fixture
def chat_session(owner: Any, rig: Any, model_name: str) -> Any:
    from inference.models import ChatSession

    return ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)


def session_cookie_for(user: Any) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return str(client.cookies[settings.SESSION_COOKIE_NAME].value)


def llama_busy_slots(llama_url: str) -> int:
    import httpx

    return sum(1 for slot in httpx.get(f"{llama_url}/slots").json() if slot.get("is_processing"))


def wait_until(predicate: Any, *, timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers: a backend hung before its first token."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def synthetic_llama(tmp_path: Path) -> Iterator[list[str]]:
    """Two synthetic llama-servers (bench/synthetic.py: llama.cpp's wire format, one process), one slot each and one
    more always decoding; their base URLs. ``GET <url>/_synthetic/requests`` counts what each was asked."""
    ports = [free_port(), free_port()]
    ports_file = tmp_path / "synthetic-ports"
    ports_file.write_text("\n".join(map(str, ports)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.synthetic", "--ports-file", str(ports_file), "--slots", "1", "--busy-rate", "50"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"READY"
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def page_json(html: str, element_id: str = "page-config") -> Any:
    """The JSON a page embeds in ``<script id=element_id type="application/json">`` (the json_data filter), parsed."""
    import json

    start = f'<script id="{element_id}" type="application/json">'
    assert start in html, f"no {element_id} on the page"
    return json.loads(html.split(start, 1)[1].split("</script>", 1)[0])
