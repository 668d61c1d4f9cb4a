"""The error tree: every error ricochet raises on purpose derives from RicochetError."""


class RicochetError(Exception):
    """Raised for any failure that ricochet itself detects."""


class ConfigError(RicochetError):
    """Raised when settings, the handler reference or the broker's topology conflict (exit 2)."""


class BrokerUnavailable(RicochetError):
    """Raised when the broker cannot be reached within the startup wait (exit 1)."""


class NotConfirmed(RicochetError):
    """Raised when the broker did not confirm an enqueued job (refused, unroutable, or cut off)."""


class InvalidJob(ValueError):
    """Raised by enqueue, before anything is sent, for an argument out of bounds (it names it)."""


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


class UnknownJobType(PermanentError):
    """Raised when a Router has no handler for the job's type."""


class HandlerTimeout(RicochetError):
    """Raised when a handler runs longer than RICOCHET_HANDLER_TIMEOUT_S (a transient failure)."""


class PoisonMessage(RicochetError):
    """Raised for a delivery that keeps coming back unacked, as if it killed its worker."""


class ManagementUnavailable(ConfigError):
    """Raised when the management HTTP API cannot be reached or refuses the credentials (exit 2)."""
