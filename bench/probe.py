"""Retry-delay probes, timed alike in the ricochet handler and in the raw loop (no app imports)."""

import datetime as dt
import time

PROBE_TYPE = "probe"
# The wait's probes (bench.wait): run at a time, or RetryLater on the first attempt.
SCHEDULED_TYPE = "scheduled"
LATER_TYPE = "later"
# A type whose own ladder waits D s (SPEC 21) is named "ladder-D"; its probes fail once.
LADDER_TYPE = "ladder"
PROBE_DELAYS_S = (1, 10, 60)
PROBE_FAILURES = 3  # a probe goes through tiers 1, 2 and 3 before it succeeds
# Tier k's observed delays (seconds); the consumer process reports them when it is done.
observed_delays_s: dict[int, list[float]] = {}
_failed_at: dict[str | None, float] = {}
# The wait's probes: "scheduled-D" / "later-D" -> seconds each ran after its time.
lateness_s: dict[str, list[float]] = {}


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


def schedule_lateness(
    message_id: str | None, kind: str, attempt: int, headers: dict[str, object]
) -> float | None:
    """For a wait probe: the seconds to ask a RetryLater for (its first attempt), else None
    after recording how late it ran (a scheduled probe against its run-at, wall clock; a
    RetryLater probe against its failure, monotonic)."""
    delay_s = headers.get("probe-delay-s")
    assert isinstance(delay_s, int)
    key = f"{kind}-{delay_s}"
    if kind == SCHEDULED_TYPE:
        run_at = headers["run-at"]
        assert isinstance(run_at, str)
        late = time.time() - _epoch(run_at)
    elif attempt == 1:
        _failed_at[message_id] = time.monotonic()
        return float(delay_s)
    else:
        late = time.monotonic() - _failed_at.pop(message_id) - delay_s
    lateness_s.setdefault(key, []).append(late)
    return None


def ladder_type(delay_s: int) -> str:
    """The job type whose own ladder waits delay_s."""
    return f"{LADDER_TYPE}-{delay_s}"


def ladder_fails(message_id: str | None, attempt: int, delay_s: int) -> bool:
    """For a probe of a type's ladder: True on its first attempt (it fails, and waits its type's
    delay), else record how late its retry ran after that failure (monotonic)."""
    if attempt == 1:
        _failed_at[message_id] = time.monotonic()
        return True
    late = time.monotonic() - _failed_at.pop(message_id) - delay_s
    lateness_s.setdefault(ladder_type(delay_s), []).append(late)
    return False


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()
