"""Handlers the benchmark runs in the real worker (RICOCHET_HANDLER=bench.handlers:...)."""

import time

from app import Job, PermanentError

# Tier k's observed delays (seconds) in the delay scenario; the worker process reports them.
observed_delays_s: dict[int, list[float]] = {}
_failed_at: dict[str | None, float] = {}
PROBE_TYPE = "probe"
PROBE_FAILURES = 3  # a probe goes through tiers 1, 2 and 3 before it succeeds


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
    """Load jobs succeed; a probe fails PROBE_FAILURES times and records each tier's delay."""
    if job.type != PROBE_TYPE:
        return
    now = time.monotonic()
    if job.attempt > 1:
        tier = job.attempt - 1
        observed_delays_s.setdefault(tier, []).append(now - _failed_at.pop(job.message_id))
    if job.attempt <= PROBE_FAILURES:
        # Taken as late as possible: the nack follows right after the handler returns.
        _failed_at[job.message_id] = time.monotonic()
        raise RuntimeError("benchmark: probe goes to the next tier")
