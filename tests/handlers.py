"""Handlers for tests that run ricochet as a process (RICOCHET_HANDLER=tests.handlers:...)."""

import asyncio
import os
import signal
import time
from pathlib import Path

from ricochet import Job, PermanentError, RetryLater


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


async def fault(job: Job) -> None:
    """Journal start and done; the payload may ask to work ("sleep_s"), fail the first N attempts
    ("fail": N), fail for good ("fail": "permanent"), wait on its first attempt ("later": s, a
    RetryLater), hang ("hang_s") or kill the whole worker process ("poison": true) every time it
    is handled."""
    payload = job.payload
    _mark("start", job)
    if payload.get("poison"):
        os.kill(os.getpid(), signal.SIGKILL)
    if "later" in payload and job.attempt == 1:
        raise RetryLater(payload["later"])
    await asyncio.sleep(float(payload.get("hang_s", payload.get("sleep_s", 0))))
    fail = payload.get("fail", 0)
    if fail == "permanent":
        raise PermanentError("cannot ever work")
    if isinstance(fail, int) and job.attempt <= fail:
        raise ConnectionError(f"flaky on attempt {job.attempt}")
    _mark("done", job)


def fault_sync(job: Job) -> None:
    """fault's sync twin for work and hangs: journal start, block for payload["hang_s"] (or
    "sleep_s") seconds in its thread, journal done."""
    _mark("start", job)
    time.sleep(float(job.payload.get("hang_s", job.payload.get("sleep_s", 0))))
    _mark("done", job)


async def fuzzed(job: Job) -> None:
    """Read all a handler may read (the payload may be undecodable: a permanent failure), and
    fail the first attempt of jobs with an odd number, so retries see the odd headers too."""
    _ = (job.type, job.headers, job.max_attempts, repr(job))
    _ = job.payload
    if job.attempt == 1 and int((job.message_id or "0").rsplit("-", 1)[-1]) % 2:
        raise ConnectionError("first attempts of odd jobs fail")
    _mark("done", job)


async def leaky(job: Job) -> None:
    """Fail for good with a huge message that ends in a database URL and its password."""
    raise PermanentError("row " * 50_000 + "cannot write to postgresql://app:hunter2@db/orders")
