"""The image's install, done outside Docker: locked deps, then a worker as a non-root user."""

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from asyncio.subprocess import PIPE
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from aio_pika.abc import AbstractConnection

from tests.deploy_files import copied_sources
from tests.support import ROOT, free_port, http_status, make_settings, ricochet_env, wait_for

INSTALL_TIMEOUT_S = 300
USER = "nobody"


def interpreter_for(user: str) -> str:
    """A Python 3.11+ that the user may run (pyenv's, under root's home, may not be)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(
            [
                "runuser",
                "-u",
                user,
                "--",
                candidate,
                "-c",
                "import ensurepip, sys, venv; sys.exit(sys.version_info < (3, 11))",
            ],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    raise AssertionError(f"no Python 3.11+ with venv that {user} can run")


@pytest.fixture
def build_dir() -> Iterator[Path]:
    """A world-readable temporary directory (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="ricochet-install-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def build_context(target: Path) -> Path:
    """Copy what the Dockerfile copies, to the same relative paths, as a build context would."""
    for source in copied_sources():
        origin, copy = ROOT / source, target / source
        copy.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, copy, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, copy)
    return target


@pytest.mark.slow
async def test_locked_install_runs_a_worker_as_non_root(
    queue_name: str, connection: AbstractConnection, build_dir: Path
) -> None:
    """scripts/install-locked.sh makes a working ricochet in a fresh virtualenv, and its worker,
    run as an unprivileged user with a HOME of its own, answers /healthz and /readyz, and
    exits 0 on SIGTERM; the distribution is ricochet-jobs, whose version --version prints; the
    console's templates are installed with the package."""
    # `connection` is here for its teardown: it deletes the queues the worker declares.
    python = interpreter_for(USER)
    context = build_context(build_dir / "src")
    venv = build_dir / "venv"
    install = await asyncio.create_subprocess_exec(
        str(context / "scripts" / "install-locked.sh"),
        str(venv),
        env={**os.environ, "PYTHON": python},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(install.communicate(), INSTALL_TIMEOUT_S)
    assert install.returncode == 0, output.decode()[-3000:]

    home = build_dir / "home"
    home.mkdir()
    shutil.chown(home, USER)
    port = free_port()
    settings = make_settings(queue_name, http_port=port)
    env = {k: v for k, v in ricochet_env(settings).items() if k.startswith("RICOCHET_")}
    env |= {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    as_user = ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]

    usage = await asyncio.create_subprocess_exec(
        *as_user, str(venv / "bin" / "ricochet"), "--help", cwd=home, stdout=PIPE, stderr=PIPE
    )
    out, err = await usage.communicate()
    assert usage.returncode == 0, err.decode()
    assert b"worker" in out

    # The distribution is ricochet-jobs (the index's `ricochet` is another project's); the
    # import package and the command are ricochet, and --version reads the distribution's.
    distribution = await asyncio.create_subprocess_exec(
        *as_user,
        str(venv / "bin" / "python"),
        "-c",
        "import importlib.metadata as m, ricochet; print(m.version('ricochet-jobs'))",
        cwd=home,
        stdout=PIPE,
        stderr=PIPE,
    )
    out, err = await distribution.communicate()
    assert distribution.returncode == 0, err.decode()
    version = out.decode().strip()
    shown = await asyncio.create_subprocess_exec(
        *as_user, str(venv / "bin" / "ricochet"), "--version", cwd=home, stdout=PIPE, stderr=PIPE
    )
    out, err = await shown.communicate()
    assert shown.returncode == 0, err.decode()
    assert out.decode() == f"ricochet, version {version}\n"

    # The console's templates are package data: the installed package (and so the image) has them.
    pages = "from ricochet.monitor.console import templates; e = templates(); " + "; ".join(
        f"e.get_template({name!r})" for name in ("failed.html", "job.html", "error.html")
    )
    console = await asyncio.create_subprocess_exec(
        *as_user, str(venv / "bin" / "python"), "-c", pages, cwd=home, stdout=PIPE, stderr=PIPE
    )
    _, err = await console.communicate()
    assert console.returncode == 0, err.decode()

    runner = await asyncio.create_subprocess_exec(
        *as_user, str(venv / "bin" / "ricochet"), "worker", cwd=home, stdout=PIPE, stderr=PIPE
    )
    try:

        async def ready() -> bool:
            assert runner.returncode is None, "the worker exited"
            return await http_status(port, "/readyz") == 200

        await wait_for(ready, 30, "/readyz of the installed worker")
        assert await http_status(port, "/healthz") == 200
        worker = next(
            p
            for p in psutil.Process(runner.pid).children(recursive=True)
            if "worker" in p.cmdline()
        )
        assert worker.uids().real == pwd.getpwnam(USER).pw_uid
        worker.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(runner.communicate(), 30)
    finally:
        if runner.returncode is None:
            for child in psutil.Process(runner.pid).children(recursive=True):
                child.kill()
            runner.kill()
            out, err = await runner.communicate()
    assert runner.returncode == 0, err.decode()
    assert b'"event":"consuming"' in out
