"""What bounds a console page: the list cut into pages, values clipped, the worst a job can
carry still under 1 MB; and scans shared by the page views that wait for them (pure, or asyncio
without a broker)."""

import asyncio
from typing import Any

import pytest
from ricochet.delivery.failed import REASON_MAX_CHARS, FailureInfo
from ricochet.monitor.console import (
    PAGE_MAX_BYTES,
    Console,
    Flights,
    Found,
    Stop,
    clip,
    names,
    templates,
)
from ricochet.monitor.groups import GROUPS_PER_PAGE, JOBS_PER_PAGE, REASONS_LISTED, listing
from ricochet.names import Names
from ricochet.ops.failed_queue import CopyDetails
from ricochet.settings import Settings

# The character escaping makes longest: '"' becomes &#34;, five times its length.
WORST = '"'


def info(message_id: str, reason: str, job_type: str | None = "mail") -> FailureInfo:
    return FailureInfo(message_id, job_type, reason, "permanent", 0, "2026-01-01T00:00:00+00:00")


def spans(found: Any) -> list[list[tuple[str, int, int]]]:
    """Each page's parts as (reason, start, stop)."""
    return [[(p.group.reason, p.start, p.stop) for p in page.parts] for page in found.pages]


@pytest.mark.parametrize(
    ("sizes", "jobs_per_page", "groups_per_page", "expected"),
    [
        ([], 3, 2, [[]]),
        ([2], 3, 2, [[("g0", 0, 2)]]),
        ([3], 3, 2, [[("g0", 0, 3)]]),
        ([7], 3, 2, [[("g0", 0, 3)], [("g0", 3, 6)], [("g0", 6, 7)]]),
        ([2, 2], 3, 2, [[("g0", 0, 2), ("g1", 0, 1)], [("g1", 1, 2)]]),
        ([1, 1, 1], 5, 2, [[("g0", 0, 1), ("g1", 0, 1)], [("g2", 0, 1)]]),
        ([4, 1, 1], 4, 3, [[("g0", 0, 4)], [("g1", 0, 1), ("g2", 0, 1)]]),
    ],
)
def test_pages_are_cut_by_jobs_and_by_groups(
    sizes: list[int],
    jobs_per_page: int,
    groups_per_page: int,
    expected: list[list[tuple[str, int, int]]],
) -> None:
    """A page ends when it lists jobs_per_page jobs or groups_per_page groups; a group goes on
    over the pages it needs; an empty queue is one empty page."""
    failures = [
        info(f"{g}-{i}", f"g{g}") for g, size in enumerate(sizes) for i in range(size)
    ]  # the groups of these sizes, largest first as listing() sorts them
    found = listing(failures, jobs_per_page, groups_per_page)
    assert spans(found) == expected
    assert found.total == sum(sizes)
    assert [p.number for p in found.pages] == list(range(1, len(expected) + 1))


def test_the_pages_list_every_job_once_in_order() -> None:
    """Together the pages list every copy once; each page knows its first and last job's place
    in the whole list, and a cut group says so."""
    failures = [info(f"big-{i}", "big") for i in range(450)]
    failures += [info(f"solo-{i}", f"solo {i}") for i in range(90)]
    found = listing(failures)
    listed = [job.message_id for page in found.pages for part in page.parts for job in part.jobs]
    assert sorted(map(str, listed)) == sorted(str(f.message_id) for f in failures)
    assert len(listed) == len(set(listed))
    for page in found.pages:
        jobs = sum(len(part.jobs) for part in page.parts)
        assert jobs <= JOBS_PER_PAGE
        assert len(page.parts) <= GROUPS_PER_PAGE
        assert page.last_job - page.first_job + 1 == jobs
    first = found.pages[0].parts[0]
    assert (first.start, first.stop, first.cut) == (0, JOBS_PER_PAGE, True)
    assert found.pages[-1].last_job == 540


def page_of(found: Any, number: int = 1, writable: bool = True) -> str:
    return (
        templates()
        .get_template("failed.html")
        .render(
            queue="q",
            failed_queue="q.failed",
            writable=writable,
            total=found.total,
            reasons=len(found.groups),
            page=found.pages[number - 1],
            table=found.reasons_from(found.pages[number - 1]),
            pages=len(found.pages),
            done={"replayed": 999_999_999},
        )
    )


