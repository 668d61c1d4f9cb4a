"""The wait's handler for the benchmark (RICOCHET_HANDLER=bench.wait_handlers:probe), apart from
bench.handlers so that an A/B run's older checkout, without RetryLater, still runs those."""

from ricochet import Job, RetryLater

from bench.probe import LATER_TYPE, SCHEDULED_TYPE, schedule_lateness


async def probe(job: Job) -> None:
    """Load jobs succeed; a wait probe records how late it ran, after a RetryLater on its first
    attempt for that kind (bench.probe)."""
    if job.type in (SCHEDULED_TYPE, LATER_TYPE):
        after_s = schedule_lateness(job.message_id, job.type, job.attempt, job.headers)
        if after_s is not None:
            raise RetryLater(after_s)
