"""What the status and plan tables show: the hint to read failure reasons, and durations."""

import pytest
from ricochet.broker.plan import plan
from ricochet.ops.report import QueueStatus, duration, roles, status_table
from ricochet.settings import Settings


@pytest.mark.parametrize(("failed", "hint"), [(0, False), (None, False), (3, True)])
def test_status_hint(failed: int | None, hint: bool) -> None:
    """Only a non-empty failed queue adds the replay --dry-run --group-by reason hint."""
    rows = [
        QueueStatus("jobs", "main", None, 1, 2),
        QueueStatus("jobs.failed", "failed", None, failed, 0),
    ]
    text = status_table(rows)
    assert ("ricochet replay --dry-run --group-by reason" in text) is hint
    if hint:
        assert text.endswith(
            "3 failed jobs: 'ricochet replay --dry-run --group-by reason' "
            "counts them by reason without moving any"
        )


def test_failed_show_text_has_every_part() -> None:
    """failed show: the failure first, then properties, headers (the traceback on its own),
    the traceback line by line, and the body with its encoding."""
    from ricochet.delivery.failed import FailureInfo
    from ricochet.ops.failed_queue import CopyDetails
    from ricochet.ops.report import copy_text, failed_list_table

    failure = FailureInfo("m1", "mail", "KeyError: 'to'", "permanent", 2, "2026-01-01T00:00:00")
    details = CopyDetails(
        failure,
        properties={"content_type": "application/json"},
        headers={"failed-traceback": "Traceback\n  line\nKeyError: 'to'", "tenant": "acme"},
        body="/w==",
        body_encoding="base64",
    )
    text = copy_text(details).splitlines()
    assert text[:6] == [
        "message_id:  m1",
        "type:        mail",
        "kind:        permanent",
        "retry_count: 2",
        "failed_at:   2026-01-01T00:00:00",
        "reason:      KeyError: 'to'",
    ]
    assert "  content_type: application/json" in text
    assert "  tenant: acme" in text
    assert not any(line.startswith("  failed-traceback") for line in text)
    assert text[text.index("traceback:") + 1 :][:3] == [
        "  Traceback",
        "    line",
        "  KeyError: 'to'",
    ]
    assert text[-2:] == ["body (base64):", "/w=="]
    assert failed_list_table([failure]).splitlines()[1].split()[:5] == [
        "m1", "mail", "permanent", "2", "2026-01-01T00:00:00",
    ]  # fmt: skip


def test_a_jobs_line_breaks_and_escapes_stay_on_one_line() -> None:
    """failed list keeps one line a copy, and failed show one line a field, whatever a handler
    put in its reason or a producer in its headers: line breaks and a terminal's escape
    sequences are shown escaped, never sent to the terminal."""
    from ricochet.delivery.failed import FailureInfo
    from ricochet.ops.failed_queue import CopyDetails
    from ricochet.ops.report import copy_text, failed_list_table

    hostile = "bad\ninput \x1b[2J\r\tdone é"
    failure = FailureInfo("m\n1", "mail", hostile, "permanent", 0, "2026-01-01T00:00:00")
    lines = failed_list_table([failure, failure]).splitlines()
    assert len(lines) == 3
    assert "bad\\ninput \\x1b[2J\\r\\tdone é" in lines[1]
    assert lines[1].startswith("m\\n1  ")
    details = CopyDetails(
        failure,
        properties={"type": "mail"},
        headers={"x-note\n": "a\x07b", "failed-traceback": "Traceback\nValueError: bad\x1b[0m"},
        body="{}",
        body_encoding="utf-8",
    )
    text = copy_text(details)
    assert not any(c in text for c in "\x1b\x07\r")
    assert "reason:      bad\\ninput \\x1b[2J\\r\\tdone é" in text.splitlines()
    assert "  x-note\\n: a\\x07b" in text.splitlines()


@pytest.mark.parametrize(
    ("delay_ms", "shown"),
    [
        (None, ""),
        (90, "90ms"),
        (1500, "1.5s"),
        (30_000, "30s"),
        (52_428_800, "52428.8s"),
        (1_677_721_600, "19.42d"),  # the longest level of the delays, not 1.67772e+06s
        (30 * 86_400_000, "30d"),
    ],
)
def test_duration(delay_ms: int | None, shown: str) -> None:
    assert duration(delay_ms) == shown


def test_status_shows_the_shared_levels_once_after_the_queues_own() -> None:
    """The 25 shared levels are one line, their jobs summed, after the queue's own rows."""
    p = plan(Settings(queue="q", max_retries=1))
    rows = [
        QueueStatus(name, role, delay_ms, int(role != "failed"), 0)
        for name, role, delay_ms in roles(p)
    ]
    lines = status_table(rows).splitlines()
    assert [line.split()[0] for line in lines[1:]] == [
        "q",
        "q.retry.1",
        "q.failed",
        "q.failed.events",
        "ricochet.delay.0-24",
        "ricochet.orphans",
        "ricochet.cancels",
        "ricochet.cancels.snapshot",
        "ricochet.schedules",
    ]
    assert lines[-5].split()[-2] == "25"
