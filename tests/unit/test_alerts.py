"""The alert decisions: rate limiting per failure reason and the failed-queue threshold."""

import pytest
from ricochet.delivery.failed import FailureInfo
from ricochet.observe.alerts import (
    RECOVERED,
    THRESHOLD,
    DepthWatch,
    ReasonLimiter,
    depth_alert,
    job_failed_alert,
    reason_key,
)


def failure(reason: str, message_id: str = "m") -> FailureInfo:
    return FailureInfo(message_id, "report", reason, "permanent", 0, "2024-01-01T00:00:00+00:00")


# (time, reason) offered with a 10 s interval -> suppressed count alerted, or None (held back)
@pytest.mark.parametrize(
    ("offers", "expected"),
    [
        pytest.param([(0, "a")], [0], id="first failure alerts at once"),
        pytest.param([(0, "a"), (1, "a"), (2, "a")], [0, None, None], id="burst held back"),
        pytest.param([(0, "a"), (1, "b")], [0, 0], id="reasons are limited apart"),
        pytest.param([(0, "a"), (10, "a")], [0, 0], id="interval is the minimum spacing"),
        pytest.param([(0, "a"), (9.9, "a")], [0, None], id="just inside the interval"),
        pytest.param(
            [(0, "a"), (1, "a"), (2, "a"), (12, "a")], [0, None, None, 2], id="suppressed count"
        ),
        pytest.param(
            [(0, "a"), (1, "a"), (12, "a"), (13, "a"), (30, "a")],
            [0, None, 1, None, 1],
            id="count restarts after each alert",
        ),
        pytest.param(
            [(0, "KeyError: 'order-17'"), (1, "KeyError: 'order-18'")],
            [0, None],
            id="ids in the reason do not defeat the limit",
        ),
    ],
)
def test_offer(offers: list[tuple[float, str]], expected: list[int | None]) -> None:
    """One alert per reason per interval; the next one carries how many were held back."""
    limiter = ReasonLimiter(interval_s=10)
    assert [limiter.offer(reason_key(r), failure(r), t) for t, r in offers] == expected


@pytest.mark.parametrize(
    ("offers", "due_at", "expected"),
    [
        pytest.param([(0, "a")], 10, [], id="nothing held back"),
        pytest.param([(0, "a"), (1, "a")], 5, [], id="not due yet"),
        pytest.param([(0, "a"), (1, "a", "m1")], 10, [("m1", 0)], id="single held back"),
        pytest.param(
            [(0, "a"), (1, "a", "m1"), (2, "a", "m2"), (3, "a", "m3")],
            10,
            [("m3", 2)],
            id="latest of a burst, with the others counted",
        ),
        pytest.param(
            [(0, "a"), (1, "a", "m1"), (0, "b"), (2, "b", "m2")],
            10,
            [("m1", 0), ("m2", 0)],
            id="each reason on its own",
        ),
    ],
)
def test_due(
    offers: list[tuple[float, ...]], due_at: float, expected: list[tuple[str, int]]
) -> None:
    """A burst's tail is reported once its interval has passed, so no burst goes unreported."""
    limiter = ReasonLimiter(interval_s=10)
    for t, reason, *mid in offers:
        offered = failure(str(reason), str(mid[0]) if mid else "first")
        limiter.offer(reason_key(offered.reason), offered, float(t))
    assert [(f.message_id, n) for _, f, n in limiter.due(due_at)] == expected


def test_due_starts_a_new_interval() -> None:
    """After a trailing alert the reason waits a full interval again before the next one."""
    limiter = ReasonLimiter(interval_s=10)
    limiter.offer("a", failure("a"), 0)
    limiter.offer("a", failure("a"), 1)
    assert len(limiter.due(10)) == 1
    assert limiter.offer("a", failure("a"), 15) is None
    assert limiter.due(15) == []
    assert [n for *_, n in limiter.due(20)] == [0]
    assert limiter.due(40) == []
    assert limiter.offer("a", failure("a"), 41) == 0


@pytest.mark.parametrize(
    ("depths", "expected"),
    [
        pytest.param([0, 5, 9], [None, None, None], id="below stays quiet"),
        pytest.param([9, 10, 11, 50], [None, THRESHOLD, None, None], id="reaching alerts once"),
        pytest.param([10, 12, 9, 3], [THRESHOLD, None, RECOVERED, None], id="recovers once"),
        pytest.param([10, 9, 10, 9], [THRESHOLD, RECOVERED, THRESHOLD, RECOVERED], id="again"),
        pytest.param([100], [THRESHOLD], id="already above at start"),
    ],
)
def test_depth_watch(depths: list[int], expected: list[str | None]) -> None:
    """The threshold alert fires when the depth reaches it, recovered when it falls below."""
    watch = DepthWatch(threshold=10)
    assert [watch.observe(d) for d in depths] == expected


def test_depth_watch_while_a_reader_holds_copies() -> None:
    """A reader (failed list, replay, a console page) holds the copies it reads unacked, which
    the depth does not count: the queue is not taken for recovered meanwhile, and the alert
    comes once, not again when the reader hands them back."""
    watch = DepthWatch(threshold=10)
    readings = [(12, False), (0, True), (3, True), (12, False), (4, False), (15, True)]
    assert [watch.observe(d, held) for d, held in readings] == [
        THRESHOLD, None, None, None, RECOVERED, THRESHOLD,
    ]  # fmt: skip


def test_alert_bodies() -> None:
    """The webhook bodies have exactly the fields of the contract."""
    assert job_failed_alert("jobs", failure("ValueError: x", "m1"), 3) == {
        "event": "job.failed",
        "queue": "jobs",
        "message_id": "m1",
        "type": "report",
        "reason": "ValueError: x",
        "kind": "permanent",
        "retry_count": 0,
        "failed_at": "2024-01-01T00:00:00+00:00",
        "suppressed": 3,
    }
    assert depth_alert(THRESHOLD, "jobs", 12, 10) == {
        "event": "failed_queue.threshold",
        "queue": "jobs",
        "depth": 12,
        "threshold": 10,
    }


@pytest.mark.parametrize(
    ("reason", "key"),
    [
        ("ValueError: no rows", "ValueError: no rows"),
        ("KeyError: 'order-17'", "KeyError: 'order-#'"),
        ("HTTPError: 503 for /users/12/orders", "HTTPError: # for /users/#/orders"),
        ("NotFound: 550e8400-e29b-41d4-a716-446655440000", "NotFound: #"),
        ("NotFound: job a3f9c0de12 gone", "NotFound: job # gone"),
        ("TimeoutError: read timed out", "TimeoutError: read timed out"),
    ],
)
def test_reason_key(reason: str, key: str) -> None:
    """Numbers, UUIDs and ids with digits are masked; the words of the reason are kept."""
    assert reason_key(reason) == key
