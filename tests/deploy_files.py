"""Readers for the deployment files (Dockerfile, docker-compose.yml, config/ricochet.env)."""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import ROOT

DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
ENV_FILE = ROOT / "config" / "ricochet.env"
RICOCHET_IMAGE = "ricochet:local"


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    args: str

    def exec_form(self) -> list[str]:
        """The JSON-array form of CMD, ENTRYPOINT or a HEALTHCHECK's CMD."""
        return list(json.loads(self.args[self.args.index("[") :]))


def dockerfile() -> list[Instruction]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            found.append(Instruction(keyword.upper(), " ".join(args.split())))
    return found


def only(keyword: str) -> Instruction:
    """The instruction that takes effect (the last one of its kind)."""
    matching = [i for i in dockerfile() if i.keyword == keyword]
    assert matching, f"the Dockerfile has no {keyword}"
    return matching[-1]


def copied_sources() -> list[str]:
    """What the Dockerfile copies from the build context, as paths relative to it."""
    sources = []
    for instruction in dockerfile():
        if instruction.keyword == "COPY":
            sources.extend(instruction.args.split()[:-1])
    return sources


@dataclass(frozen=True)
class EnvFile:
    """config/ricochet.env: assignments, and settings only documented in a comment."""

    values: dict[str, str]
    commented: dict[str, str]
    lines: list[str]


def env_file() -> EnvFile:
    lines = ENV_FILE.read_text().splitlines()
    values, commented = {}, {}
    for line in lines:
        if m := re.fullmatch(r"(RICOCHET_\w+)=(.*)", line):
            values[m[1]] = m[2]
        elif m := re.fullmatch(r"# (RICOCHET_\w+)=(.*)", line):
            commented[m[1]] = m[2]
    return EnvFile(values, commented, lines)


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


# What the Quickstart (docs/getting-started.md) writes to .env: the variables compose requires.
QUICKSTART_ENV = {"RABBITMQ_PASSWORD": "from-dot-env", "GRAFANA_ADMIN_PASSWORD": "from-dot-env"}
# Compose's ${NAME}, ${NAME:-default} and ${NAME:?error}.
VARIABLE = re.compile(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}")


class MissingVariable(Exception):
    """Raised where compose refuses to start: a ${NAME:?error} variable is unset or empty."""


def interpolate(value: str, environ: dict[str, str] = QUICKSTART_ENV) -> str:
    """A compose value with its variables substituted from environ, as compose does."""

    def substitute(m: re.Match[str]) -> str:
        if environ.get(m[1]):
            return environ[m[1]]
        if m[2] == ":?":
            raise MissingVariable(m[3])
        return m[3] or ""

    return VARIABLE.sub(substitute, value)


def ricochet_services() -> dict[str, dict[str, Any]]:
    """The services that run the ricochet image."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if service.get("image") == RICOCHET_IMAGE
    }


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    """What a ricochet container sees: its env_file, overridden by its environment block."""
    assert service["env_file"] == str(ENV_FILE.relative_to(ROOT)), service["env_file"]
    env = dict(env_file().values)
    env.update({k: interpolate(str(v)) for k, v in service.get("environment", {}).items()})
    return env


def duration_s(text: str) -> float:
    """A compose duration (1m30s, 45s, 500ms) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", text)
    assert "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts: path in the container -> file or directory in the repository."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            found[target] = COMPOSE.parent / source
    return found


def mounted(service: dict[str, Any], container_path: str) -> Path:
    """The repository file a container sees at container_path, through one of its bind mounts."""
    for target, source in mounts(service).items():
        if container_path == target or container_path.startswith(target + "/"):
            return source / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"nothing is mounted at {container_path}")


def datasource_uids(node: Any) -> set[str]:
    """The uids of every datasource a Grafana dashboard (or any part of it) refers to."""
    if isinstance(node, list):
        return set().union(*map(datasource_uids, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["datasource"]["uid"]} if isinstance(node.get("datasource"), dict) else set()
    return found.union(*(datasource_uids(v) for k, v in node.items() if k != "datasource"))
