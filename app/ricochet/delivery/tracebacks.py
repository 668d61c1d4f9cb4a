"""Formatting a job's traceback, with the stack formatted once per place it was raised from."""

import traceback
from types import CodeType, TracebackType

# Distinct stacks kept; a worker's failures come from a handful of places.
MAX_STACKS = 256
_stacks: dict[tuple[tuple[CodeType, int, int], ...], str] = {}


def format_traceback(exc: BaseException) -> str:
    """traceback.format_exception's text for exc.

    Formatting a stack reads and parses its source lines again every time, and jobs that fail
    usually fail where the one before failed. So the stack of an exception that has no cause,
    context or sub-exceptions to show is formatted once per place, keyed by the code and
    instruction of each frame, and only its last line (type and message) is formatted each time.
    """
    chained = exc.__cause__ is not None or (
        exc.__context__ is not None and not exc.__suppress_context__
    )
    if chained or isinstance(exc, BaseExceptionGroup):
        return "".join(traceback.format_exception(exc))
    return _stack(exc.__traceback__) + "".join(traceback.format_exception_only(exc))


def _stack(tb: TracebackType | None) -> str:
    if tb is None:
        return ""
    key = _positions(tb)
    text = _stacks.get(key)
    if text is None:
        if len(_stacks) >= MAX_STACKS:
            _stacks.clear()
        frames = traceback.extract_tb(tb).format()
        text = _stacks[key] = "".join(["Traceback (most recent call last):\n", *frames])
    return text


def _positions(tb: TracebackType | None) -> tuple[tuple[CodeType, int, int], ...]:
    positions = []
    while tb is not None:
        positions.append((tb.tb_frame.f_code, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    return tuple(positions)
