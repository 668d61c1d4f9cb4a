"""Handlers for tests that run ricochet as a process (RICOCHET_HANDLER=tests.handlers:...)."""

import asyncio
import os
import time
from pathlib import Path

from app import Job


def _mark(event: str, job: Job) -> None:
    # One short O_APPEND write per line, so concurrent writers never interleave within a line.
    with Path(os.environ["TEST_JOURNAL"]).open("a") as journal:
        journal.write(f"{event} {job.message_id} {job.attempt}\n")


async def slow(job: Job) -> None:
    """Journal the start, work for payload["sleep_s"] seconds, journal the end."""
    _mark("start", job)
    await asyncio.sleep(float(job.payload.get("sleep_s", 1)))
    _mark("done", job)


async def flaky(job: Job) -> None:
    """Fail the first payload["fail"] attempts with a transient error."""
    if job.attempt <= int(job.payload.get("fail", 0)):
        raise ConnectionError(f"flaky on attempt {job.attempt}")


def stuck(job: Job) -> None:
    """A sync handler that never finishes in time."""
    _mark("start", job)
    time.sleep(600)
