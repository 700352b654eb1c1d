"""docker-compose.yml (no Docker engine runs here): it parses, and every command it runs exists here."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import yaml

from rigdash.launcher import ROOT

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def _commands(service: dict) -> list[list[str]]:
    command = service.get("command")
    if command is None:
        return []
    words = shlex.split(command) if isinstance(command, str) else list(command)
    if words[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in " ".join(words[2:]).split("&&")]
    return [words]


def test_compose_has_the_whole_system():
    assert {"web", "worker", "sampler", "redis", "postgres", "llamacpp", "ollama"} <= set(SERVICES)
    assert SERVICES["llamacpp"]["image"].startswith("ghcr.io/ggml-org/llama.cpp:server")
    assert SERVICES["ollama"]["image"].startswith("ollama/ollama")
    assert {"rigdash-data", "postgres-data", "ollama-models"} <= set(COMPOSE["volumes"])
    for name in ("web", "worker"):
        env = SERVICES[name]["environment"]
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert "@postgres:5432/" in env["DATABASE_URL"]
        assert env["RIGDASH_SECRET_KEY"].startswith("${"), "secrets come from the environment"


def test_every_command_the_project_runs_exists():
    from django.core.management import get_commands

    from rigdash.celery import app

    checked = 0
    for name in ("web", "worker", "sampler"):
        for words in _commands(SERVICES[name]):
            if words[:2] == ["python", "manage.py"]:
                assert words[2] in get_commands(), words
            elif words[:2] == ["exec", "python"]:
                _check_web_command(["python", *words[2:]])
            elif words[0] == "celery":
                assert words[1:3] == ["-A", "rigdash"] and app.main == "rigdash"
                queues = words[words.index("-Q") + 1].split(",")
                assert "rigdash.default" in queues and "rig.embedded" in queues
            else:
                raise AssertionError(f"unchecked command in {name}: {words}")
            checked += 1
    assert checked >= 4


def _check_web_command(words: list[str]) -> None:
    """rigdash.webserver as rigdash.launcher.web_command runs it (scripts/run and the tests), on all interfaces."""
    from rigdash.launcher import web_command

    assert words[0] == "python" and words[1:3] == web_command(host="127.0.0.1", port=8000)[1:3]
    assert hasattr(importlib.import_module(words[2]), "main"), words
    assert words[3] == "--host" and words[5:] == ["--port", "8000"], words


def test_the_image_runs_the_web_server_as_scripts_run_does():
    cmd = next(line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    words = json.loads(cmd.removeprefix("CMD "))
    _check_web_command(words)


def test_dockerfile_copies_what_exists():
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), line
    assert Path(ROOT / "manage.py").exists()
