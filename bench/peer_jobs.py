"""The three job shapes of the worker-processes bench (bench.peers), the same work for ricochet
and the peers: each job notes when it ended in the run's journal (BENCH_JOURNAL), so every side
is timed the same way, from its first job's end to its last."""

import asyncio
import os
import time

from ricochet import Job

CPU_S = 0.002  # CPU time a CPU-bound job burns
WAIT_S = 0.020  # how long an I/O-bound job blocks or awaits


def noted() -> None:
    """The job ended: one short O_APPEND write, so concurrent processes never interleave."""
    fd = os.open(os.environ["BENCH_JOURNAL"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{time.time()}\n".encode())
    finally:
        os.close(fd)


def burn_cpu() -> None:
    """About 2 ms of this thread's CPU time: a handler that computes, holding the GIL."""
    end = time.thread_time() + CPU_S
    while time.thread_time() < end:
        pass
    noted()


def block() -> None:
    """Blocks 20 ms without the GIL, as a call through a sync HTTP client does."""
    time.sleep(WAIT_S)
    noted()


async def wait() -> None:
    """Awaits 20 ms, as a call through an async client does."""
    await asyncio.sleep(WAIT_S)
    noted()


# ricochet's handlers (RICOCHET_HANDLER=bench.peer_jobs:cpu, ...): a sync one runs in a thread.
def cpu(job: Job) -> None:
    burn_cpu()


def blocking(job: Job) -> None:
    block()


async def awaiting(job: Job) -> None:
    await wait()
