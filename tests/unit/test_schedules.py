"""Recurring jobs, decided without I/O: when occurrences fall (DST included), what a new
leader enqueues to catch up, and the checks router.schedule makes when a schedule is
registered."""

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from ricochet import Router
from ricochet.schedules.catchup import SKIPPED_COUNTED, CatchUp, Skipped, catch_up
from ricochet.schedules.rules import Cron, Every, cron_rule, utc_text


def ms(text: str) -> int:
    """An ISO-8601 time with an offset as milliseconds since the epoch."""
    return round(dt.datetime.fromisoformat(text).timestamp() * 1000)


def cron(expression: str, zone: str) -> Cron:
    return cron_rule(expression, ZoneInfo(zone))


# (expression, zone, after, the next occurrences as UTC texts)
AFTER = [
    # Paris springs forward on 2026-03-29 at 02:00 (CET) to 03:00 (CEST): 02:30 does not exist.
    ("30 2 * * *", "Europe/Paris", "2026-03-27T12:00:00+01:00",
     ["2026-03-28T01:30:00.000Z", "2026-03-30T00:30:00.000Z"]),
    ("*/30 * * * *", "Europe/Paris", "2026-03-29T01:00:00+01:00",
     ["2026-03-29T00:30:00.000Z", "2026-03-29T01:00:00.000Z", "2026-03-29T01:30:00.000Z"]),
    ("0 2 * * *", "Europe/Paris", "2026-03-28T12:00:00+01:00",
     ["2026-03-30T00:00:00.000Z"]),
    # Paris falls back on 2026-10-25 at 03:00 (CEST) to 02:00 (CET): 02:30 exists twice, runs once.
    ("30 2 * * *", "Europe/Paris", "2026-10-24T12:00:00+02:00",
     ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]),
    ("*/30 * * * *", "Europe/Paris", "2026-10-25T01:45:00+02:00",
     ["2026-10-25T00:00:00.000Z", "2026-10-25T00:30:00.000Z", "2026-10-25T02:00:00.000Z"]),
    # From inside the hour lived a second time: its first pass is already behind.
    ("*/30 * * * *", "Europe/Paris", "2026-10-25T02:10:00+01:00",
     ["2026-10-25T02:00:00.000Z"]),
    # New York: 2026-03-08 02:00 EST -> 03:00 EDT, 2026-11-01 02:00 EDT -> 01:00 EST.
    ("30 2 * * *", "America/New_York", "2026-03-07T12:00:00-05:00",
     ["2026-03-09T06:30:00.000Z"]),
    ("30 1 * * *", "America/New_York", "2026-10-31T12:00:00-04:00",
     ["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"]),
    # Lord Howe shifts by half an hour: 2026-10-04 02:00 -> 02:30.
    ("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00+10:30",
     ["2026-10-04T15:15:00.000Z"]),
    # Samoa skipped the whole of 2011-12-30.
    ("0 12 * * *", "Pacific/Apia", "2011-12-29T13:00:00-10:00",
     ["2011-12-30T22:00:00.000Z"]),
    ("0 12 * * *", "UTC", "2026-01-01T12:00:00+00:00", ["2026-01-02T12:00:00.000Z"]),
]  # fmt: skip


@pytest.mark.parametrize(("expression", "zone", "after", "expected"), AFTER)
def test_cron_occurrences_follow_the_wall_clock(
    expression: str, zone: str, after: str, expected: list[str]
) -> None:
    """A wall-clock time the zone skips that day is skipped; one it lives twice runs once."""
    rule, at, found = cron(expression, zone), ms(after), []
    for _ in expected:
        next_at = rule.after(at)
        assert next_at is not None
        found.append(utc_text(next_at))
        at = next_at
    assert found == expected


# (expression, zone, at, the latest occurrence at or before it)
AT_OR_BEFORE = [
    ("30 2 * * *", "Europe/Paris", "2026-03-29T12:00:00+02:00", "2026-03-28T01:30:00.000Z"),
    ("30 2 * * *", "Europe/Paris", "2026-03-30T02:30:00+02:00", "2026-03-30T00:30:00.000Z"),
    # In the second pass of the hour lived twice, the first pass's occurrences are behind it.
    ("*/15 * * * *", "Europe/Paris", "2026-10-25T02:50:00+01:00", "2026-10-25T00:45:00.000Z"),
    ("*/15 * * * *", "Europe/Paris", "2026-10-25T02:20:00+02:00", "2026-10-25T00:15:00.000Z"),
    ("0 12 * * *", "Pacific/Apia", "2011-12-31T11:00:00+14:00", "2011-12-29T22:00:00.000Z"),
]


