"""docs/first-handler.md, walked as a newcomer would: the example file in a folder of its own, the
page's worker command run there, its jobs published, its outcome read (SPEC 27)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.support import ROOT, done_ids, log_events, logged_ids, make_settings, ricochet_env

PAGE = ROOT / "docs" / "first-handler.md"


def procedure(name: str) -> str:
    """The shell block that follows `<!-- procedure: NAME -->` in the page."""
    found = re.search(rf"<!-- procedure: {name} -->\n```sh\n(.*?)```", PAGE.read_text(), re.S)
    assert found, f"{PAGE.name} has no procedure {name}"
    return found.group(1)


def as_typed(env: dict[str, str]) -> dict[str, str]:
    """The environment a person's shell gives the page's commands: `ricochet` is the installed
    console script (not `python -m`, which puts the current folder on the path by itself), and
    nothing else is on the import path."""
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return {**env, "PATH": path, "PYTHONPATH": ""}


def until(ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.2)


def run(name: str, env: dict[str, str], folder: Path) -> str:
    """Run the page's procedure NAME in the handler's folder; its output."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", procedure(name)],
        cwd=folder,
        env=as_typed(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_first_handler_page_runs_as_written(queue_name: str, tmp_path: Path) -> None:
    """The page's handler, worker, jobs and outcome: Ada is greeted and her job succeeds; the job
    without a name fails as permanent and is listed in the failed queue with its reason."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(ROOT / "docs" / "examples" / "greetings.py", folder)
    env = ricochet_env(make_settings(queue_name))
    env.pop("RICOCHET_HANDLER", None)  # the page's command sets it
    log = tmp_path / "worker.log"
    with log.open("w") as sink:
        # bash runs the page's one command in its own process: SIGTERM reaches the worker.
        worker = subprocess.Popen(
            ["bash", "-c", procedure("first-worker")],
            cwd=folder,
            env=as_typed(env),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        until(lambda: "consuming" in log.read_text(), 60, "the worker consuming")
        run("first-jobs", env, folder)
        greeted = "Hello, Ada! (attempt 1 of job greet-ada)"
        until(lambda: greeted in log.read_text(), 30, "Ada greeted")
        until(lambda: "greet-nobody" in run("first-outcome", env, folder), 30, "the nameless job")
        listed = run("first-outcome", env, folder).splitlines()
        row = next(line for line in listed if "greet-nobody" in line)
        assert "permanent" in row
        assert "PermanentError: no name to greet: retrying cannot help" in row
        events = log_events(log.read_text())
        assert "greet-ada" in done_ids(events)
        assert "greet-nobody" in logged_ids(events, "job failed")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        finally:
            worker.kill()
    assert worker.returncode == 0, log.read_text()
