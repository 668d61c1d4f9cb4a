"""Whether a worker process still makes progress, judged by its beats: each process sends one
from its event loop every BEAT_S, so a loop that stops (a handler holding the GIL in C code, a
deadlock) stops beating."""

import enum

# How often a process beats, and how long the parent lets pass between its checks.
BEAT_S = 1.0
# Beats missed before the process is late: /readyz says 503 while it is.
LATE_S = 3 * BEAT_S
# Beyond the longest handler timeout in force: a handler may keep its process's loop from
# running for no longer than its timeout (a sync handler holding the GIL) before the process
# counts as wedged. Small enough that the parent sees it, and kills it, within that timeout
# + 10 s of its last beat, checks and beats late by a second or two on a busy machine included.
WEDGED_AFTER_S = 5.0


class Liveness(enum.Enum):
    ALIVE = "alive"
    LATE = "late"  # not ready, but given its handlers' time
    WEDGED = "wedged"  # to be killed and replaced


def liveness(last_beat_s: float | None, now_s: float, longest_timeout_s: float) -> Liveness:
    """What a process whose last beat came at last_beat_s (None: none yet, while it imports its
    handler: no process is judged before its loop runs) is at now_s, its handlers allowed
    longest_timeout_s (RICOCHET_HANDLER_TIMEOUT_S or a type's timeout_s, the longer)."""
    if last_beat_s is None:
        return Liveness.ALIVE
    silent_s = now_s - last_beat_s
    if silent_s > longest_timeout_s + WEDGED_AFTER_S:
        return Liveness.WEDGED
    if silent_s > LATE_S:
        return Liveness.LATE
    return Liveness.ALIVE