def test_a_page_of_the_worst_jobs_stays_under_1_mb() -> None:
    """A full page whose every value is as long as a job can make it, of the character escaping
    makes longest, stays under 1 MB: reasons as long as ricochet writes, ids as long as AMQP
    allows, types, kinds and times of any length, many types to a group."""
    failures = []
    for g in range(REASONS_LISTED + GROUPS_PER_PAGE):  # more than a page: the table lists some
        reason = WORST * (REASON_MAX_CHARS - 4) + f"{g:04d}"
        for i in range(JOBS_PER_PAGE // GROUPS_PER_PAGE):
            failures.append(
                FailureInfo(
                    message_id=WORST * 255,
                    type=WORST * 10_000 + str(i),
                    reason=reason,
                    kind=WORST * 10_000,
                    retry_count=2**63 - 1,
                    failed_at=WORST * 10_000 + str(i),
                )
            )
    found = listing(failures)
    html = page_of(found)
    assert html.count('<td class="id">') == JOBS_PER_PAGE  # every row, none cut
    assert html.count('<td class="reason">') == REASONS_LISTED
    assert len(html.encode()) < PAGE_MAX_BYTES


def test_a_reason_longer_than_ricochet_writes_is_clipped_and_in_no_form() -> None:
    """A reason of 100,000 characters (from a copy another client wrote) shows clipped, and its
    group has no form to carry it; the page says which commands act on it."""
    found = listing([info("long", "E: " + "x" * 100_000), info("short", "E: short")])
    html = page_of(found)
    assert len(html.encode()) < 10_000
    assert html.count('name="reason"') == 1
    assert "ricochet replay --reason" in html


def test_a_page_says_where_it_is_and_links_to_the_next() -> None:
    """A page of several says which it is, which jobs it lists of how many, and links to the
    previous and the next; a single page says nothing of pages."""
    found = listing([info(f"{i}", f"E {i}") for i in range(GROUPS_PER_PAGE * 2 + 1)])
    middle = page_of(found, 2)
    assert "This is page 2: jobs 21-40 of 41, in 20 of the 41 reasons." in middle
    assert '<a rel="prev" href="/failed?page=1">' in middle
    assert '<a rel="next" href="/failed?page=3">' in middle
    last = page_of(found, 3)
    assert 'rel="next"' not in last
    assert "page 3 of 3" in last
    single = page_of(listing([info("a", "E")]))
    assert "page 1 of" not in single
    assert 'rel="next"' not in single


def test_the_table_lists_the_reasons_from_the_page_on() -> None:
    """When a group fills the first page alone, the table at its head still lists the reasons
    after it, each with a link to the page its jobs start on, and counts those it leaves out."""
    failures = [info(f"big-{i}", "E: big") for i in range(JOBS_PER_PAGE + 5)]
    failures += [info(f"s-{i}", f"E: small {i:02d}") for i in range(REASONS_LISTED + 3)]
    found = listing(failures)
    first = page_of(found)
    assert first.count('<td class="id">') == JOBS_PER_PAGE
    assert '<a href="#g-' in first  # the big group, on this page
    assert f'<a href="/failed?page=2#{found.groups[1].anchor}">' in first
    assert "and 4 more reasons on the pages after" in first
    second = page_of(found, 2)  # the big group's last jobs, and the first small ones
    assert f'<a href="/failed?page=1#{found.groups[0].anchor}">' in second
    assert f'<a href="#{found.groups[1].anchor}">' in second
    last = page_of(found, len(found.pages))
    assert "more reasons" not in last


def test_clip_and_names() -> None:
    """Values past their length end in an ellipsis; a group's types show the first few and
    count the rest."""
    assert clip(None) is None
    assert clip("abc", 3) == "abc"
    assert clip("abcd", 3) == "abc…"
    assert names({"b", "a"}) == "a, b"
    assert names({str(i) for i in range(8)}, shown=3) == "0, 1, 2 and 5 more"


def test_the_console_opens_on_the_queue_commands_use() -> None:
    """A page asked without ?queue= shows RICOCHET_QUEUE when the monitor watches it, as the
    commands do, else the first queue of RICOCHET_QUEUES."""
    watching = Console(Settings(queue="jobs", queues="thumbnails=1,email=5,jobs=10"))
    assert watching._names_of(None) == Names("jobs")
    assert watching._names_of("email") == Names("email")
    elsewhere = Console(Settings(queue="other", queues="thumbnails,email"))
    assert elsewhere._names_of(None) == Names("thumbnails")


def details(message_id: str, headers: dict[str, Any], body: str) -> CopyDetails:
    return CopyDetails(
        failure=info(message_id, "E: worst"),
        properties={"message_id": message_id, "type": WORST * 255},
        headers=headers,
        body=body,
        body_encoding="utf-8",
    )


def test_a_job_page_of_the_worst_copy_stays_under_1_mb() -> None:
    """A job whose copies carry thousands of headers, each long, and a body of megabytes gets
    the compact page, under 1 MB, which says what it leaves out; an ordinary one is whole."""
    console = Console(Settings(queue="q"))
    headers = {f"h{i}": WORST * 2_000 for i in range(60)}
    headers["failed-traceback"] = WORST * 100_000
    found = Found("m", count=5, copies=[details("m", headers, WORST * 3_000_000)] * 3)
    html = console._render_job(found, Names("q"))
    assert len(html.encode()) < PAGE_MAX_BYTES
    assert "too large to show whole here" in html
    assert "5 failed copies have this message_id" in html

    plain = Found("m", count=1, copies=[details("m", {"retry-count": 1}, '{"id": 1}')])
    html = console._render_job(plain, Names("q"))
    assert "too large" not in html
    assert "retry-count" in html


async def test_page_views_share_one_scan() -> None:
    """Views that ask while a scan runs get its result; one that asks after it ends starts
    another."""
    flights = Flights()
    runs = 0
    release = asyncio.Event()

    async def scan(_: Stop) -> int:
        nonlocal runs
        runs += 1
        await release.wait()
        return runs

    views = [asyncio.create_task(flights.join(("q", None), scan)) for _ in range(5)]
    await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.gather(*views) == [1] * 5
    assert await flights.join(("q", None), scan) == 2
    assert await flights.join(("q", "other"), scan) == 3


async def test_a_scan_nobody_waits_for_is_cancelled_before_it_holds_copies() -> None:
    """When every view has gone before the scan holds copies, it is cancelled; a view that
    comes afterwards starts a scan of its own."""
    flights = Flights()
    started: list[Stop] = []
    cancelled = asyncio.Event()

    async def scan(stop: Stop) -> str:
        started.append(stop)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    views = [asyncio.create_task(flights.join(("q", None), scan)) for _ in range(3)]
    await asyncio.sleep(0.01)
    for view in views:
        view.cancel()
    await asyncio.wait_for(cancelled.wait(), 5)
    assert started[0].requested

    async def quick(_: Stop) -> str:
        return "fresh"

    assert await flights.join(("q", None), quick) == "fresh"


async def test_a_scan_holding_copies_is_stopped_not_cancelled() -> None:
    """When every view has gone while the scan holds copies, it is asked to stop and runs to
    its own end, which hands the copies back."""
    flights = Flights()
    ended = asyncio.Event()

    async def scan(stop: Stop) -> str:
        stop.holding = True
        for _ in range(1000):  # copies, each read a while after the one before
            if stop.requested:
                break
            await asyncio.sleep(0.01)
        ended.set()
        return "stopped"

    view = asyncio.create_task(flights.join(("q", None), scan))
    await asyncio.sleep(0.05)
    view.cancel()
    await asyncio.wait_for(ended.wait(), 5)


async def test_a_failed_scan_fails_every_view() -> None:
    """The scan's error reaches every view that waited for it."""
    flights = Flights()

    async def scan(_: Stop) -> str:
        await asyncio.sleep(0.01)
        raise RuntimeError("broker gone")

    views = [flights.join(("q", None), scan) for _ in range(3)]
    outcomes = await asyncio.gather(*views, return_exceptions=True)
    assert [str(o) for o in outcomes] == ["broker gone"] * 3


@pytest.mark.parametrize("queues", [(), ("q", "other")])
def test_the_top_bar_links_every_page(queues: tuple[str, ...]) -> None:
    """Whichever page is open, its top bar leads to the failed jobs, the waiting jobs and the
    recurring jobs (GET /schedules): a page no link reaches is a page nobody finds."""
    bar = (
        templates()
        .get_template("error.html")
        .render(queue="q", failed_queue="q.failed", queues=queues, writable=False, message="x")
        .split("<header>")[1]
        .split("</header>")[0]
    )
    for path in ("/failed", "/waiting", "/schedules"):
        assert f'href="{path}' in bar, path