@pytest.mark.parametrize(("expression", "zone", "at", "expected"), AT_OR_BEFORE)
def test_the_latest_cron_occurrence_before_a_time(
    expression: str, zone: str, at: str, expected: str
) -> None:
    latest = cron(expression, zone).at_or_before(ms(at))
    assert latest is not None
    assert utc_text(latest) == expected


@pytest.mark.parametrize(
    ("period_ms", "at", "after", "at_or_before"),
    [
        (1000, 5500, 6000, 5000),
        (1000, 6000, 7000, 6000),
        (900_000, ms("2026-11-26T18:14:59.999+00:00"), ms("2026-11-26T18:15:00+00:00"),
         ms("2026-11-26T18:00:00+00:00")),
        (1500, 0, 1500, 0),
    ],
)  # fmt: skip
def test_every_falls_on_multiples_of_its_period_since_the_epoch(
    period_ms: int, at: int, after: int, at_or_before: int
) -> None:
    rule = Every(period_ms)
    assert rule.after(at) == after
    assert rule.at_or_before(at) == at_or_before


def test_occurrence_ids_name_the_utc_time_to_the_millisecond() -> None:
    router = Router()
    stale = router.schedule("stale-check", "polling.stale_check", every=dt.timedelta(minutes=15))
    assert stale.occurrence_id(ms("2026-11-26T19:15:00+01:00")) == (
        "stale-check@2026-11-26T18:15:00.000Z"
    )
    assert utc_text(1_500) == "1970-01-01T00:00:01.500Z"


S = 1000
# (accounted for up to, leader started, now, expected)
CATCH_UP = [
    # A takeover: nothing missed, then two missed while the leader ran.
    (100 * S, 50 * S, 105 * S, CatchUp((), 110 * S)),
    (100 * S, 50 * S, 125 * S, CatchUp((110 * S, 120 * S), 130 * S)),
    # A takeover just after the new leader started: what fell due since its start, all of it.
    (100 * S, 115 * S, 135 * S, CatchUp((110 * S, 120 * S, 130 * S), 140 * S)),
    # A start after a time with no worker: the latest missed before the start, once; the rest
    # skipped and logged; then what fell due since the start.
    (100 * S, 201 * S, 205 * S, CatchUp((200 * S,), 210 * S, Skipped(9, 110 * S, 190 * S))),
    (100 * S, 195 * S, 215 * S,
     CatchUp((190 * S, 200 * S, 210 * S), 220 * S, Skipped(8, 110 * S, 180 * S))),
    (100 * S, 111 * S, 111 * S, CatchUp((110 * S,), 120 * S)),
    # A schedule first run by this leader: accounted for up to just before its start.
    (50 * S - 1, 50 * S, 65 * S, CatchUp((50 * S, 60 * S), 70 * S)),
    (50 * S - 1, 50 * S, 50 * S, CatchUp((50 * S,), 60 * S)),
    # Skipped occurrences are counted up to a bound.
    (0, (SKIPPED_COUNTED + 50) * 10 * S + 1, (SKIPPED_COUNTED + 50) * 10 * S + 1,
     CatchUp(((SKIPPED_COUNTED + 50) * 10 * S,), (SKIPPED_COUNTED + 51) * 10 * S,
             Skipped(SKIPPED_COUNTED, 10 * S, (SKIPPED_COUNTED + 49) * 10 * S))),
]  # fmt: skip


@pytest.mark.parametrize(("accounted", "started", "now", "expected"), CATCH_UP)
def test_catch_up(accounted: int, started: int, now: int, expected: CatchUp) -> None:
    """Every missed occurrence that fell due once the leader had started, and of the earlier
    ones only the latest, then the next one to come (every 10 s)."""
    assert catch_up(Every(10 * S), accounted, started, now) == expected


