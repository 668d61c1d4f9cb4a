"""A job's key (SPEC 28): jobs of one key run one at a time, in their order (pure).

A key is a string of at most 255 bytes in UTF-8, given to enqueue(..., key=), carried in the
`ricochet-key` header, or derived from the payload by a type's key function. A queue's jobs with
a key run from its key lanes (broker/plan.py's key_lanes_plan, worker/lanes.py): the broker
hashes the key onto a lane, and each lane delivers one job at a time to one consumer of the
vhost.
"""

from collections.abc import Callable, Mapping
from typing import Any

from ricochet.headers import KEY

MAX_BYTES = 255


def checked(value: object, what: str = "key") -> str:
    """The key, or ValueError naming what it is when it is not a non-empty string of at most
    255 bytes in UTF-8."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} is {value!r:.100}: a non-empty str is allowed")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} is {value!r:.100}: not text UTF-8 can carry") from None
    if size > MAX_BYTES:
        raise ValueError(f"{what} is {size} bytes in UTF-8: at most {MAX_BYTES} are allowed")
    return value


def key_of(headers: Mapping[str, Any], derive: Callable[[], Any] | None = None) -> str | None:
    """The job's key: its header's, else what derive() (its type's key function on its payload)
    returns, else None. ValueError for a header or a derived key that cannot be one, which
    fails the job at once: run without its key, it could run beside a job of that key."""
    if KEY in headers:
        value = headers[KEY]
        if isinstance(value, bytes):  # a foreign producer's long string
            value = value.decode("utf-8", "replace")
        return checked(value, f"the {KEY} header")
    if derive is None:
        return None
    return checked(derive(), "the key its type's key function returned")
