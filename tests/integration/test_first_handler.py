"""docs/first-handler.md, walked as a newcomer would: the example file in a folder of its own, the
page's worker command run there, its jobs published, its outcome read (SPEC 27)."""

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.docs_procedure import procedure, run_procedure
from tests.support import (
    ROOT,
    done_ids,
    log_events,
    logged_ids,
    make_settings,
    ricochet_env,
    wait_for,
)

PAGE = ROOT / "docs" / "first-handler.md"


def as_typed(env: dict[str, str]) -> dict[str, str]:
    """The environment a person's shell gives the page's commands: `ricochet` is the installed
    console script (not `python -m`, which puts the current folder on the path by itself), and
    nothing else is on the import path."""
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return {**env, "PATH": path, "PYTHONPATH": ""}


async def run(name: str, env: dict[str, str], folder: Path) -> str:
    """Run the page's procedure NAME in the handler's folder; its output."""
    return await run_procedure(PAGE, name, as_typed(env), folder)


def start_worker(env: dict[str, str], folder: Path, log: Path) -> "subprocess.Popen[bytes]":
    """Start the page's worker command in the handler's folder, its output to log."""
    with log.open("w") as sink:
        # bash runs the page's one command in its own process: SIGTERM reaches the worker.
        return subprocess.Popen(
            ["bash", "-c", procedure(PAGE, "first-worker")],
            cwd=folder,
            env=as_typed(env),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


async def test_the_first_handler_page_runs_as_written(queue_name: str, tmp_path: Path) -> None:
    """The page's handler, worker, jobs and outcome: Ada is greeted and her job succeeds; the job
    without a name fails as permanent and is listed in the failed queue with its reason."""
    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(ROOT / "docs" / "examples" / "greetings.py", folder)
    env = ricochet_env(make_settings(queue_name))
    env.pop("RICOCHET_HANDLER", None)  # the page's command sets it
    log = tmp_path / "worker.log"
    worker = start_worker(env, folder, log)
    try:
        await wait_for(lambda: "consuming" in log.read_text(), 60, "the worker consuming")
        await run("first-jobs", env, folder)
        greeted = "Hello, Ada! (attempt 1 of job greet-ada)"
        await wait_for(lambda: greeted in log.read_text(), 30, "Ada greeted")

        async def listed_nameless() -> bool:
            return "greet-nobody" in await run("first-outcome", env, folder)

        await wait_for(listed_nameless, 30, "the nameless job")
        listed = (await run("first-outcome", env, folder)).splitlines()
        row = next(line for line in listed if "greet-nobody" in line)
        assert "permanent" in row
        assert "PermanentError: no name to greet: retrying cannot help" in row
        events = log_events(log.read_text())
        assert "greet-ada" in done_ids(events)
        assert "greet-nobody" in logged_ids(events, "job failed")
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(worker.wait, 30)
        finally:
            worker.kill()
    assert worker.returncode == 0, log.read_text()
