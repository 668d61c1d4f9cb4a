"""The handler of the rate limit rows (test_rate_limits_faults.py), run by `ricochet worker`
processes (RICOCHET_HANDLER=tests.faults.metered:metered).

It journals each start and end as tests.handlers does (TEST_JOURNAL: `start|done ID ATTEMPT`,
what FaultRun counts), and beside it, in TEST_JOURNAL.rates, each run's process and times:
`start|done ID ATTEMPT PID NS`, NS the system-wide monotonic clock (time.monotonic_ns(), the same
in every process of the machine), so that a row can count the starts of every process in any
stretch of time, and tell which process ran a job and when. A run with a start and no end is one
whose process died under it."""

import asyncio
import os
import time
from pathlib import Path

from ricochet import Job


def rates_journal(journal: Path) -> Path:
    """Where the runs' processes and times are written, beside the journal."""
    return journal.with_name(journal.name + ".rates")


def _write(path: Path, line: str) -> None:
    # One short O_APPEND write per line: the processes' lines never interleave within a line.
    with path.open("a") as out:
        out.write(line + "\n")


def _mark(event: str, job: Job) -> None:
    journal = Path(os.environ["TEST_JOURNAL"])
    # The timed line first: once the journal says a job is done, its run's end is written.
    _write(
        rates_journal(journal),
        f"{event} {job.message_id} {job.attempt} {os.getpid()} {time.monotonic_ns()}",
    )
    _write(journal, f"{event} {job.message_id} {job.attempt}")


async def metered(job: Job) -> None:
    """Journal the start, work for payload["sleep_s"] seconds, journal the end."""
    _mark("start", job)
    await asyncio.sleep(float(job.payload.get("sleep_s", 0)))
    _mark("done", job)
