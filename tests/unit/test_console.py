"""The console's pure parts: grouping by reason, the token check, and pages that escape
everything a job carries."""

import re

import pytest
from ricochet.delivery.failed import FailureInfo
from ricochet.monitor.console import templates, token_matches
from ricochet.monitor.groups import group_by_reason, listing
from ricochet.ops.failed_queue import CopyDetails, body_text, jsonable

SCRIPT = "<script>alert('x')</script>"


def info(
    message_id: str, reason: str, at: str | None, job_type: str | None = "mail"
) -> FailureInfo:
    return FailureInfo(message_id, job_type, reason, "permanent", 0, at)


def test_groups_by_exact_reason_largest_first() -> None:
    """One group per exact reason, with its count, types and newest failed_at; the largest group
    first, ties by the most recent; jobs keep queue order."""
    groups = group_by_reason(
        [
            info("a", "E: one", "2026-01-01T00:00:02+00:00"),
            info("b", "E: two", "2026-01-01T00:00:09+00:00", "report"),
            info("c", "E: one", "2026-01-01T00:00:05+00:00", "report"),
            info("d", "E: three", None, None),
            info("e", "E: one", "2026-01-01T00:00:01+00:00"),
        ]
    )
    assert [(g.reason, g.count) for g in groups] == [("E: one", 3), ("E: two", 1), ("E: three", 1)]
    one = groups[0]
    assert one.types == {"mail", "report"}
    assert one.newest_failed_at == "2026-01-01T00:00:05+00:00"
    assert [j.message_id for j in one.jobs] == ["a", "c", "e"]
    assert groups[2].types == {"-"}
    assert groups[2].newest_failed_at is None


def test_group_anchors_are_stable_and_safe() -> None:
    """The same reason gives the same anchor on every page; it is made of safe characters."""
    [a] = group_by_reason([info("a", SCRIPT, None)])
    [b] = group_by_reason([info("b", SCRIPT, None)])
    assert a.anchor == b.anchor
    assert re.fullmatch(r"g-[0-9a-f]{12}", a.anchor)


@pytest.mark.parametrize(
    ("expected", "given", "matches"),
    [
        ("0123456789abcdef", "0123456789abcdef", True),
        ("0123456789abcdef", "0123456789abcdeF", False),
        ("0123456789abcdef", "", False),
        ("0123456789abcdef", None, False),
        (None, "anything-at-all-here", False),
        (None, None, False),
    ],
)
def test_token_matches(expected: str | None, given: str | None, matches: bool) -> None:
    """Only the configured token, exactly; nothing matches when none is configured."""
    assert token_matches(expected, given) is matches


def test_index_page_escapes_what_jobs_carry() -> None:
    """Reasons, types and ids from jobs appear as text, never as markup."""
    failures = [info(f"id-{SCRIPT}", f"ValueError: {SCRIPT}", None, job_type=SCRIPT)]
    found = listing(failures)
    html = (
        templates()
        .get_template("failed.html")
        .render(
            queue="q",
            failed_queue="q.failed",
            writable=True,
            total=1,
            reasons=1,
            page=found.pages[0],
            table=found.reasons_from(found.pages[0]),
            pages=1,
            done={},
        )
    )
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html
    # The link to the job's page encodes the id as one path segment.
    assert 'href="/failed/id-%3Cscript%3Ealert%28%27x%27%29%3C%2Fscript%3E"' in html


def test_job_page_escapes_body_headers_and_traceback() -> None:
    """A job's page shows its body, headers and traceback as text."""
    details = CopyDetails(
        failure=info(SCRIPT, SCRIPT, None),
        properties={"type": SCRIPT},
        headers={"failed-traceback": f"Traceback: {SCRIPT}", SCRIPT: {"nested": SCRIPT}},
        body=f'{{"html": "{SCRIPT}"}}',
        body_encoding="utf-8",
    )
    html = (
        templates()
        .get_template("job.html")
        .render(
            queue="q",
            failed_queue="q.failed",
            writable=True,
            message_id=SCRIPT,
            copies=[details],
            count=1,
            compact=False,
        )
    )
    assert "<script>" not in html
    assert html.count("&lt;script&gt;") >= 6


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (b'{"a": 1}', ('{"a": 1}', "utf-8")),
        ("é".encode(), ("é", "utf-8")),
        (b"\xff\x00", ("/wA=", "base64")),
        (b"", ("", "utf-8")),
    ],
)
def test_body_text(body: bytes, shown: tuple[str, str]) -> None:
    """UTF-8 bodies as text; anything else as base64, saying so."""
    assert body_text(body) == shown


def test_jsonable_header_values() -> None:
    """Header values of every AMQP kind become JSON: bytes as text (or base64), times ISO."""
    import datetime as dt
    from decimal import Decimal

    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert jsonable({"b": b"ok", "raw": bytearray(b"\xff"), "t": at, "d": Decimal("1.5")}) == {
        "b": "ok",
        "raw": "/w==",
        "t": "2026-01-02T03:04:05+00:00",
        "d": "1.5",
    }
    assert jsonable([1, (2, b"x")]) == [1, [2, "x"]]
