"""Handlers the benchmark runs in the real worker (RICOCHET_HANDLER=bench.handlers:...)."""

from ricochet import Job, PermanentError, RetryLater

from bench.probe import LATER_TYPE, PROBE_TYPE, SCHEDULED_TYPE, probe_fails, schedule_lateness


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
    """Load jobs succeed; a probe fails three times, timed in each tier (bench.probe); a wait
    probe records how late it ran, after a RetryLater on its first attempt for that kind."""
    if job.type == PROBE_TYPE and probe_fails(job.message_id, job.attempt):
        raise RuntimeError("benchmark: probe goes to the next tier")
    if job.type in (SCHEDULED_TYPE, LATER_TYPE):
        after_s = schedule_lateness(job.message_id, job.type, job.attempt, job.headers)
        if after_s is not None:
            raise RetryLater(after_s)
