"""The application headers that ricochet or the broker own: a job's producer may not set them.

The client refuses them in an enqueue's own headers (InvalidJob), so that a job cannot claim a
retry history, a failure or a schedule that it does not have. The worker's bookkeeping headers
are here too.
"""

# Set by the client from enqueue's own arguments; read by the worker.
MAX_RETRIES = "max-retries"
RUN_AT = "run-at"
# The worker's: the retries a job had made when ricochet published it again (to wait out a
# RetryLater or a schedule, or to reach its tier from there).
RETRIES = "ricochet-retries"
# The client's: which enqueue of its message_id a job is, so that a cancel covers the jobs enqueued
# before it and no job enqueued after it (ricochet.broker.cancels). FRESH_ID when the client made
# the message_id up: no cancel can have come before it.
INCARNATION = "ricochet-incarnation"
FRESH_ID = "fresh"

RESERVED_NAMES = frozenset(
    {
        # The broker's, while it dead-letters and redelivers.
        "x-death",
        "x-delivery-count",
        "x-acquired-count",
        # ricochet's, on a failed copy and a replayed job.
        "retry-count",
        "replay-count",
        # Set from enqueue's max_retries, delay and run_at.
        MAX_RETRIES,
        RUN_AT,
        RETRIES,
        INCARNATION,
    }
)
RESERVED_PREFIXES = ("x-first-death-", "x-last-death-", "failed-", "original-")


def is_reserved(name: str) -> bool:
    """True for a header name that ricochet or the broker own."""
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)
