"""Handlers for tests that run ricochet as a process (RICOCHET_HANDLER=tests.handlers:...)."""

import asyncio
import ctypes
import os
import signal
import time
from pathlib import Path

from ricochet import Job, PermanentError, RetryLater, Router


def _mark(event: str, job: Job) -> None:
    # One short O_APPEND write per line, so concurrent writers never interleave within a line.
    # A "{queue}" in TEST_JOURNAL is the job's queue: a journal per queue of the worker.
    with Path(os.environ["TEST_JOURNAL"].replace("{queue}", job.queue)).open("a") as journal:
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


def wedging(job: Job) -> None:
    """fault_sync, except that a job with payload["wedge_s"] first wedges the process it runs in:
    the first time the job runs (a marker beside the journal, holding that process's pid, says
    it ran), libc's sleep is called for wedge_s seconds holding the GIL, so that no thread of
    the process, its event loop included, runs meanwhile."""
    if "wedge_s" in job.payload and _first_run(job):
        ctypes.PyDLL(None).sleep(int(job.payload["wedge_s"]))
    fault_sync(job)


def wedge_marker(journal: str, message_id: str) -> Path:
    """Where wedging notes the pid of the process a job wedged."""
    return Path(f"{journal}.wedged-{message_id}")


def _first_run(job: Job) -> bool:
    try:
        with wedge_marker(os.environ["TEST_JOURNAL"], str(job.message_id)).open("x") as marker:
            marker.write(str(os.getpid()))
    except FileExistsError:
        return False
    return True


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


# SPEC 21's fault rows: a type that waits on a ladder of its own, and one that does not (whose
# jobs may bring their own, the retry-delays-ms header); both journal as fault does. Long enough
# that a loaded machine starts 300 first attempts and sends 150 cancels before the first come due.
LADDER_MS = 6_000
ladders = Router()
ladders.handler("laddered", retry_delays_ms=(LADDER_MS,))(fault)
ladders.handler("plain")(fault)


# A recurring job every second (SPEC 22): each run is journalled as `ran MESSAGE_ID MS`, MS the
# wall-clock time it ran at, in milliseconds since the epoch.
ticks = Router()
ticks.schedule("tick", "tick", every=1)


@ticks.handler("tick")
def tick(job: Job) -> None:
    with Path(os.environ["TEST_JOURNAL"]).open("a") as journal:
        journal.write(f"ran {job.message_id} {time.time_ns() // 1_000_000}\n")


def until_cancelled(job: Job) -> None:
    """A sync handler that works in steps until its job is cancelled (up to 20 s), looking at the
    flag between steps as the docs show; journals its start and the moment it saw the cancel,
    with its process."""
    _mark(f"start {os.getpid()}", job)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if job.cancelled:
            _mark(f"seen {os.getpid()} {time.time()}", job)
        job.raise_if_cancelled()
        time.sleep(0.01)
