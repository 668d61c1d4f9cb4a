"""The compose stack as a user runs it: the repository's docker-compose.yml, driven by docker
compose, with the commands of the README and the Quickstart (docs/getting-started.md) run exactly
as printed.

Only what cannot be the same on a machine without an image registry differs, and it differs in
the open: the variables compose reads (base images, host ports) and one override file, written
here, that builds through the host's network and leaves Grafana out (it has no Debian package).
"""

import base64
import json
import os
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ricochet.handlers.example import ReportRequest

from tests.support import ROOT, free_ports

README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
FAILED_JOBS = ROOT / "docs" / "failed-jobs.md"
WAITING_JOBS = ROOT / "docs" / "waiting-jobs.md"
# The images the tests cannot pull: scripts/engine.sh builds them and names them in these variables.
IMAGE_VARIABLES = ("PYTHON_IMAGE", "RABBITMQ_IMAGE", "PROMETHEUS_IMAGE")
# Every host port compose publishes; the machine's own RabbitMQ may hold the defaults.
PORT_VARIABLES = (
    "RABBITMQ_AMQP_PORT",
    "RABBITMQ_MANAGEMENT_PORT",
    "RABBITMQ_METRICS_PORT",
    "PROMETHEUS_PORT",
    "GRAFANA_PORT",
    "MONITOR_PORT",
)
OVERRIDE = """\
# Written by tests/compose: what differs on a machine with no image registry.
services:
  worker:
    build: {network: host}
  grafana:
    profiles: [grafana]
"""
COMMAND_TIMEOUT_S = 120
BUILD_TIMEOUT_S = 900

T = TypeVar("T")


def section(path: Path, heading: str) -> list[str]:
    """The lines of a Markdown section, from its heading to the next heading of its level or
    above."""
    lines = path.read_text().splitlines()
    level = heading.split(" ")[0]
    start = lines.index(heading) + 1
    end = next(
        (
            i
            for i in range(start, len(lines))
            if re.match(r"#+ ", lines[i]) and len(lines[i].split(" ")[0]) <= len(level)
        ),
        len(lines),
    )
    return lines[start:end]


def commands(lines: list[str], prefix: str) -> list[str]:
    """The shell commands of these lines (in code blocks, indented or fenced) that start with
    prefix, as printed."""
    return [line.strip() for line in lines if line.strip().startswith(prefix)]


def readme_up() -> str:
    """The command the README opens with: the one that starts the stack."""
    (up,) = commands(README.read_text().splitlines()[:8], "docker compose up")
    return up


def quickstart_commands() -> list[str]:
    """The commands of the Quickstart with Docker, in order."""
    found = commands(
        section(GETTING_STARTED, "## With Docker (nothing else needed)"), "docker compose "
    )
    assert found, "the Quickstart with Docker prints no docker compose command"
    return found


def replay_commands() -> list[str]:
    """The replay commands of the operations guide's walk-through, with <id> to fill in."""
    found = commands(
        section(FAILED_JOBS, "## A failing job, from publish to replay"),
        "docker compose exec worker ricochet replay",
    )
    assert len(found) == 2, found
    assert "--dry-run" in found[0], found
    assert "--dry-run" not in found[1], found
    return found


def cancel_command() -> str:
    """The cancel of the operations guide's walk from an alert to the waiting view, with
    MESSAGE_ID to fill in."""
    heading = "## Jobs that keep failing, from alert to the waiting view to a cancel"
    (found,) = commands(section(WAITING_JOBS, heading), "ricochet cancel ")
    assert "MESSAGE_ID" in found, found
    return found


@dataclass(frozen=True)
class Published:
    """A job a Quickstart command published, and what the example handler will do with it."""

    command: str
    message_id: str
    request: ReportRequest

    @property
    def expected(self) -> str:
        if self.request.fail == "permanent":
            return "failed"
        # A job that fails every attempt walks the whole ladder: minutes, too long to wait here.
        assert self.request.fail == "never", f"a job that fails every attempt: {self.command}"
        return "retried" if self.request.fail_times else "succeeded"


def payload_of(command: str) -> ReportRequest:
    """The example handler's view of a `ricochet publish --type report PAYLOAD` command."""
    words = shlex.split(command, comments=True)
    assert words[words.index("publish") + 1 : words.index("publish") + 3] == ["--type", "report"]
    return ReportRequest.model_validate_json(words[-1])


def wait(what: str, timeout_s: float, probe: Callable[[], T | None], every_s: float = 1) -> T:
    """Poll probe until it returns something true (an event found, a check passed) and return
    that; fail naming what it waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def http_get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    """Status and body of a GET, or (0, b"") when nothing answers."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


