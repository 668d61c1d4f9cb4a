"""A real Prometheus (Debian's package) for a test: its own port, storage and time limit.

It runs the repository's own scrape jobs and alert rules, everything scraped and evaluated every
second, and the rules' `for` cut to zero (promtool's tests in config/prometheus/rules.test.yml
cover the durations). Each job finds its targets in a file the test rewrites, so one Prometheus
can scrape the processes that test after test starts and stops.
"""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.support import ROOT, free_port

CONFIG_DIR = ROOT / "config" / "prometheus"
START_TIMEOUT_S = 30

# A rule's stand-ins: each text of its shipped expression and what the test evaluates instead.
StandIns = Mapping[str, Mapping[str, str]]


def scrape_config(jobs: list[str], rules: Path, targets_dir: Path) -> dict[str, Any]:
    """The compose stack's config for these jobs (the others dropped), each job's targets read
    from targets_dir/JOB.json."""
    config: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(rules)]
    names = [job["job_name"] for job in config["scrape_configs"] if job["job_name"] in jobs]
    assert set(names) == set(jobs), "jobs the stack does not scrape"
    config["scrape_configs"] = [
        {"job_name": name, "file_sd_configs": [{"files": [str(targets_dir / f"{name}.json")]}]}
        for name in names
    ]
    return config


def immediate_rules(stand_ins: StandIns | None = None) -> dict[str, Any]:
    """config/prometheus/rules.yml with every rule firing as soon as its expression holds, and in
    the rules named in stand_ins each shipped text of the expression replaced by its stand-in."""
    stand_ins = stand_ins or {}
    rules: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "rules.yml").read_text())
    names = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            names.add(rule["alert"])
            rule["for"] = "0s"
            for shipped, stand_in in stand_ins.get(rule["alert"], {}).items():
                # A rule that changed must fail here, not go on testing an expression it lost.
                assert shipped in rule["expr"], f"{rule['alert']} has no {shipped!r} any more"
                rule["expr"] = rule["expr"].replace(shipped, stand_in)
    assert set(stand_ins) <= names, f"no such rules: {set(stand_ins) - names}"
    return rules


class Prometheus:
    """`with Prometheus(tmp_path, {"ricochet-worker": ["127.0.0.1:8001"]}) as prom: ...`"""

    def __init__(
        self,
        directory: Path,
        targets: dict[str, list[str]],
        stand_ins: StandIns | None = None,
    ) -> None:
        binary = shutil.which("prometheus")
        assert binary, "Debian's prometheus is missing: run `make tools`"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._targets_dir = directory / "targets"
        self._targets_dir.mkdir()
        self._targets = {job: list(addresses) for job, addresses in targets.items()}
        for job in self._targets:
            self._write_targets(job)
        rules = directory / "rules.yml"
        rules.write_text(yaml.safe_dump(immediate_rules(stand_ins)))
        config = directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(list(targets), rules, self._targets_dir)))
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

    def _write_targets(self, job: str) -> None:
        # Renamed into place: Prometheus watches the file and must never read half of it.
        path = self._targets_dir / f"{job}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps([{"targets": self._targets[job]}]))
        partial.rename(path)

    @contextmanager
    def scraping(self, job: str, target: str) -> Iterator[None]:
        """Scrape one more target of a job for the duration of the block (Prometheus takes up to
        ten seconds to notice: wait for its `up`)."""
        self._targets[job].append(target)
        self._write_targets(job)
        try:
            yield
        finally:
            self._targets[job].remove(target)
            self._write_targets(job)

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

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert pending or firing now: its labels, state and activeAt."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def evaluated_since(self, unix_time: float) -> bool:
        """Whether every rule has been evaluated since then (on the samples scraped by then)."""
        groups = self.api("rules")["groups"]
        return all(
            datetime.fromisoformat(group["lastEvaluation"]).timestamp() > unix_time
            for group in groups
        )
