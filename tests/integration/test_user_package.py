"""ricochet as a user installs it: the import package is ricochet, and a user's own package
named app (the most common name for a service's code) runs under `ricochet worker`."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from aio_pika.abc import AbstractChannel, AbstractConnection

from tests.support import SPAWNED, consumers, make_settings, publish, ricochet_env, wait_for

HANDLERS = """
from pathlib import Path

from ricochet import Job, PermanentError, Router

router = Router()


@router.handler("note")
def note(job: Job) -> None:
    if not job.payload.get("ok"):
        raise PermanentError("not ok")
    Path(__file__).with_name("done.txt").open("a").write(f"{job.message_id}\\n")
"""


def start_worker_in(folder: Path, env: dict[str, str]) -> "subprocess.Popen[str]":
    """`ricochet worker`, the installed console script, started in the user's folder."""
    worker = subprocess.Popen(
        [str(Path(sys.executable).with_name("ricochet")), "worker"],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    SPAWNED.append(worker)
    return worker


def test_ricochet_is_importable_and_app_is_not(tmp_path: Path) -> None:
    """From outside the repository, `ricochet` imports and `app` does not resolve to it."""
    script = (
        "import importlib.util\n"
        "from ricochet import Job, PermanentError, Router\n"
        "assert importlib.util.find_spec('app') is None, importlib.util.find_spec('app')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True)


async def test_a_user_package_named_app_runs_under_the_worker(
    tmp_path: Path, connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """The user's handlers live in app/jobs.py; `ricochet worker` with
    RICOCHET_HANDLER=app.jobs:router runs their job."""
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(HANDLERS)
    env = ricochet_env(make_settings(queue_name, handler="app.jobs:router", http_port=0))
    env["PYTHONPATH"] = str(tmp_path)
    worker = start_worker_in(tmp_path, env)
    await wait_for(lambda: consumers(connection, queue_name), what="the worker's consumer")
    await publish(channel, queue_name, b'{"ok": true}', type="note", message_id="job-1")
    done = package / "done.txt"
    await wait_for(lambda: done.exists() and done.read_text() == "job-1\n", timeout_s=20)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
