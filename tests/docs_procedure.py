"""The shell procedures of the docs' pages, each the block after `<!-- procedure: NAME -->`, run
exactly as written."""

import asyncio
import re
import subprocess
from pathlib import Path


def procedure(page: Path, name: str) -> str:
    """The shell block that follows `<!-- procedure: NAME -->` in the page."""
    found = re.search(rf"<!-- procedure: {name} -->\n```sh\n(.*?)```", page.read_text(), re.S)
    assert found, f"{page.name} has no procedure {name}"
    return found.group(1)


async def run_procedure(page: Path, name: str, env: dict[str, str], cwd: Path) -> str:
    """Run the page's procedure NAME in cwd with bash's strict options (a failing command fails
    the test); its output."""
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euo", "pipefail", "-c", procedure(page, name)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
