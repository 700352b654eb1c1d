"""docker-compose.yml read the way Compose reads it, for tests that run its commands here (no Docker engine):
variable interpolation from an .env file, service order from depends_on, healthchecks and grace periods."""

from __future__ import annotations

import graphlib
import re
from pathlib import Path
from typing import Any

import yaml

from rigdash.launcher import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
GPU_FILE = ROOT / "docker-compose.gpu.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DEFAULT_GRACE_S = 10.0  # Compose's stop_grace_period when none is set

_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?$", re.S)


class MissingVariable(KeyError):
    """A ${VAR:?message} or ${VAR?message} whose variable is unset (or empty, with the colon)."""


def load(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """KEY=VALUE lines; '#' lines are comments; a value in single quotes is literal, in double quotes unquoted."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def documented_variables(path: Path = ENV_EXAMPLE) -> set[str]:
    """Variables the file sets or shows commented out (``# NAME=value``)."""
    return set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", path.read_text(), re.M))


def referenced_variables(path: Path) -> set[str]:
    names = set()
    for match in _VAR.finditer(path.read_text()):
        text = match.group("braced") or match.group("plain")
        if text:
            names.add(re.split(r"[:?\-+]", text, maxsplit=1)[0])
    return names


def _substitute(text: str, env: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("plain"):
            return env.get(match.group("plain"), "")
        parts = _BRACED.match(match.group("braced"))
        if parts is None:
            raise ValueError(f"bad interpolation {match.group(0)!r}")
        name, op, arg = parts.group("name"), parts.group("op"), parts.group("arg") or ""
        value = env.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in ("-", ":-"):
            return _substitute(arg, env) if unset else str(value)
        if op in ("?", ":?"):
            if unset:
                raise MissingVariable(f"{name}: {arg}")
            return str(value)
        if op in ("+", ":+"):
            return "" if unset else _substitute(arg, env)
        return value or ""

    return _VAR.sub(one, text)


def interpolate(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _substitute(node, env)
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    return node


def active_services(compose: dict[str, Any], profiles: set[str]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose["services"].items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """{dependency: condition}, from either form of depends_on."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def start_order(services: dict[str, dict[str, Any]]) -> list[str]:
    """An order Compose may start them in: every service after what it depends on (file order otherwise)."""
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for name, service in services.items():
        sorter.add(name, *[dep for dep in depends_on(service) if dep in services])
    sorter.prepare()
    order: list[str] = []
    position = {name: index for index, name in enumerate(services)}
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        order.extend(ready)
        sorter.done(*ready)
    return order


def duration_s(text: str | None, default: float = DEFAULT_GRACE_S) -> float:
    """Compose durations: 1m30s, 10s, 500ms."""
    if not text:
        return default
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(text))
    assert parts, f"not a duration: {text!r}"
    return sum(float(value) * units[unit] for value, unit in parts)


def command_words(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert isinstance(command, list), "RigDash's services spell their command as a list (no shell quoting)"
    return [str(word) for word in command]


def healthcheck_argv(service: dict[str, Any]) -> list[str] | None:
    test = (service.get("healthcheck") or {}).get("test")
    if not test:
        return None
    if test[0] == "CMD-SHELL":
        return ["sh", "-c", test[1]]
    assert test[0] == "CMD", test
    return [str(word) for word in test[1:]]
