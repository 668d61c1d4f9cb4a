"""The error tree: every error ricochet raises on purpose derives from RicochetError."""

import datetime as dt
import math

# The longest a RetryLater may ask to wait: a day, as the longest retry tier.
RETRY_LATER_MAX_S = 86_400


class RicochetError(Exception):
    """Raised for any failure that ricochet itself detects."""


class ConfigError(RicochetError):
    """Raised when settings, the handler reference or the broker's topology conflict (exit 2)."""


class TopologyConflict(ConfigError):
    """Raised when a queue or exchange of the topology was declared (by someone else) with other
    arguments than the settings': only deleting it mends it. A worker of several queues reports
    it and declares the queue again with backoff; a worker of one queue stops at start (exit 2)."""


class BrokerUnavailable(RicochetError):
    """Raised when the broker cannot be reached within the startup wait (exit 1)."""


class NotConfirmed(RicochetError):
    """Raised when the broker did not confirm an enqueued job (refused, unroutable, or cut off)."""


class InvalidJob(RicochetError, ValueError):
    """Raised by enqueue, before anything is sent, for an argument out of bounds (it names it)."""


class ClientClosed(RicochetError, RuntimeError):
    """Raised by a call on a Client or SyncClient after its close()."""


class MissingQueue(RicochetError):
    """Raised when a queue that ricochet declares is not there (nothing declared it yet)."""

    def __init__(self, queue: str) -> None:
        super().__init__(
            f"queue {queue!r} does not exist: run 'ricochet topology' or start a worker first"
        )


class PermanentError(RicochetError):
    """Raised by a handler when retrying cannot help: the job goes to the failed queue at once."""


class InvalidPayload(PermanentError):
    """Raised when the body is not valid JSON or fails the handler's payload model."""


class InvalidProperties(PermanentError):
    """Raised for a delivery whose message properties cannot be decoded (its job never runs)."""


class CopyTooLarge(PermanentError):
    """Raised for a job whose copy, published again to wait, cannot fit one frame of the broker."""


class UnknownJobType(PermanentError):
    """Raised when a Router has no handler for the job's type."""


class InvalidSchedule(PermanentError):
    """Raised for a job whose run-at header cannot be read as a time with a UTC offset."""


class InvalidKey(PermanentError):
    """Raised for a job whose key cannot be read: its ricochet-key header, or what its type's
    key function gives (run without it, it could run beside a job of its key)."""


class InvalidRetryDelays(PermanentError):
    """Raised for a job whose retry-delays-ms header cannot be read as a ladder of delays."""


class RetryLater(RicochetError):
    """Raised by a handler whose job must not run again before `after` (seconds or a timedelta,
    0 < after <= 86,400 s): a transient failure that spends an attempt."""

    def __init__(self, after: float | dt.timedelta, message: str = "") -> None:
        seconds = after.total_seconds() if isinstance(after, dt.timedelta) else after
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or not 0 < seconds <= RETRY_LATER_MAX_S
        ):
            raise ValueError(
                f"RetryLater after={after!r} is invalid: allowed 0 < after <= "
                f"{RETRY_LATER_MAX_S} seconds (a number or a timedelta)"
            )
        super().__init__(message or f"retry no earlier than {seconds:g} s from now")
        self.after_s = float(seconds)


class JobCancelled(RicochetError):
    """Raised by job.raise_if_cancelled() once a cancel covers the running job (a handler may
    raise it too): the job ends cancelled, acked, never retried nor failed."""


class HandlerTimeout(RicochetError):
    """Raised when a handler runs longer than RICOCHET_HANDLER_TIMEOUT_S (a transient failure)."""


class PoisonMessage(RicochetError):
    """Raised for a delivery that keeps coming back unacked, as if it killed its worker."""


class ManagementUnavailable(ConfigError):
    """Raised when the management HTTP API cannot be reached or refuses the credentials (exit 2)."""
