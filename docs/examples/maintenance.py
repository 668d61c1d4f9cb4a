"""Maintenance jobs on a timer, held by the broker: no scheduler process beside the workers.
Run it: RICOCHET_HANDLER=maintenance:router ricochet worker (as many as you like)."""

from datetime import timedelta

from ricochet import Job, Router

router = Router()

# Integrations stuck in an active sync for over 15 minutes go back to pending.
router.schedule(
    "polling-stale-check",
    "polling.stale_check",
    every=timedelta(minutes=15),
    payload={"stale_threshold_ms": 900_000},
)
# Integrations whose sync failed get another chance: an outage or a rate limit may be over.
router.schedule("polling-relaunch-failed", "polling.relaunch_failed", every=timedelta(minutes=30))


@router.handler("polling.stale_check", max_retries=0)  # the next run comes in 15 minutes
async def stale_check(job: Job) -> None:
    threshold_ms = job.payload["stale_threshold_ms"]
    # Reset the integrations stuck longer than threshold_ms, keyed on job.message_id
    # ("polling-stale-check@2026-11-26T18:15:00.000Z": one per occurrence).
    _ = threshold_ms


@router.handler("polling.relaunch_failed", max_retries=0)
async def relaunch_failed(job: Job) -> None:
    # Retry the integrations in a failed state.
    pass