@dataclass
class Stack:
    """One compose project of the repository's file, on the engine DOCKER_HOST names."""

    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    up_process: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(cls, workdir: Path) -> "Stack":
        missing = [name for name in ("DOCKER_HOST", *IMAGE_VARIABLES) if not os.environ.get(name)]
        assert not missing, (
            f"{', '.join(missing)} unset: run these tests with `make test-compose`, "
            "which starts the engine and builds the base images"
        )
        override = workdir / "compose.override.yml"
        override.write_text(OVERRIDE)
        env = dict(os.environ)
        env["COMPOSE_FILE"] = f"docker-compose.yml:{override}"
        env.update(zip(PORT_VARIABLES, map(str, free_ports(len(PORT_VARIABLES))), strict=True))
        return cls(workdir, env)

    def port(self, variable: str) -> int:
        return int(self.env[variable])

    def dotenv(self, name: str) -> str:
        """A value of the repository's .env, as compose reads it."""
        for line in (ROOT / ".env").read_text().splitlines():
            if line.startswith(f"{name}="):
                return line.partition("=")[2]
        raise AssertionError(f".env sets no {name}")

    def run(self, command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """Run a shell command as printed in the docs; its stdout. A failure fails the test with
        the command and its output."""
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        assert done.returncode == 0, (
            f"`{command}` exited with {done.returncode}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
        return done.stdout

    def compose(self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        return self.run(shlex.join(["docker", "compose", *args]), timeout_s)

    def start(self) -> None:
        """The README's `docker compose up`, in the foreground of a process of its own, as a user
        runs it in one shell while they type the other commands in another."""
        log = (self.workdir / "up.log").open("ab")
        self.up_process = subprocess.Popen(
            ["bash", "-c", readme_up()],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.wait_healthy()

    def up_log(self) -> str:
        path = self.workdir / "up.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def containers(self, all_states: bool = False) -> list[dict[str, Any]]:
        """`docker compose ps` of the running containers (all_states: stopped ones too)."""
        out = self.compose("ps", "--format", "json", *(["--all"] if all_states else []))
        text = out.strip()
        if not text:
            return []
        if text.startswith("["):
            loaded: list[dict[str, Any]] = json.loads(text)
            return loaded
        return [json.loads(line) for line in text.splitlines()]

    def wait_healthy(self, services: tuple[str, ...] = ("rabbitmq", "worker", "monitor")) -> None:
        """Wait until each service's containers pass their health checks (the image's /readyz
        for worker and monitor); fail with the `up` output when they do not."""

        def healthy() -> bool:
            if self.up_process is not None and self.up_process.poll() is not None:
                raise AssertionError(f"`docker compose up` exited:\n{self.up_log()}")
            states = {(c["Service"], c.get("Health", "")) for c in self.containers()}
            return all((s, "healthy") in states for s in services)

        try:
            wait(f"healthy {', '.join(services)}", 180, healthy, every_s=2)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.compose('ps', '-a')}\n{self.up_log()}") from None

    def stop(self) -> None:
        """`docker compose down`; the foreground `up` ends with it."""
        self.compose("down", timeout_s=COMMAND_TIMEOUT_S)
        if self.up_process is not None:
            try:
                self.up_process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.up_process.kill()
                self.up_process.wait()
            self.up_process = None

    def remove(self) -> None:
        """Everything the project made: containers, network, volumes."""
        if self.up_process is not None and self.up_process.poll() is None:
            self.up_process.kill()
            self.up_process.wait()
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5")

    def logs(self, service: str) -> list[dict[str, Any]]:
        """The JSON log events of a service's containers, oldest first per container."""
        out = self.compose("logs", "--no-log-prefix", "--no-color", service)
        # Each line may start with a terminal control sequence (erase line) before the JSON.
        return [json.loads(line[line.index("{") :]) for line in out.splitlines() if "{" in line]

    def events(self, service: str, event: str, message_id: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.logs(service)
            if e.get("event") == event and e.get("message_id") == message_id
        ]

    def ricochet(self, *args: str) -> str:
        """A ricochet command in the worker's container (not one the docs print)."""
        return self.compose("exec", "-T", "worker", "ricochet", *args)

    def queues(self) -> dict[str, dict[str, Any]]:
        """`ricochet status --json`, per queue name."""
        status = json.loads(self.ricochet("status", "--json"))
        return {q["name"]: q for q in status["queues"]}

    def metrics_inside(self, service: str) -> str:
        """A service's /metrics, read from its container (as docs/failed-jobs.md shows)."""
        code = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics').read().decode())"
        return self.compose("exec", "-T", service, "python", "-c", code)

    def http_inside(self, service: str, path: str) -> int:
        """The status a service's own HTTP endpoint answers with, asked from its container (the
        worker's port is not published)."""
        code = (
            "import urllib.request, urllib.error\n"
            "try:\n"
            f"    print(urllib.request.urlopen('http://127.0.0.1:8000{path}', timeout=5).status)\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code)\n"
        )
        return int(self.compose("exec", "-T", service, "python", "-c", code).strip())
