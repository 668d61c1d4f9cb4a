"""The job of the several-queues bench (bench.queues), the same on every side: an async handler
awaiting 5-20 ms (5 + n % 16, as calls through an async client wait), which notes its end in the
run's journal (bench.peer_jobs.noted).

No job starts before the run's gate file (BENCH_GATE) exists: every side's workers consume
and hold their prefetch of jobs before the first of them runs, so that no side's figure counts
one process working while another still starts."""

import asyncio
import os

from ricochet import Job

from bench.peer_jobs import noted

GATE_POLL_S = 0.005


class _Gate:
    """Whether the run's gate file was seen; looked for until it is, then never again."""

    opened = False

    @classmethod
    async def passed(cls) -> None:
        while not cls.opened:
            # A stat of a local file, only until the gate opens.
            cls.opened = os.path.exists(os.environ["BENCH_GATE"])  # noqa: ASYNC240
            if not cls.opened:
                await asyncio.sleep(GATE_POLL_S)


async def awaiting(job: Job) -> None:
    await _Gate.passed()
    await asyncio.sleep((5 + int(job.payload["n"]) % 16) / 1000)
    noted()
