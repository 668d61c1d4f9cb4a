"""The application headers that ricochet or the broker own: a job's producer may not set them.

The client refuses them in an enqueue's own headers (InvalidJob), so that a job cannot claim a
retry history, a failure or a schedule that it does not have. The worker's bookkeeping headers
are here too.
"""

# Set by the client from enqueue's own arguments; read by the worker.
MAX_RETRIES = "max-retries"
RUN_AT = "run-at"
# The job's own retry ladder (SPEC 21): its delays in milliseconds, comma-separated.
RETRY_DELAYS = "retry-delays-ms"
# The job's key (SPEC 28): jobs of one key run one at a time, in their order (ricochet.keys). Its
# queue's key exchange spreads the jobs over the lanes by this header.
KEY = "ricochet-key"
# The worker's: the retries a job had made when ricochet published it again (to wait out a
# RetryLater, a schedule or a delay of its own ladder, or to reach its tier from there).
RETRIES = "ricochet-retries"
# The client's: which enqueue of its message_id a job is, so that a cancel covers the jobs enqueued
# before it and no job enqueued after it (ricochet.broker.cancels). FRESH_ID when the client made
# the message_id up: no cancel can have come before it.
INCARNATION = "ricochet-incarnation"
FRESH_ID = "fresh"
# How many times a job was replayed from the failed queue (by a person or the monitor's relaunch).
REPLAY_COUNT = "replay-count"
# The worker's, on a copy it sends to the delays: since when it waits there (epoch milliseconds),
# and the reason of the failure it waits after, if any (`ricochet waiting` shows them).
WAITING_SINCE = "ricochet-waiting-since"
WAIT_REASON = "ricochet-wait-reason"

# The worker's, on a message that asks whether a queue exists (ricochet.broker.depth): it expires
# at once, and a consumer that gets it all the same drops it.
PROBE = "ricochet-probe"

# The broker's, while it dead-letters and redelivers: a job's deaths, and how often a quorum
# queue handed it out (DELIVERY_COUNTS: RabbitMQ 4.0 counts both, 4.3's delivery limit reads
# DELIVERY_COUNT).
DEATHS = "x-death"
DEATH_PREFIXES = ("x-first-death-", "x-last-death-")
DELIVERY_COUNT = "x-delivery-count"
DELIVERY_COUNTS = (DELIVERY_COUNT, "x-acquired-count")
# A stream's, on each message read from it: where it sits (the cancel store); a stream consumer
# names where to start reading by the same name.
STREAM_OFFSET = "x-stream-offset"

# ricochet's, on a failed copy: what failed, how, when, and where the job was.
FAILED_AT = "failed-at"
FAILED_REASON = "failed-reason"
FAILED_EXCEPTION = "failed-exception"
FAILED_TRACEBACK = "failed-traceback"
FAILED_KIND = "failed-kind"
RETRY_COUNT = "retry-count"
ORIGINAL_QUEUE = "original-queue"
ORIGINAL_ROUTING_KEY = "original-routing-key"
# The job's own headers dropped to fit the copy in one frame, comma-separated.
FAILED_DROPPED_HEADERS = "failed-dropped-headers"
FAILURE_HEADERS = (
    FAILED_AT,
    FAILED_REASON,
    FAILED_EXCEPTION,
    FAILED_TRACEBACK,
    FAILED_KIND,
    RETRY_COUNT,
    ORIGINAL_QUEUE,
    ORIGINAL_ROUTING_KEY,
    FAILED_DROPPED_HEADERS,
)
# ricochet's, on a record in one of the vhost's stores (cancels, schedules): the queue it concerns.
RECORD_QUEUE = "ricochet-queue"
# `ricochet migrate`'s, on a cancel it moved from an earlier ricochet's per-queue store: the store
# it came from. Such a cancel keeps its place before every record of the shared store.
MOVED_FROM = "ricochet-moved-from"

RESERVED_NAMES = frozenset(
    {
        DEATHS,
        *DELIVERY_COUNTS,
        RETRY_COUNT,
        REPLAY_COUNT,
        # Set from enqueue's max_retries, retry_delays_ms, key, delay and run_at.
        MAX_RETRIES,
        KEY,
        RETRY_DELAYS,
        RUN_AT,
        RETRIES,
        INCARNATION,
        WAITING_SINCE,
        WAIT_REASON,
        PROBE,
    }
)
RESERVED_PREFIXES = (*DEATH_PREFIXES, "failed-", "original-")


def is_reserved(name: str) -> bool:
    """True for a header name that ricochet or the broker own."""
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)
