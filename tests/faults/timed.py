"""The handler of the flow rows (test_keys_faults.py, test_rate_limits_faults.py), run by
`ricochet worker` processes (RICOCHET_HANDLER=tests.faults.timed:timed).

It writes `start|done ID ATTEMPT` lines to TEST_JOURNAL as tests/handlers.py does (the file
what FaultRun counts), and beside it, in TEST_JOURNAL.timed, each run's key, process and times:
`start|done ID ATTEMPT KEY PID NS`, KEY - for a job without one, NS the system-wide monotonic
clock (time.monotonic_ns(), the same in every process of the machine), so that a row can tell
across processes whether two jobs of a key ever ran at once, in which order each key's jobs
started, and how many jobs started in any stretch of time. A run with a start and no end is
one whose process died under it."""

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ricochet import Job


def timed_journal(journal: Path) -> Path:
    """Where the runs' keys, processes and times are written, beside the journal."""
    return journal.with_name(journal.name + ".timed")


def _write(path: Path, line: str) -> None:
    # One short O_APPEND write per line: the processes' lines never interleave within a line.
    with path.open("a") as out:
        out.write(line + "\n")


def _mark(event: str, job: Job) -> None:
    journal = Path(os.environ["TEST_JOURNAL"])
    # The timed line first: once the journal says a job is done, its run's end is written.
    key = job.key or "-"
    _write(
        timed_journal(journal),
        f"{event} {job.message_id} {job.attempt} {key} {os.getpid()} {time.monotonic_ns()}",
    )
    _write(journal, f"{event} {job.message_id} {job.attempt}")


async def timed(job: Job) -> None:
    """Journal the start, work for payload["sleep_s"] seconds, journal the end."""
    _mark("start", job)
    await asyncio.sleep(float(job.payload.get("sleep_s", 0)))
    _mark("done", job)


@dataclass
class TimedRun:
    """One run of a job, as the handler noted it: its attempt, key ("-": none), the process it
    ran in, and when (monotonic ns); end is None while it runs, or when its process died under
    it."""

    message_id: str
    attempt: int
    key: str
    pid: int
    start_ns: int
    end_ns: int | None = None


def timed_runs(journal: Path) -> list[TimedRun]:
    """The runs noted so far beside the journal, in the order they started."""
    path = timed_journal(journal)
    runs: list[TimedRun] = []
    if not path.exists():
        return runs
    running: dict[tuple[str, int], list[TimedRun]] = defaultdict(list)
    # The last line may still be being written: only whole lines count.
    for line in path.read_text().split("\n")[:-1]:
        event, message_id, attempt, key, pid, ns = line.split()
        if event == "start":
            runs.append(TimedRun(message_id, int(attempt), key, int(pid), int(ns)))
            running[message_id, int(pid)].append(runs[-1])
        else:
            running[message_id, int(pid)].pop(0).end_ns = int(ns)
    return sorted(runs, key=lambda r: r.start_ns)
