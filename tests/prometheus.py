"""A real Prometheus (Debian's package) for a test: its own port, storage and time limit.

It runs the repository's own scrape jobs and alert rules, with the scrape targets pointed at the
test's processes, everything scraped and evaluated every second, and the rules' `for` cut to
zero (promtool's tests in config/prometheus/rules.test.yml cover the durations).
"""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.support import ROOT, free_port

CONFIG_DIR = ROOT / "config" / "prometheus"
START_TIMEOUT_S = 30


def scrape_config(targets: dict[str, list[str]], rules: Path) -> dict[str, Any]:
    """The compose stack's config with static targets for these jobs (the others dropped)."""
    config: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(rules)]
    jobs = [job for job in config["scrape_configs"] if job["job_name"] in targets]
    assert {job["job_name"] for job in jobs} == set(targets), "jobs the stack does not scrape"
    config["scrape_configs"] = [
        {"job_name": job["job_name"], "static_configs": [{"targets": targets[job["job_name"]]}]}
        for job in jobs
    ]
    return config


def immediate_rules() -> dict[str, Any]:
    """config/prometheus/rules.yml with every rule firing as soon as its expression holds."""
    rules: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    return rules


class Prometheus:
    """`with Prometheus(tmp_path, {"ricochet-worker": ["127.0.0.1:8001"]}) as prom: ...`"""

    def __init__(self, directory: Path, targets: dict[str, list[str]]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "Debian's prometheus is missing: run `make tools`"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = directory / "rules.yml"
        rules.write_text(yaml.safe_dump(immediate_rules()))
        config = directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(targets, rules)))
        self.log = directory / "prometheus.log"
        self._command = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "Prometheus":
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(self._command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            assert self._process.poll() is None, f"prometheus exited:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"prometheus not ready:\n{self.log.read_text()}"
            time.sleep(0.2)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=20)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """The data of an HTTP API answer (/api/v1/...)."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]

    def value(self, query: str) -> float | None:
        """The value of a query that gives one series now, or None while it gives none."""
        result = self.api("query", query=query)["result"]
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def firing(self) -> list[dict[str, str]]:
        """The labels of every firing alert."""
        alerts = self.api("alerts")["alerts"]
        return [alert["labels"] for alert in alerts if alert["state"] == "firing"]
