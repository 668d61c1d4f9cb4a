"""Replay's pure parts: which copies match, and the headers a replayed job carries."""

import pytest
from ricochet.delivery.failed import FailureInfo, read_failure
from ricochet.delivery.retry import FailureKind
from ricochet.headers import FAILURE_HEADERS
from ricochet.monitor.relaunch import relaunch_selection
from ricochet.ops.replay import COUNT_MAX, replayed_headers
from ricochet.ops.selection import Selection
from ricochet.settings import FAILED_KINDS, Settings

COPY = FailureInfo("m1", "report", "ValueError: bad input", "permanent", 0, "2024-01-01T00:00:00")


@pytest.mark.parametrize(
    ("selection", "matches"),
    [
        (Selection(), True),
        (Selection(reason="bad"), True),
        (Selection(reason="ValueError: bad input"), True),
        (Selection(reason="Bad"), False),
        (Selection(reason="KeyError"), False),
        (Selection(type="report"), True),
        (Selection(type="rep"), False),
        (Selection(message_id="m1"), True),
        (Selection(message_id="m"), False),
        (Selection(reason="bad", type="report", message_id="m1"), True),
        (Selection(reason="bad", type="other"), False),
    ],
)
def test_selection(selection: Selection, matches: bool) -> None:
    """--reason is a case-sensitive substring; --type and --message-id match exactly; all AND."""
    assert selection.matches(COPY) is matches


def failed_copy_headers(**extra: object) -> dict[str, object]:
    headers: dict[str, object] = {name: "x" for name in FAILURE_HEADERS}
    headers.update({"tenant": "acme", "max-retries": 2}, **extra)
    return headers


@pytest.mark.parametrize(
    ("extra", "replay_count"),
    [
        ({}, 1),
        ({"replay-count": 1}, 2),
        ({"replay-count": 7}, 8),
        ({"replay-count": "junk"}, 1),
        ({"replay-count": -3}, 1),
        ({"replay-count": True}, 1),
        ({"replay-count": COUNT_MAX - 1}, COUNT_MAX),
        ({"replay-count": COUNT_MAX}, COUNT_MAX),  # the largest a header carries: it stays
    ],
)
def test_replayed_headers(extra: dict[str, object], replay_count: int) -> None:
    """The failure headers go, the application's stay, replay-count counts up from 0, and stops
    at the largest signed 64-bit integer, the most an AMQP header carries."""
    assert replayed_headers(failed_copy_headers(**extra)) == {
        "tenant": "acme",
        "max-retries": 2,
        "replay-count": replay_count,
    }


def test_replayed_headers_drop_broker_bookkeeping() -> None:
    """Death and delivery counters of the failed queue would cost the job retries or mark it
    poison in the main queue, so none survives the replay."""
    headers = failed_copy_headers(
        **{
            "x-death": [{"queue": "q", "reason": "rejected", "count": 3}],
            "x-first-death-queue": "q",
            "x-delivery-count": 9,
            "x-acquired-count": 9,
        }
    )
    assert set(replayed_headers(headers)) == {"tenant", "max-retries", "replay-count"}


@pytest.mark.parametrize(
    ("headers", "amqp_type", "body", "expected"),
    [
        (
            {
                "failed-reason": "E: x",
                "failed-kind": "exhausted",
                "retry-count": 3,
                "failed-at": "t",
            },
            "report",
            b"{}",
            FailureInfo("m", "report", "E: x", "exhausted", 3, "t"),
        ),
        ({}, None, b'{"type": "mail"}', FailureInfo("m", "mail", "unknown", None, None, None)),
        (
            {"failed-reason": b"E: bytes", "retry-count": "3"},
            None,
            b"not json",
            FailureInfo("m", None, "E: bytes", None, None, None),
        ),
    ],
)
def test_read_failure(
    headers: dict[str, object], amqp_type: str | None, body: bytes, expected: FailureInfo
) -> None:
    """A copy's failure is read from its headers; the type as Job.type resolves it."""
    assert read_failure(headers, "m", amqp_type, body) == expected


@pytest.mark.parametrize(
    ("selection", "matches"),
    [
        (Selection(kind="permanent"), True),
        (Selection(kind="exhausted"), False),
        (Selection(reason_is="ValueError: bad input"), True),
        (Selection(reason_is="ValueError: bad"), False),
        (Selection(kind="permanent", reason_is="ValueError: bad input", type="report"), True),
    ],
)
def test_selection_by_kind_and_whole_reason(selection: Selection, matches: bool) -> None:
    """--kind matches exactly; a console group matches its whole reason, not a part of it."""
    assert selection.matches(COPY) is matches


@pytest.mark.parametrize(
    ("posted", "matches"),
    [
        ("line one\nline two\rthree", True),
        ("line one\r\nline two\r\nthree", True),  # a browser's form: every break as CRLF
        ("line one\nline two\nthree", True),  # a page's CR is read as LF
        ("line one line two three", False),
        ("line one\nline two", False),
    ],
)
def test_whole_reason_alike_whatever_its_line_breaks(posted: str, matches: bool) -> None:
    """A console group of a multi-line reason matches what a browser posts back for it: the
    same text, line breaks of any kind alike."""
    copy = FailureInfo("m", "report", "line one\nline two\rthree", "permanent", 0, None)
    assert Selection(reason_is=posted).matches(copy) is matches


def test_the_relaunch_selects_its_kinds_below_the_replay_maximum() -> None:
    """RICOCHET_RELAUNCH_KINDS and RICOCHET_RELAUNCH_MAX: a copy of a kind chosen, replayed
    fewer times than the maximum; the failed kinds the setting allows are the worker's."""
    relaunch = relaunch_selection(Settings(relaunch_kinds="exhausted,poison", relaunch_max=3))

    def copy(kind: str, replays: int) -> FailureInfo:
        return FailureInfo("m", "t", "E: x", kind, 3, None, replays)

    assert relaunch.matches(copy("exhausted", 0))
    assert relaunch.matches(copy("poison", 2))
    assert not relaunch.matches(copy("exhausted", 3))
    assert not relaunch.matches(copy("permanent", 0))
    assert set(FAILED_KINDS) == {kind.value for kind in FailureKind}
    assert "replay_count" not in copy("exhausted", 1).as_dict()
    read = read_failure({"failed-kind": "exhausted", "replay-count": 2}, "m", "t", b"{}")
    assert read.replay_count == 2


def test_a_replayed_job_carries_no_incarnation_token() -> None:
    """A replayed job is ricochet's publish, judged by its replay time against a cancel: the
    client's token (which a cancel made before the replay would cover) is left behind."""
    headers = replayed_headers({"ricochet-incarnation": "0123456789abcdef", "x-app": "kept"})
    assert headers == {"x-app": "kept", "replay-count": 1}
