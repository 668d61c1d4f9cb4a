"""In-process figures compared across checkouts (bench.logline, bench.jobpath): each run in a
process of its own with one checkout's app/ first on the path, the checkouts in alternation."""

import json
import os
import subprocess
import sys
from pathlib import Path

Figures = dict[str, float]


def app_first() -> None:
    """In a child: the app/ of the checkout it was started for first on the path, if any (a
    checkout's own app/ otherwise, as installed)."""
    if src := os.environ.get("BENCH_APP_SRC"):
        sys.path.insert(0, str(Path(src) / "app"))  # its src layout


def alternate(
    module: str, child_args: list[str], base_src: Path | None, rounds: int
) -> dict[str, list[Figures]]:
    """The figures of `python -m module --child *child_args` (one JSON object on stdout) for
    this checkout and, with base_src, for that one, rounds runs each, in alternation."""
    sides: dict[str, Path | None] = {"this checkout": None}
    if base_src:
        sides["base"] = base_src
    runs: dict[str, list[Figures]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, checkout in sides.items():
            env = {**os.environ, **({"BENCH_APP_SRC": str(checkout)} if checkout else {})}
            args = [sys.executable, "-m", module, "--child", *child_args]
            out = subprocess.run(args, env=env, check=True, capture_output=True, text=True)
            runs[side].append(json.loads(out.stdout))
    return runs
