"""The deployment files agree with the code: settings, commands, endpoints, ports, timeouts."""

import json
import os
import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from aiohttp import web
from packaging.requirements import Requirement
from prometheus_client import CollectorRegistry
from ricochet.cli import main
from ricochet.service.http import routes
from ricochet.settings import ENV_PREFIX, Settings, load_settings, variable_name

from tests.deploy_files import (
    COMPOSE,
    RICOCHET_IMAGE,
    VARIABLE,
    MissingVariable,
    compose,
    copied_sources,
    datasource_uids,
    dockerfile,
    duration_s,
    env_file,
    interpolate,
    mounted,
    mounts,
    only,
    ricochet_services,
    service_environment,
)
from tests.support import ROOT

SETTINGS = {variable_name(name) for name in Settings.model_fields}
# The commands SPEC section 6 names; a service may only run one of these.
SPEC_COMMANDS = {"worker", "monitor", "topology", "status", "replay", "publish"}


def load(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> Settings:
    """Settings exactly as a process with this RICOCHET_* environment builds them."""
    for key in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(key)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    return load_settings()


def test_env_file_names_every_setting_and_nothing_else() -> None:
    """config/ricochet.env sets (or, for the URL, documents) each setting, and only settings."""
    env = env_file()
    named = set(env.values) | set(env.commented)
    assert named - SETTINGS == set(), "not settings of ricochet.settings.Settings"
    assert SETTINGS - named == set(), "settings missing from config/ricochet.env"


def test_env_file_explains_each_setting() -> None:
    """Every variable line of config/ricochet.env follows a comment line of its own."""
    lines = env_file().lines
    for i, line in enumerate(lines):
        if re.match(r"(# )?RICOCHET_\w+=", line):
            above = lines[i - 1]
            assert above.startswith("# "), f"no comment above {line}"
            assert not re.match(r"# RICOCHET_\w+=", above), f"no comment above {line}"


def test_env_file_values_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The values in config/ricochet.env pass the same validation the CLI applies."""
    settings = load(monkeypatch, env_file().values)
    assert settings.http_port != 0, "the image's health check needs the HTTP port"


def test_compose_runs_worker_and_monitor() -> None:
    """The stack has a worker (the image's default command) and a monitor service."""
    services = ricochet_services()
    assert "command" not in services["worker"]
    assert only("CMD").exec_form() == ["worker"]
    assert services["monitor"]["command"] == ["monitor"]


@pytest.mark.parametrize("name", sorted(ricochet_services()))
def test_service_command_exists(name: str) -> None:
    """A ricochet service runs a command that SPEC names and the click CLI provides."""
    command = ricochet_services()[name].get("command", only("CMD").exec_form())
    assert command[0] in SPEC_COMMANDS, f"service {name}: {command[0]!r} is not in SPEC"
    assert command[0] in main.commands, (
        f"service {name} runs `ricochet {command[0]}`, which the CLI does not have "
        f"(it has: {', '.join(sorted(main.commands))})"
    )


def test_ricochet_services_connect_to_the_compose_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker and monitor get valid settings whose broker is the rabbitmq service, as its user."""
    broker = compose()["services"]["rabbitmq"]["environment"]
    for name, service in ricochet_services().items():
        env = service_environment(service)
        assert set(env) <= SETTINGS, f"service {name} sets unknown RICOCHET_* variables"
        url = urlsplit(load(monkeypatch, env).amqp_url)
        assert url.hostname == "rabbitmq", name
        assert url.username == interpolate(broker["RABBITMQ_DEFAULT_USER"]), name
        assert url.password == interpolate(broker["RABBITMQ_DEFAULT_PASS"]), name
        assert url.username != "guest", "guest can only log in from the broker's own host"


def test_stop_grace_outlasts_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose waits longer than RICOCHET_SHUTDOWN_TIMEOUT_S before it kills a container."""
    for name, service in ricochet_services().items():
        drain_s = load(monkeypatch, service_environment(service)).shutdown_timeout_s
        assert duration_s(service["stop_grace_period"]) > drain_s, name
    assert only("STOPSIGNAL").args == "SIGTERM"


def test_ricochet_services_can_scale() -> None:
    """No container_name on worker and monitor, and no host port on the worker, so
    `--scale worker=N` works; the one monitor publishes its console's port."""
    for name, service in ricochet_services().items():
        assert "container_name" not in service, name
        assert ("ports" in service) == (name == "monitor"), name


def test_published_ports_are_loopback_only() -> None:
    """Every published port is bound to 127.0.0.1: the broker's three, Prometheus, Grafana, the
    monitor's (the failed-jobs console); each host port is a variable whose default is the
    container's own port."""
    published = []
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"service {name} publishes {port}"
            host = str(port).removeprefix("127.0.0.1:").rsplit(":", 1)[0]
            assert re.fullmatch(r"\$\{\w+_PORT:-\d+\}", host), f"service {name}: {port}"
            _, default, container = interpolate(str(port)).split(":")
            assert default == container, f"service {name}: {port}"
            published.append(default)
    assert sorted(published) == ["15672", "15692", "3000", "5672", "8000", "9090"]


def test_compose_builds_the_ricochet_image_once() -> None:
    """One service builds ricochet's image (with the Dockerfile's base as an argument) under
    its name; the others run that image, neither building it again (which left a dangling
    copy of it) nor pulling it from a registry that has none."""
    services = ricochet_services()
    builders = [name for name, service in services.items() if "build" in service]
    assert builders == ["worker"]
    assert services["worker"]["build"] == {"context": ".", "args": ["PYTHON_IMAGE"]}
    for name, service in services.items():
        if name != "worker":
            assert service["pull_policy"] == "never", name
    assert set(services) == {"worker", "monitor"}


def test_images_are_variables_with_pinned_defaults() -> None:
    """Each image the stack pulls can be replaced (a registry mirror, a local build) by a
    variable, and defaults to a pinned tag; the Dockerfile's base is a build argument."""
    for name, service in compose()["services"].items():
        if service["image"] == RICOCHET_IMAGE:
            continue
        assert re.fullmatch(r"\$\{\w+_IMAGE:-[^}]+:v?\d+\.\d+\.\d+[^}]*\}", service["image"]), name
    arg = next(i for i in dockerfile() if i.keyword == "ARG" and i.args.startswith("PYTHON_IMAGE="))
    assert next(i for i in dockerfile() if i.keyword == "FROM").args == "${PYTHON_IMAGE}"
    assert dockerfile().index(arg) < dockerfile().index(only("FROM"))


def test_every_mounted_config_file_exists() -> None:
    """Each bind mount of the stack names a file or directory of the repository."""
    for name, service in compose()["services"].items():
        for target, source in mounts(service).items():
            assert source.exists(), f"service {name}: {source} (mounted at {target}) is missing"


def test_prometheus_scrapes_every_ricochet_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus scrapes worker and monitor on their RICOCHET_HTTP_PORT, the broker on 15692,
    and loads rule files that are mounted next to its config."""
    prometheus = compose()["services"]["prometheus"]
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", interpolate(prometheus["image"]))
    config_path = mounted(prometheus, "/etc/prometheus/prometheus.yml")
    config = yaml.safe_load(config_path.read_text())
    for rule_file in config["rule_files"]:
        assert mounted(prometheus, f"/etc/prometheus/{rule_file}").is_file(), rule_file
    targets = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            targets.update({name: sd["port"] for name in sd["names"]})
        for static in job.get("static_configs", []):
            targets.update(dict(t.split(":") for t in static["targets"]))
    for name, service in ricochet_services().items():
        port = load(monkeypatch, service_environment(service)).http_port
        assert str(targets.get(name)) == str(port), f"service {name} is not scraped on {port}"
    assert str(targets["rabbitmq"]) == "15692"


def test_grafana_provisions_the_dashboard_on_prometheus() -> None:
    """Grafana's datasource is the stack's Prometheus under the uid the dashboard uses, and its
    dashboard provider reads the directory the dashboard JSON is mounted at."""
    services = compose()["services"]
    grafana = services["grafana"]
    assert re.fullmatch(r"grafana/grafana:\d+\.\d+\.\d+", interpolate(grafana["image"]))
    sources = mounted(grafana, "/etc/grafana/provisioning/datasources")
    (datasource,) = [
        d for f in sources.glob("*.yml") for d in yaml.safe_load(f.read_text())["datasources"]
    ]
    url = urlsplit(datasource["url"])
    assert url.hostname == "prometheus"
    assert str(url.port) in {port.rsplit(":", 1)[1] for port in services["prometheus"]["ports"]}
    providers = mounted(grafana, "/etc/grafana/provisioning/dashboards")
    (provider,) = [
        p for f in providers.glob("*.yml") for p in yaml.safe_load(f.read_text())["providers"]
    ]
    dashboards = list(mounted(grafana, provider["options"]["path"]).glob("*.json"))
    assert dashboards, "no dashboard JSON where the provider looks"
    for path in dashboards:
        used = datasource_uids(json.loads(path.read_text()))
        assert used == {datasource["uid"]}, f"{path.name} refers to datasources {used}"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert mounted(grafana, home) in dashboards


def test_image_health_check_probes_readyz() -> None:
    """The image's HEALTHCHECK fetches /readyz on RICOCHET_HTTP_PORT: healthy means consuming,
    which is what compose's service_healthy and rolling updates should wait for."""
    check = only("HEALTHCHECK").exec_form()
    script = check[-1]
    path = re.search(r"http://127\.0\.0\.1:%s(/\w+)", script)
    assert path, script
    table = routes(CollectorRegistry(), lambda: True, lambda: True)
    served = {route.path for route in table if isinstance(route, web.RouteDef)}
    assert path[1] == "/readyz"
    assert path[1] in served
    assert "RICOCHET_HTTP_PORT" in script
    assert str(Settings.model_fields["http_port"].default) in script


def test_broker_health_check_and_plugins() -> None:
    """rabbitmq is checked with rabbitmq-diagnostics and loads ricochet's plugins and config."""
    rabbitmq = compose()["services"]["rabbitmq"]
    check = rabbitmq["healthcheck"]["test"]
    assert check[:3] == ["CMD", "rabbitmq-diagnostics", "-q"]
    assert check[3] in {"ping", "check_port_connectivity"}
    assert re.fullmatch(r"rabbitmq:4\.\d+\.\d+-management", interpolate(rabbitmq["image"]))
    mounts = {v.split(":")[0]: v.split(":")[1] for v in rabbitmq["volumes"]}
    for source in ("./config/rabbitmq.conf", "./config/enabled_plugins"):
        assert (COMPOSE.parent / source).is_file(), source
        assert source in mounts
    plugins = (ROOT / "config" / "enabled_plugins").read_text()
    listed = set(re.findall(r"\w+", plugins))
    assert {
        "rabbitmq_management",
        "rabbitmq_shovel",
        "rabbitmq_shovel_management",
        "rabbitmq_prometheus",
    } <= listed
    for service in ricochet_services().values():
        assert service["depends_on"]["rabbitmq"]["condition"] == "service_healthy"


def test_image_runs_ricochet_as_non_root() -> None:
    """Pinned slim base by default, ricochet as entry point, worker by default, a numeric
    non-root user."""
    base = next(i for i in dockerfile() if i.keyword == "ARG").args.removeprefix("PYTHON_IMAGE=")
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-bookworm", base), base
    assert only("ENTRYPOINT").exec_form() == ["ricochet"]
    assert only("CMD").exec_form() == ["worker"]
    user = only("USER").args.split(":")[0]
    assert user.isdigit()
    assert int(user) != 0


def test_image_copies_only_what_dockerignore_lets_through() -> None:
    """Every COPY source is re-included by .dockerignore, which excludes everything else."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line for line in ignore if line and not line.startswith("#")]
    assert patterns[0] == "*"
    for source in copied_sources():
        assert (ROOT / source).exists(), source
        assert f"!{source}" in patterns, f"{source} is excluded from the build context"
    assert any("install-locked.sh" in i.args for i in dockerfile() if i.keyword == "RUN")


def test_lock_satisfies_pyproject() -> None:
    """requirements.lock pins, with hashes, a version of every runtime dependency it allows."""
    lock = (ROOT / "requirements.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", lock, re.MULTILINE))
    blocks = re.split(r"\n(?=[A-Za-z])", lock)
    assert all("--hash=sha256:" in b for b in blocks if re.match(r"[A-Za-z]", b))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = [*project["project"]["dependencies"], *project["build-system"]["requires"]]
    normalized = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}
    for spec in map(Requirement, needed):
        name = re.sub(r"[-_.]+", "-", spec.name).lower()
        assert name in normalized, f"{spec.name} is not in requirements.lock: run make lock"
        assert spec.specifier.contains(normalized[name]), f"{spec} vs {normalized[name]}"


def test_compose_passwords_never_default() -> None:
    """Every password, secret or token compose passes on is required (${NAME:?...}): without
    one, compose refuses to start instead of running with a password everyone knows."""
    text = COMPOSE.read_text()
    secrets = [m for m in VARIABLE.finditer(text) if re.search("PASS|SECRET|TOKEN", m[1])]
    assert secrets
    for m in secrets:
        assert m[2] == ":?", f"{m[0]} has a default"
    broker = compose()["services"]["rabbitmq"]["environment"]
    with pytest.raises(MissingVariable):
        interpolate(broker["RABBITMQ_DEFAULT_PASS"], {})


def test_image_serves_http_on_every_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image and the compose services listen on 0.0.0.0, where Prometheus reaches them;
    a process started elsewhere keeps the loopback default."""
    assert "RICOCHET_HTTP_HOST=0.0.0.0" in [i.args for i in dockerfile() if i.keyword == "ENV"]
    for service in ricochet_services().values():
        assert load(monkeypatch, service_environment(service)).http_host == "0.0.0.0"
    assert Settings.model_fields["http_host"].default == "127.0.0.1"


def test_no_top_level_app_package() -> None:
    """The import package is ricochet, its source in app/ricochet/; nothing named app is
    installed beside it."""
    app = Path(__file__).resolve().parents[2] / "app"
    assert not (app / "__init__.py").exists()
    assert not (app / "app.py").exists()
