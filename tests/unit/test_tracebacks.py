"""A job's traceback reads exactly as traceback.format_exception writes it, cached or not."""

import traceback
from collections.abc import Callable

import pytest
from ricochet.delivery import tracebacks
from ricochet.delivery.tracebacks import format_traceback


def fails_with(message: str) -> None:
    raise ValueError(message)


def fails_in_part_of_a_line(values: dict[str, int]) -> int:
    return values["a"] + values["missing"] * 2  # the caret lines point at the subscript


def deeper(n: int) -> None:
    if n == 0:
        fails_with("at the bottom")
    deeper(n - 1)


def with_cause() -> None:
    try:
        fails_with("first")
    except ValueError as error:
        raise RuntimeError("then this") from error


def with_context() -> None:
    try:
        fails_with("first")
    except ValueError:
        raise RuntimeError("while handling it")  # noqa: B904 - the implicit context is the case


def with_suppressed_context() -> None:
    try:
        fails_with("first")
    except ValueError:
        raise RuntimeError("the first one is hidden") from None


def with_notes() -> None:
    try:
        fails_with("noted")
    except ValueError as error:
        error.add_note("a note the handler added")
        raise


def a_group() -> None:
    raise ExceptionGroup("two failed", [ValueError("one"), KeyError("two")])


def caught(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except BaseException as error:  # every kind, groups too
        return error
    raise AssertionError("did not raise")


CASES: dict[str, Callable[[], object]] = {
    "plain": lambda: fails_with("plain"),
    "carets": lambda: fails_in_part_of_a_line({"a": 1}),
    "recursion": lambda: deeper(5),
    "cause": with_cause,
    "context": with_context,
    "suppressed context": with_suppressed_context,
    "notes": with_notes,
    "group": a_group,
}


@pytest.mark.parametrize("name", CASES)
def test_reads_as_the_standard_library_writes_it(name: str) -> None:
    """Chained, grouped, annotated or plain: the same text, the first time and when cached."""
    for _ in range(2):
        error = caught(CASES[name])
        assert format_traceback(error) == "".join(traceback.format_exception(error))


def test_a_cached_stack_carries_each_exceptions_own_message() -> None:
    """The same place with another message: the stack is formatted once, the last line each time."""
    texts = []
    for n in (1, 2):
        error = caught(lambda: fails_with(f"job {n}: no such user"))  # noqa: B023 - called at once
        texts.append(format_traceback(error))
        assert texts[-1] == "".join(traceback.format_exception(error))
        if n == 1:
            stacks = dict(tracebacks._stacks)
    assert tracebacks._stacks == stacks
    assert texts[0].endswith("ValueError: job 1: no such user\n")
    assert texts[1].endswith("ValueError: job 2: no such user\n")


def test_an_exception_never_raised_has_no_stack() -> None:
    error = ValueError("built, not raised")
    assert format_traceback(error) == "ValueError: built, not raised\n"


def test_the_cache_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stacks from more places than it holds start it afresh rather than growing it."""
    monkeypatch.setattr(tracebacks, "MAX_STACKS", 2)
    monkeypatch.setattr(tracebacks, "_stacks", {})
    for name in ("plain", "carets", "recursion"):
        error = caught(CASES[name])
        assert format_traceback(error) == "".join(traceback.format_exception(error))
    assert len(tracebacks._stacks) == 1
