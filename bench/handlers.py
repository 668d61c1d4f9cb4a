"""Handlers the benchmark runs in the real worker (RICOCHET_HANDLER=bench.handlers:...)."""

import os
import time

from ricochet import Job, PermanentError

from bench.probe import PROBE_TYPE, probe_fails


async def noop(job: Job) -> None:
    """Succeeds at once: the worker's own overhead per job."""


async def fail_once(job: Job) -> None:
    """Fails the first attempt, succeeds the retry."""
    if job.attempt == 1:
        raise RuntimeError("benchmark: the first attempt fails")


async def fail(job: Job) -> None:
    """Fails permanently: every job becomes a failed copy."""
    raise PermanentError("benchmark: this job always fails")


async def probe(job: Job) -> None:
    """Load jobs succeed; a probe fails three times, timed in each tier (bench.probe)."""
    if job.type == PROBE_TYPE and probe_fails(job.message_id, job.attempt):
        raise RuntimeError("benchmark: probe goes to the next tier")


async def record_start(job: Job) -> None:
    """Writes when it started (epoch seconds) to the file BENCH_STARTS names: bench.rates counts
    the starts of every process a second at a time."""
    with open(os.environ["BENCH_STARTS"], "a") as starts:  # noqa: ASYNC230 - one short line
        starts.write(f"{time.time()}\n")
