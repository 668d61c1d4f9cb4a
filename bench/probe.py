"""Retry-delay probes, timed alike in the ricochet handler and in the raw loop (no app imports)."""

import time

PROBE_TYPE = "probe"
PROBE_FAILURES = 3  # a probe goes through tiers 1, 2 and 3 before it succeeds
# Tier k's observed delays (seconds); the consumer process reports them when it is done.
observed_delays_s: dict[int, list[float]] = {}
_failed_at: dict[str | None, float] = {}


def probe_fails(message_id: str | None, attempt: int) -> bool:
    """Record how long a probe waited in the tier it comes back from; True while it must fail.

    Timed from just before the failure is reported to the start of the next attempt.
    """
    if attempt > 1:
        waited_s = time.monotonic() - _failed_at.pop(message_id)
        observed_delays_s.setdefault(attempt - 1, []).append(waited_s)
    if attempt <= PROBE_FAILURES:
        _failed_at[message_id] = time.monotonic()
        return True
    return False