def test_catch_up_of_a_cron_rule_across_a_skipped_time() -> None:
    """Missed daily runs at 02:30 Paris over the spring change: the 29th has none to miss."""
    rule = cron("30 2 * * *", "Europe/Paris")
    result = catch_up(
        rule,
        ms("2026-03-27T02:30:00+01:00"),
        ms("2026-03-31T12:00:00+02:00"),
        ms("2026-03-31T12:00:01+02:00"),
    )
    assert [utc_text(at) for at in result.due] == ["2026-03-31T00:30:00.000Z"]
    assert result.skipped == Skipped(
        2, ms("2026-03-28T02:30:00+01:00"), ms("2026-03-30T02:30:00+02:00")
    )
    assert result.next_ms == ms("2026-04-01T02:30:00+02:00")


BAD = [
    ({"name": ""}, "name"),
    ({"name": "x" * 101}, "name"),
    ({"name": "has space"}, "name"),
    ({"name": 7}, "name"),
    ({"every": None}, "exactly one"),
    ({"cron": "* * * * *"}, "exactly one"),
    ({"every": 0.5}, "at least 1 s"),
    ({"every": -10}, "at least 1 s"),
    ({"every": float("nan")}, "at least 1 s"),
    ({"every": float("inf")}, "at least 1 s"),
    ({"every": dt.timedelta(milliseconds=999)}, "at least 1 s"),
    ({"every": 1.0005}, "whole number of milliseconds"),
    ({"every": True}, "every"),
    ({"every": "60"}, "every"),
    ({"every": None, "cron": "0 * * * * *"}, "five fields"),
    ({"every": None, "cron": "@daily"}, "five fields"),
    ({"every": None, "cron": "61 * * * *"}, "Bad minute"),
    ({"every": None, "cron": "0 0 30 2 *"}, "Bad day-of-month"),
    ({"every": None, "cron": 5}, "cron"),
    ({"timezone": "Mars/Olympus_Mons"}, "IANA"),
    ({"timezone": "../etc/passwd"}, "IANA"),
    ({"timezone": None}, "IANA"),
    ({"job_type": ""}, "job_type"),
    ({"job_type": "t" * 256}, "job_type"),
    ({"job_type": None}, "job_type"),
    ({"payload": {1, 2}}, "payload"),  # a set: not JSON, and a test id stable across processes
    ({"payload": {"x": float("nan")}}, "payload"),
    ({"queue": "ricochet.jobs"}, "queue"),
    ({"queue": "jobs.failed"}, "queue"),
    ({"queue": "has space"}, "queue"),
    ({"queue": ""}, "queue"),
]


@pytest.mark.parametrize(("change", "said"), BAD, ids=[repr(c) for c, _ in BAD])
def test_bad_values_raise_when_the_schedule_is_registered(
    change: dict[str, object], said: str
) -> None:
    arguments: dict[str, object] = {"name": "stale-check", "job_type": "check", "every": 900}
    arguments.update(change)
    router = Router()
    with pytest.raises(ValueError, match=said):
        router.schedule(**arguments)  # type: ignore[arg-type]
    assert router.schedules == []


def test_a_name_is_registered_once() -> None:
    router = Router()
    router.schedule("stale-check", "check", every=900)
    with pytest.raises(ValueError, match="already registered"):
        router.schedule("stale-check", "other", cron="*/5 * * * *")
    assert [s.job_type for s in router.schedules] == ["check"]


def test_good_values_are_kept() -> None:
    router = Router()
    daily = router.schedule(
        "report",
        "report.build",
        cron="0  7 * * MON-FRI",
        timezone="Europe/Paris",
        payload={"kind": "daily"},
        queue="reports",
    )
    assert daily.rule == Cron("0 7 * * MON-FRI", ZoneInfo("Europe/Paris"))
    assert (daily.timezone, daily.payload, daily.queue) == (
        "Europe/Paris",
        {"kind": "daily"},
        "reports",
    )
    assert router.schedule("tick", "t", every=1).rule == Every(1000)
    assert router.schedule("half", "t", every=dt.timedelta(seconds=1.5)).rule == Every(1500)
    assert router.schedule("raw", "t", every=60, payload=b"\x00").payload == b"\x00"
