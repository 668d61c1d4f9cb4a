"""Schedules that trust neither the clock nor their stored state (SPEC 24), decided without I/O:
what a record of the store may hold, when a clock has jumped, and what a leader's round enqueues,
skips, clamps and leaves out when the state says something the clock cannot."""

import json
from zoneinfo import ZoneInfo

import pytest
from ricochet.broker.schedule_store import LATEST_MS, Entry, State, decode_state, encode_state
from ricochet.observe.metrics import Metrics
from ricochet.schedules.catchup import Reading, Skipped, drift_ms, jumped
from ricochet.schedules.rules import Cron, Every
from ricochet.schedules.schedule import Schedule
from ricochet.settings import Settings
from ricochet.worker import clock
from ricochet.worker.leader import WAKE_S, ScheduleLeader, plan_round, sleep_s
from structlog.testing import capture_logs

S = 1000
HOUR = 3600 * S
NOW = 1_800_000_000 * S  # 2027-01-15T08:00:00Z, on every period below

# (a record's entry for "tick", what the store reads of it: None when it leaves it out)
RECORDED = [
    ({"last": NOW, "since": 0}, Entry(NOW, 0)),
    ({"last": None, "since": NOW}, Entry(None, NOW)),
    ({"last": LATEST_MS, "since": 0}, Entry(LATEST_MS, 0)),
    # Finding 5: a last of 10**18 ms made every round of the queue raise.
    ({"last": 10**18, "since": 0}, None),
    ({"last": LATEST_MS + 1, "since": 0}, None),
    ({"last": NOW, "since": 10**30}, None),
    ({"last": -1, "since": 0}, None),
    ({"last": 1.5, "since": 0}, None),
    ({"last": "2027-01-15T08:00:00Z", "since": 0}, None),
    ({"last": True, "since": 0}, None),
    ({"since": 0, "last": {"nested": 1}}, None),
    ({"last": NOW}, None),
    ([NOW, 0], None),
]


@pytest.mark.parametrize(("recorded", "read"), RECORDED)
def test_the_store_reads_only_instants_a_leader_could_write(
    recorded: object, read: Entry | None
) -> None:
    """An entry that is not a whole number of ms a datetime can name is left out and named, so
    that the leader logs it and the schedule starts afresh; the other entries stay."""
    body = json.dumps({"tick": recorded, "other": {"last": NOW, "since": 0}}).encode()
    state, unreadable = decode_state(body)
    assert state.get("tick") == read
    assert state["other"] == Entry(NOW, 0)
    assert unreadable == ([] if read is not None else ["tick"])


@pytest.mark.parametrize("body", [b"", b"{", b"[1]", b"null", b"[" * 100_000])
def test_a_record_that_cannot_be_read_at_all_is_named(body: bytes) -> None:
    assert decode_state(body) == ({}, ["*"])


def test_a_state_reads_back_as_written() -> None:
    state: State = {"a": Entry(NOW, 5), "b": Entry(None, NOW)}
    assert decode_state(encode_state(state)) == (state, [])


# (wall clock moved, monotonic clock moved, whether that is a jump)
READINGS = [
    (2 * S, 2 * S, False),
    (2 * S + 900, 2 * S, False),  # under JUMP_MS: jitter, not a jump
    (2 * S, 2 * S + 900, False),
    (HOUR + 2 * S, 2 * S, True),  # set forward an hour
    (-HOUR + 2 * S, 2 * S, True),  # set back an hour
    (2 * S, 2 * S + 5 * S, True),  # a suspended machine's monotonic clock stood still
    (2 * S, 2 * S - 5 * S, True),
    # A clock slewed at NTP's 500 ppm for a day drifts 43 s from the monotonic one: no jump.
    (86_400 * S + 43 * S, 86_400 * S, False),
    (86_400 * S + 90 * S, 86_400 * S, True),
]


@pytest.mark.parametrize(("wall_ms", "mono_ms", "expected"), READINGS)
def test_a_jump_is_the_wall_clock_moving_other_than_the_monotonic_one(
    wall_ms: int, mono_ms: int, expected: bool
) -> None:
    previous = Reading(NOW, 7 * S)
    assert jumped(previous, Reading(NOW + wall_ms, 7 * S + mono_ms)) is expected


@pytest.mark.parametrize(
    ("wall_ms", "mono_ms", "expected"),
    [(HOUR + 2 * S, 2 * S, HOUR), (-HOUR + 2 * S, 2 * S, -HOUR), (2 * S, 7 * S, -5 * S)],
)
def test_the_drift_is_how_far_the_wall_clock_moved_past_the_monotonic_one(
    wall_ms: int, mono_ms: int, expected: int
) -> None:
    """Set forward: ahead; set back, or a machine that slept: behind."""
    assert drift_ms(Reading(NOW, 7 * S), Reading(NOW + wall_ms, 7 * S + mono_ms)) == expected


