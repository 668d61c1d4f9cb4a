"""Retry ladders: the wait before each retry of a job, one delay per retry (pure).

A ladder is a tuple of 1-25 delays in milliseconds, each 10-86,400,000: a job type's own
(`router.handler(..., retry_delays_ms=...)`), a job's own (`enqueue(..., retry_delays_ms=...)`,
the `retry-delays-ms` header on the wire) or the worker's (RICOCHET_RETRY_DELAYS_MS). The helpers
below make the usual shapes, so that a type's backoff reads as one line.
"""

import re
from collections.abc import Sequence
from typing import TypeGuard

Ladder = tuple[int, ...]

MAX_RETRIES = 25
MIN_DELAY_MS = 10
MAX_DELAY_MS = 86_400_000
MIN_MULTIPLIER = 1.0
MAX_MULTIPLIER = 10.0
ALLOWED = f"1-{MAX_RETRIES} integers (milliseconds), each {MIN_DELAY_MS}-{MAX_DELAY_MS}"
# Spaces are allowed around the commas (an env file reads better so); nothing else.
_TEXT = re.compile(r"\d+(\s*,\s*\d+)*")
# Longer text cannot hold a ladder of readable delays, whatever its spaces: it is refused
# before it is matched or split (int() itself refuses past 4,300 digits).
TEXT_MAX_CHARS = 1024


def exponential(
    delay_ms: int, retries: int, *, multiplier: float = 2.0, max_ms: int | None = None
) -> Ladder:
    """delay, delay x multiplier, delay x multiplier^2, ... for `retries` retries, each capped at
    max_ms (by default the longest delay allowed, a day) and rounded to whole milliseconds.

    exponential(5_000, 3) == (5_000, 10_000, 20_000). ValueError for arguments out of bounds.
    """
    _check_start(delay_ms, retries)
    if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
        raise ValueError(f"multiplier must be a number, not {multiplier!r}")
    if not MIN_MULTIPLIER <= multiplier <= MAX_MULTIPLIER:
        raise ValueError(
            f"multiplier={multiplier!r} is out of bounds: allowed {MIN_MULTIPLIER}-{MAX_MULTIPLIER}"
        )
    cap_ms = MAX_DELAY_MS if max_ms is None else max_ms
    if not is_int(cap_ms) or not delay_ms <= cap_ms <= MAX_DELAY_MS:
        raise ValueError(
            f"max_ms={max_ms!r} is out of bounds: allowed an integer from delay_ms ({delay_ms})"
            f" to {MAX_DELAY_MS}, or None"
        )
    return tuple(growing(delay_ms, multiplier, cap_ms, retries))


def linear(delay_ms: int, retries: int) -> Ladder:
    """delay, 2 x delay, 3 x delay, ... for `retries` retries: linear(2_000, 3) == (2_000,
    4_000, 6_000). ValueError for arguments out of bounds, or a delay that grows past a day."""
    _check_start(delay_ms, retries)
    return checked(tuple(delay_ms * k for k in range(1, retries + 1)))


def fixed(delay_ms: int, retries: int) -> Ladder:
    """The same delay before each of `retries` retries: fixed(60_000, 2) == (60_000, 60_000).
    ValueError for arguments out of bounds."""
    _check_start(delay_ms, retries)
    return (delay_ms,) * retries


def growing(first_ms: int, multiplier: float, cap_ms: int, count: int) -> list[int]:
    """first x multiplier^(k-1) for k = 1..count, capped, in whole ms (unchecked: the worker's
    formula of RICOCHET_RETRY_DELAY_MS and its neighbours, whose settings are checked there)."""
    return [round(min(first_ms * multiplier ** (k - 1), cap_ms)) for k in range(1, count + 1)]


def checked(delays: object) -> Ladder:
    """The delays as a ladder, or ValueError saying what is allowed: a sequence (a tuple, a
    list, a range) of 1-25 integers (bools are no delays), each 10-86,400,000."""
    if not isinstance(delays, Sequence) or isinstance(delays, str | bytes | bytearray):
        raise ValueError(f"{delays!r} is not a ladder: allowed {ALLOWED}, as a sequence")
    if not 1 <= len(delays) <= MAX_RETRIES or not all(map(_is_delay, delays)):
        raise ValueError(f"{delays!r} is out of bounds: allowed {ALLOWED}")
    return tuple(delays)


def parse(text: str) -> Ladder:
    """A ladder written as comma-separated integers ("5000,10000,20000"), or ValueError."""
    if len(text) > TEXT_MAX_CHARS or not _TEXT.fullmatch(text.strip()):
        raise ValueError(f"not {ALLOWED}, comma-separated")
    return checked(tuple(int(part) for part in text.split(",")))


def text(ladder: Ladder) -> str:
    """The ladder as the retry-delays-ms header carries it: "5000,10000,20000"."""
    return ",".join(map(str, ladder))


def spread(delay_ms: int, jitter: float, draw: float) -> int:
    """A wait of delay_ms spread by the jitter j: draw (in [0, 1)) picks it in
    [delay x (1 - j), delay], so that jobs failing together do not come back together."""
    return round(delay_ms * (1.0 - jitter * draw))


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (True is an int to Python, never a count, a delay or an
    instant to ricochet)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_delay(value: object) -> bool:
    return is_int(value) and MIN_DELAY_MS <= value <= MAX_DELAY_MS


def _check_start(delay_ms: int, retries: int) -> None:
    if not _is_delay(delay_ms):
        raise ValueError(
            f"delay_ms={delay_ms!r} is out of bounds: allowed an integer from {MIN_DELAY_MS} "
            f"to {MAX_DELAY_MS}"
        )
    if not is_int(retries) or not 1 <= retries <= MAX_RETRIES:
        raise ValueError(
            f"retries={retries!r} is out of bounds: allowed an integer from 1 to {MAX_RETRIES}"
        )
