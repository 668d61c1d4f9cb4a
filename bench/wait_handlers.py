"""The wait's handlers for the benchmark (RICOCHET_HANDLER=bench.wait_handlers:...), apart from
bench.handlers so that an A/B run's older checkout, without RetryLater or ladders per type, still
runs those."""

from ricochet import Job, RetryLater, Router

from bench.handlers import fail_once
from bench.probe import (
    LADDER_TYPE,
    LATER_TYPE,
    PROBE_DELAYS_S,
    SCHEDULED_TYPE,
    ladder_fails,
    ladder_type,
    schedule_lateness,
)

# The retry path on a type's ladder: the benchmark's jobs (type "bench") wait this long, in the
# shared delay levels, before their retry.
TYPE_LADDER_MS = 10


async def probe(job: Job) -> None:
    """Load jobs succeed; a wait probe records how late it ran, after a RetryLater on its first
    attempt for that kind, or after a failure that waits its type's ladder (bench.probe)."""
    if job.type in (SCHEDULED_TYPE, LATER_TYPE):
        after_s = schedule_lateness(job.message_id, job.type, job.attempt, job.headers)
        if after_s is not None:
            raise RetryLater(after_s)
    elif job.type is not None and job.type.startswith(f"{LADDER_TYPE}-"):
        delay_s = job.headers["probe-delay-s"]
        if ladder_fails(job.message_id, job.attempt, delay_s):
            raise ConnectionError("benchmark: a ladder probe fails its first attempt")


# The lateness run: load jobs, scheduled and RetryLater probes, and a type per ladder delay.
probes = Router()
for _job_type in ("load", SCHEDULED_TYPE, LATER_TYPE):
    probes.handler(_job_type)(probe)
for _delay_s in PROBE_DELAYS_S:
    probes.handler(ladder_type(_delay_s), retry_delays_ms=(_delay_s * 1000,))(probe)

# The retry path on a type's ladder: the first attempt fails, the retry succeeds.
laddered = Router()
laddered.handler("bench", retry_delays_ms=(TYPE_LADDER_MS,))(fail_once)