def test_a_jump_is_seen_once_by_a_process_however_often_it_leads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader that leads again on a new connection reads the process's clock on: a jump
    before the reconnect is logged once, and the time seen since it is kept."""
    readings = iter([Reading(NOW, 0), Reading(NOW + HOUR, S), Reading(NOW + HOUR + S, 2 * S)])
    monkeypatch.setattr(clock, "reading", lambda: next(readings))
    leader = ScheduleLeader(Settings(), [], ["jobs"], Metrics("jobs"))
    with capture_logs() as logs:
        for _connection in range(2):  # a round on a connection, then one on the next
            leader.clock.now_ms()
    assert [line["jumped_ms"] for line in logs if "jumped_ms" in line] == [HOUR - S]
    assert leader.clock.seen_ms == NOW + HOUR


def every(name: str, period_s: int) -> Schedule:
    return Schedule(name, "tick", Every(period_s * S), "UTC")


FIVE = every("five", 5)
# A rule that raises whatever it is asked: cronsim refuses February 30th (router.schedule would
# have refused it too, so this stands for any failure of one schedule's rule).
BROKEN = Schedule("broken", "tick", Cron("0 0 30 2 *", ZoneInfo("UTC")), "UTC")


# (the state's entry for FIVE, seen since, now: occurrences due, skipped, clamped, wake)
ROUNDS = [
    # A leader that ran throughout: the occurrence due now, then the next.
    (Entry(NOW - 5 * S, 0), NOW - HOUR, NOW, [NOW], None, False, NOW + 5 * S),
    (Entry(NOW, 0), NOW - HOUR, NOW + 2 * S, [], None, False, NOW + 5 * S),
    # Finding 5: the clock set forward an hour (seen since then) enqueues one occurrence, not
    # the 720 it jumped over, and logs the others.
    (Entry(NOW - HOUR, 0), NOW + 2 * S, NOW + 2 * S, [NOW],
     Skipped(719, NOW - HOUR + 5 * S, NOW - 5 * S),
     False, NOW + 5 * S),
    # Finding 5: a last recorded an hour ahead (a forged record, a leader whose clock ran ahead,
    # this one's clock set back) counts as now: the next occurrence falls due on time, not an
    # hour later.
    (Entry(NOW + HOUR, 0), NOW - HOUR, NOW + 2 * S, [], None, True, NOW + 5 * S),
    (Entry(NOW + HOUR, 0), NOW + 2 * S, NOW + 2 * S, [], None, True, NOW + 5 * S),
    (Entry(None, NOW + HOUR), NOW - HOUR, NOW + 2 * S, [], None, True, NOW + 5 * S),
    (Entry(None, NOW + HOUR), NOW - HOUR, NOW, [NOW], None, True, NOW + 5 * S),
]  # fmt: skip


@pytest.mark.parametrize(("entry", "seen", "now", "due", "skipped", "clamped", "wake"), ROUNDS)
def test_a_round_enqueues_at_most_the_latest_occurrence_the_clock_or_state_hid(
    entry: Entry,
    seen: int,
    now: int,
    due: list[int],
    skipped: Skipped | None,
    clamped: bool,
    wake: int,
) -> None:
    """What a round of the leader enqueues (every 5 s), and the state it goes on from: never
    ahead of the clock."""
    round_ = plan_round([FIVE], {"five": entry}, seen, now)
    assert round_.due == [(at, FIVE) for at in due]
    assert round_.skipped == ([(FIVE, skipped)] if skipped else [])
    assert round_.ahead == ([(FIVE, entry)] if clamped else [])
    assert round_.failed == []
    assert round_.wake_ms == wake
    assert round_.state["five"].accounted_ms <= now


def test_one_schedules_failure_leaves_the_others_going() -> None:
    """The broken rule is reported and starts afresh; the other schedule's occurrence is due."""
    state = {"broken": Entry(NOW - 5 * S, 0), "five": Entry(NOW - 5 * S, 0)}
    round_ = plan_round([BROKEN, FIVE], state, NOW - HOUR, NOW)
    assert round_.due == [(NOW, FIVE)]
    assert [(s.name, type(e).__name__) for s, e in round_.failed] == [("broken", "CronSimError")]
    assert round_.state["broken"] == Entry(None, NOW + 1)
    assert round_.wake_ms == NOW + 5 * S


@pytest.mark.parametrize(
    ("wake", "now", "expected"),
    [
        (NOW + 500, NOW, 0.5),
        (NOW - 500, NOW, 0.0),
        # A wake an hour away (a clock set back under a schedule) is read again within WAKE_S.
        (NOW + HOUR, NOW, WAKE_S),
        (None, NOW, WAKE_S),
    ],
)
def test_a_leader_reads_its_clock_again_within_wake_s(
    wake: int | None, now: int, expected: float
) -> None:
    assert sleep_s(wake, now) == expected
