"""doctor's checks on management API answers recorded from a real broker (tests/record_doctor.py).

doctor_healthy_*.json: the topology as declared, consumers on the main queue and the events.
doctor_broken_*.json: the same queue after an earlier deployment with three retries (the settings
now say two), with tier 2 redeclared with another delay, the return binding removed, the failed
exchange bound to the main queue, a max-length policy on the failed queue, 12 failed jobs, no
worker and no monitor.
"""

from dataclasses import replace
from typing import Any

import pytest
from ricochet.broker.plan import plan
from ricochet.names import Names
from ricochet.ops.checks import (
    BrokerState,
    Check,
    Status,
    dead_letters,
    holding_dead_letters,
    key_lanes_check,
    levels_as_one,
    open_files_check,
    permission_check,
    worst,
    worst_first,
)
from ricochet.ops.doctor import diagnose
from ricochet.ops.report import checks_table
from ricochet.settings import Settings

from tests.unit.recorded import edited, recorded

# The brokers the answers were recorded from (tests/unit/data/doctor_*_VERSION.json).
VERSIONS = ["3.10", "4.3"]


def findings(settings: Settings, state: BrokerState) -> dict[str, Check]:
    """Check name -> finding; names are unique."""
    checks = diagnose(settings, state)
    assert len({c.check for c in checks}) == len(checks)
    return {c.check: c for c in checks}


@pytest.mark.parametrize("version", VERSIONS)
def test_healthy_topology_passes_every_check(version: str) -> None:
    """The topology just declared, with a worker and a monitor: every check passes, but for the
    version check's warning on 3.10 before 3.10.20."""
    settings, state = recorded(f"healthy_{version}")
    found = findings(settings, state)
    warned = {"broker version": "warn"} if version == "3.10" else {}
    assert {name: c.status for name, c in found.items() if c.status != "ok"} == warned
    n = plan(settings).names
    for name in (n.queue, n.tier(1), n.tier(2), n.failed, n.events):
        assert found[f"queue {name}"].status == "ok"
    for name in (n.dlx, n.first_tier_exchange, n.return_exchange, n.return_to_queue, n.failed):
        assert found[f"exchange {name}"].status == "ok"
    assert found["queue jobs.retry.2"].detail == "quorum, waits 60s, as the settings declare it"


@pytest.mark.parametrize(
    ("check", "status", "says"),
    [
        ("queue jobs.retry.2", "fail", "waits 45s, the settings say 60s and it is empty"),
        ("queue jobs.retry.2", "fail", "`ricochet topology` redeclares it"),
        ("queue jobs.retry.1", "ok", "waits 30s"),
        ("bindings", "fail", "jobs.return.queue -> queue jobs;"),
        ("bindings", "fail", "jobs.dlx -> exchange jobs.failed with key jobs.attempt.2"),
        (
            "unwanted bindings",
            "fail",
            "jobs.failed -> queue jobs with key jobs (remove it: curl -u USER:PASSWORD -X DELETE "
            "'http://127.0.0.1:1567",
        ),
        (
            "unwanted bindings",
            "fail",
            "jobs.dlx -> exchange jobs.failed with key jobs.attempt.3 (left by an earlier "
            "RICOCHET_MAX_RETRIES: `ricochet topology` removes it)",
        ),
        ("unwanted bindings", "fail", "/api/bindings/%2F/e/jobs.failed/q/jobs/jobs')"),
        ("unwanted bindings", "fail", "jobs.dlx -> queue jobs.retry.3 with key jobs.attempt.2 ("),
        ("stale tiers", "warn", "jobs.retry.3 holds 2 jobs: they come back to jobs within 120s"),
        ("consumers", "fail", "no worker consumes jobs"),
        ("monitor", "warn", "no monitor reads jobs.failed.events, so failed jobs are neither"),
        ("failed jobs", "fail", "12 in jobs.failed (RICOCHET_ALERT_FAILED_THRESHOLD=10)"),
        ("failed jobs", "fail", "ricochet replay --dry-run --group-by reason"),
        ("policies", "fail", "jobs.failed: policy 'doctor-test-"),
        ("policies", "fail", "' sets max-length=100 (messages beyond it are dropped or refused)"),
        ("policies", "fail", "clear it: `rabbitmqctl clear_policy doctor-test-"),
        ("stranded dead-letters", "ok", "every message is ready or unacked"),
    ],
)
@pytest.mark.parametrize("version", VERSIONS)
def test_broken_topology_names_each_break(version: str, check: str, status: str, says: str) -> None:
    """Each way the recorded topology was broken is named, with what fixes it."""
    found = findings(*recorded(f"broken_{version}"))[check]
    assert (found.status, says in found.detail) == (status, True), found.detail


def test_tier_holding_jobs_keeps_its_old_delay_with_a_warning() -> None:
    """A tier with another delay that still holds jobs drains first: a warning, not a failure."""
    found = findings(*edited("broken_3.10", "jobs.retry.2", messages=3))["queue jobs.retry.2"]
    assert found.status == "warn"
    assert "keeps its old delay until its 3 jobs drain (within 45s)" in found.detail


def test_missing_queue_and_exchange() -> None:
    """A queue or exchange that does not exist fails, and `ricochet topology` declares it."""
    settings, state = recorded("healthy_3.10")
    del state.queues["jobs.failed.events"]
    del state.exchanges["jobs.return"]
    found = findings(settings, state)
    for check in ("queue jobs.failed.events", "exchange jobs.return"):
        assert found[check].status == "fail"
        assert "missing: `ricochet topology` declares it" in found[check].detail


def test_an_earlier_versions_route_back_from_the_tiers() -> None:
    """A broker declared by an earlier version: jobs.return bound to jobs itself, no
    jobs.return.queue. doctor names the missing exchange and route, and the old binding as one
    `ricochet topology` replaces."""
    settings, state = recorded("healthy_3.10")
    del state.exchanges["jobs.return.queue"]
    state.bindings[:] = [
        b for b in state.bindings if "jobs.return.queue" not in (b["source"], b["destination"])
    ]
    old = {"source": "jobs.return", "destination": "jobs", "destination_type": "queue"}
    state.bindings.append({**old, "routing_key": "", "properties_key": "~"})
    found = findings(settings, state)
    assert found["exchange jobs.return.queue"].status == "fail"
    assert "jobs.return.queue -> queue jobs" in found["bindings"].detail
    assert "jobs.return -> exchange jobs.return.queue" in found["bindings"].detail
    assert found["unwanted bindings"].detail.endswith(
        "jobs.return -> queue jobs (an earlier version's route back from the tiers, which loses "
        "a deleted queue's retried jobs: `ricochet topology` replaces it)"
    )


def test_figures_of_a_missing_queue() -> None:
    """Without the main or the failed queue, consumers and failed jobs fail, pointing to it."""
    settings, state = recorded("healthy_3.10")
    del state.queues["jobs"]
    del state.queues["jobs.failed"]
    found = findings(settings, state)
    assert found["consumers"].detail == "jobs does not exist (see its queue check)"
    assert found["failed jobs"].detail == "jobs.failed does not exist (see its queue check)"
    assert found["consumers"].status == found["failed jobs"].status == "fail"


def test_queue_of_another_type_or_arguments() -> None:
    """A main queue of the wrong type, or without dead-lettering, fails and says what differs."""
    found = findings(*edited("healthy_3.10", "jobs", type="classic"))["queue jobs"]
    assert found.status == "fail"
    assert "is a classic queue, RICOCHET_QUEUE_TYPE wants quorum" in found.detail
    arguments = {"x-queue-type": "quorum", "x-max-length": 5}
    found = findings(*edited("healthy_3.10", "jobs", arguments=arguments))["queue jobs"]
    assert found.status == "fail"
    assert "x-dead-letter-exchange missing (wants jobs.dlx)" in found.detail
    assert "x-max-length=5 (not wanted)" in found.detail


def test_exchange_of_another_type() -> None:
    """An exchange of another type fails with the API call that deletes it."""
    settings, state = recorded("healthy_3.10")
    state.exchanges["jobs.dlx"]["type"] = "topic"
    found = findings(settings, state)["exchange jobs.dlx"]
    assert found.status == "fail"
    assert "type topic (wants direct)" in found.detail
    assert "-X DELETE 'http://127.0.0.1:15672/api/exchanges/%2F/jobs.dlx'" in found.detail


def test_consumer_figures_not_reported_yet() -> None:
    """A queue declared seconds ago has no figures in the API yet: a warning, not a failure."""
    found = findings(*edited("healthy_3.10", "jobs", consumers=None))["consumers"]
    assert (found.status, "run doctor again" in found.detail) == ("warn", True)


def test_failed_jobs_below_the_threshold_pass() -> None:
    """Failed jobs below the alert threshold are counted, with how to read them, and pass."""
    found = findings(*edited("broken_3.10", "jobs.failed", messages=9))["failed jobs"]
    assert found.status == "ok"
    assert found.detail.startswith("9 in jobs.failed")


@pytest.mark.parametrize(
    ("figures", "held"),
    [
        ({"messages": 5, "messages_ready": 1, "messages_unacknowledged": 1, "messages_dlx": 3}, 3),
        # Without messages_dlx (a classic queue): what is neither ready nor unacked.
        ({"messages": 5, "messages_ready": 1, "messages_unacknowledged": 1}, 3),
        ({"messages": 2, "messages_ready": 2, "messages_unacknowledged": 0}, 0),
        ({"messages": 2}, None),  # no figures yet
        ({}, None),
    ],
)
def test_dead_letters_read_from_the_figures(figures: dict[str, int], held: int | None) -> None:
    """The expired jobs a queue holds until their dead-letter is confirmed: messages_dlx."""
    assert dead_letters(figures) == held
    assert dead_letters(None) is None


def test_queues_holding_dead_letters_are_picked_for_a_second_reading() -> None:
    """Only the queues that hold dead-letters are read again."""
    queues: dict[str, dict[str, Any]] = {
        "a": {"messages": 1, "messages_ready": 0, "messages_unacknowledged": 0, "messages_dlx": 1},
        "b": {"messages": 1, "messages_ready": 1, "messages_unacknowledged": 0, "messages_dlx": 0},
        "c": {"name": "c"},
    }
    assert holding_dead_letters(queues) == ["a"]


def dead_letter_finding(version: str, first: dict[str, int], again: dict[str, int] | None) -> Check:
    """The stranded dead-letters check on a healthy recording whose queues held `first`
    dead-letters at doctor's first reading and `again` at its second, 15 s later (None: no
    second reading)."""
    settings, state = recorded(f"healthy_{version}")
    for name, held in first.items():
        state.queues[name].update(messages=held, messages_dlx=held)
    state = replace(state, dead_letters_again=again, dead_letters_recheck_s=15.0)
    return findings(settings, state)["stranded dead-letters"]


TIMEOUT_ADVICE = "{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}"


@pytest.mark.parametrize("version", VERSIONS)
def test_dead_letters_held_in_both_readings_name_the_timeout(version: str) -> None:
    """Dead-letters still held 15 s later (one takes milliseconds) are stuck: the queue is named
    with both figures and the broker's retry timeout, and how to lower it. A queue whose
    dead-letters moved on between the readings is not named."""
    found = dead_letter_finding(
        version, {"ricochet.delay.4": 7, "jobs.retry.1": 3}, {"ricochet.delay.4": 9}
    )
    assert found.status == "warn"
    assert "ricochet.delay.4 holds 9 (7 read 15s earlier)" in found.detail
    assert "jobs.retry.1" not in found.detail
    assert "dead_letter_worker_publisher_confirm_timeout (3 minutes by default)" in found.detail
    assert TIMEOUT_ADVICE in found.detail
    assert "advanced.config" in found.detail


def test_new_leader_is_the_remedy_only_where_a_leader_change_strands() -> None:
    """RabbitMQ before 3.10.20 can strand dead-letters for good after a leader change: there the
    detail also gives the rabbitmq-queues lines for a new leader; later versions do not."""
    held = {"jobs.retry.1": 2}
    old = dead_letter_finding("3.10", held, held).detail
    assert "`rabbitmq-queues delete_member jobs.retry.1 rabbit@localhost`" in old
    assert "`rabbitmq-queues add_member jobs.retry.1 rabbit@localhost`" in old
    assert "delete_member" not in dead_letter_finding("4.3", held, held).detail


@pytest.mark.parametrize("version", VERSIONS)
def test_dead_letters_that_moved_on_pass(version: str) -> None:
    """Dead-letters seen once and gone at the second reading were being dead-lettered: ok."""
    found = dead_letter_finding(version, {"ricochet.delay.4": 7}, {"ricochet.delay.4": 0})
    assert found == Check(
        "stranded dead-letters", "ok", "dead-letters seen in ricochet.delay.4 moved on within 15s"
    )


def test_dead_letters_read_once_ask_for_another_run() -> None:
    """Without a second reading, held dead-letters (neither ready nor unacked) warn and ask for
    another run."""
    settings, state = edited(
        "healthy_3.10",
        "jobs.retry.1",
        messages=5,
        messages_ready=1,
        messages_unacknowledged=1,
        messages_dlx=3,
    )
    found = findings(settings, state)["stranded dead-letters"]
    assert found.status == "warn"
    assert "jobs.retry.1 holds 3" in found.detail
    assert "run doctor again" in found.detail
    assert TIMEOUT_ADVICE in found.detail


def test_table_puts_each_part_of_a_detail_on_its_own_line() -> None:
    """The plain output: one row per check, a detail's steps under one another."""
    text = checks_table([("bindings", "fail", "2 missing; a -> b; c -> d"), ("x", "ok", "fine")])
    assert text.splitlines() == [
        "check     status  detail",
        "bindings  fail    2 missing",
        "                    a -> b",
        "                    c -> d",
        "x         ok      fine",
    ]


def on_rabbitmq_4(policy: dict[str, Any] | None = None) -> dict[str, Check]:
    """The healthy recording as RabbitMQ 4.0 reports it: its queues were declared without
    x-delivery-limit, as on RabbitMQ 3 before an upgrade; a policy on the failed queue if given."""
    settings, state = recorded("healthy_3.10")
    state.overview["rabbitmq_version"] = "4.0.5"
    if policy is not None:
        state.queues["jobs.failed"].update(policy="lift", effective_policy_definition=policy)
    return findings(settings, state)


def test_queue_declared_before_the_delivery_limit_was_lifted() -> None:
    """On RabbitMQ 4, a queue ricochet reads (consumed, or a tier that `ricochet waiting`
    hands back) still under the delivery limit of 20 fails, with the policy command that lifts
    it, tiers included."""
    found = on_rabbitmq_4()
    for queue in ("jobs", "jobs.failed", "jobs.failed.events", "jobs.retry.1"):
        assert found[f"queue {queue}"].status == "fail"
        assert "keeps RabbitMQ 4's delivery limit of 20" in found[f"queue {queue}"].detail
        assert "rabbitmqctl set_policy --apply-to queues" in found[f"queue {queue}"].detail
        assert r"jobs\.retry\.[0-9]+" in found[f"queue {queue}"].detail


def test_delivery_limit_lifted_by_a_policy() -> None:
    """The policy that lifts the limit makes the queue pass, and is no override to fix."""
    found = on_rabbitmq_4({"delivery-limit": -1})
    assert found["queue jobs.failed"].status == "ok"
    assert found["queue jobs.failed"].detail == "quorum, its delivery limit lifted by a policy"
    assert found["policies"].status == "ok"
    assert "no delivery limit a job reaches" in found["policies"].detail
    found = on_rabbitmq_4({"delivery-limit": 20})
    assert found["queue jobs.failed"].status == "fail"
    assert found["policies"].status == "fail"


def state_with(
    quorum_queues: int | None, fd_total: int = 1024, permissions: dict[str, str] | None = None
) -> BrokerState:
    return BrokerState(
        "http://localhost:15672/api/",
        "/",
        {},
        {},
        {},
        [],
        nodes=[{"name": "rabbit@a", "fd_used": 40, "fd_total": fd_total}],
        quorum_queues=quorum_queues,
        user="app",
        permissions=permissions,
    )


@pytest.mark.parametrize(
    ("quorum_queues", "fd_total", "status"),
    [(26, 1024, "ok"), (220, 1024, "warn"), (300, 1024, "fail"), (300, 65536, "ok")],
)
def test_open_files_see_the_wedge_coming(quorum_queues: int, fd_total: int, status: str) -> None:
    """A node with 1,024 open files stops accepting connections near 300 quorum queues: doctor
    warns well before, fails near it, and says how to raise the limit."""
    found = open_files_check(state_with(quorum_queues, fd_total))
    assert found.status == status
    if status != "ok":
        assert "LimitNOFILE" in found.detail
        assert "nofile" in found.detail


@pytest.mark.parametrize(
    ("permissions", "status"),
    [
        ({"configure": ".*", "write": ".*", "read": ".*"}, "ok"),
        ({"configure": "^jobs", "write": ".*", "read": ".*"}, "fail"),  # not ricochet.*
        ({"configure": "^(jobs|ricochet)\\.?", "write": ".*", "read": ".*"}, "ok"),
        ({"configure": "(", "write": ".*", "read": ".*"}, "fail"),  # not a pattern
        (None, "warn"),  # not readable by a user without the administrator tag
    ],
)
def test_permissions_cover_the_queue_and_the_shared_objects(
    permissions: dict[str, str] | None, status: str
) -> None:
    """The AMQP user must be allowed to declare, publish to and read the shared objects too."""
    found = permission_check(plan(Settings(queue="jobs")), state_with(26, permissions=permissions))
    assert found.status == status


@pytest.mark.parametrize("version", VERSIONS)
def test_the_shared_levels_are_one_row(version: str) -> None:
    """The 25 delay levels (an exchange and a queue each) are one row saying how many there
    are and that they are as declared, not 50 rows of ok."""
    settings, state = recorded(f"healthy_{version}")
    found = findings(settings, state)
    assert not [name for name in found if "ricochet.delay." in name]
    assert found["shared delay levels"] == Check(
        "shared delay levels",
        "ok",
        "25 levels (ricochet.delay.0-24), each exchange and queue as the settings declare it",
    )
    assert len(found) < 50  # one row where 50 stood (an exchange and a queue a level)


def test_a_level_not_as_declared_is_named_in_the_levels_row() -> None:
    settings, state = recorded("healthy_4.3")
    del state.queues["ricochet.delay.7"]
    found = findings(settings, state)["shared delay levels"]
    assert found.status == "fail"
    parts = found.detail.split("; ")
    assert parts[0].startswith("queue ricochet.delay.7: missing: ")
    assert parts[-1] == (
        "the other 24 of the 25 levels (ricochet.delay.0-24) are as the settings declare them"
    )


def level_rows(kind: str, levels: range, status: Status = "ok") -> list[Check]:
    """The rows queue_checks or exchange_checks give the shared levels."""
    return [Check(f"{kind} ricochet.delay.{k}", status, "as declared") for k in levels]


def test_the_levels_rows_become_one_where_the_first_stood() -> None:
    """Every level as declared: one ok row in place of the first level's, the others in order."""
    checks = [
        Check("exchange jobs.dlx", "ok", "a"),
        *level_rows("exchange", range(25)),
        Check("exchange ricochet.return", "warn", "b"),
        Check("queue jobs", "fail", "c"),
        *level_rows("queue", range(25)),
        Check("queue ricochet.orphans", "ok", "d"),
    ]
    assert levels_as_one(checks) == [
        Check("exchange jobs.dlx", "ok", "a"),
        Check(
            "shared delay levels",
            "ok",
            "25 levels (ricochet.delay.0-24), each exchange and queue as the settings declare it",
        ),
        Check("exchange ricochet.return", "warn", "b"),
        Check("queue jobs", "fail", "c"),
        Check("queue ricochet.orphans", "ok", "d"),
    ]


def test_the_levels_row_names_each_row_not_as_declared() -> None:
    """A level whose exchange warns and queue fails: the row fails, naming both, then how many
    of the others are as declared."""
    checks = [
        *level_rows("exchange", range(7)),
        Check("exchange ricochet.delay.7", "warn", "differs"),
        *level_rows("exchange", range(8, 25)),
        *level_rows("queue", range(7)),
        Check("queue ricochet.delay.7", "fail", "missing"),
        *level_rows("queue", range(8, 25)),
    ]
    assert levels_as_one(checks) == [
        Check(
            "shared delay levels",
            "fail",
            "exchange ricochet.delay.7: differs; queue ricochet.delay.7: missing; the other 24 of "
            "the 25 levels (ricochet.delay.0-24) are as the settings declare them",
        )
    ]


def test_the_levels_row_counts_the_levels_checked() -> None:
    checks = [*level_rows("queue", range(3, 6)), Check("queue jobs", "ok", "a")]
    assert levels_as_one(checks) == [
        Check(
            "shared delay levels",
            "ok",
            "3 levels (ricochet.delay.3-5), each exchange and queue as the settings declare it",
        ),
        Check("queue jobs", "ok", "a"),
    ]


def test_without_a_level_the_rows_are_as_given() -> None:
    checks = [Check("queue jobs", "ok", "a"), Check("queue jobs.delay.3", "fail", "b")]
    assert levels_as_one(checks) == checks


@pytest.mark.parametrize(
    ("statuses", "found"),
    [
        ([], "ok"),
        (["ok", "ok"], "ok"),
        (["ok", "warn", "ok"], "warn"),
        (["warn", "fail", "ok"], "fail"),
        (["fail", "warn"], "fail"),
    ],
)
def test_the_worst_status_is_fail_over_warn_over_ok(statuses: list[Status], found: Status) -> None:
    assert worst(statuses) == found


def test_failures_come_first_then_warnings_then_the_rest() -> None:
    statuses: list[Status] = ["ok", "fail", "warn", "fail", "ok"]
    checks = [Check(name, status, "") for name, status in zip("abcde", statuses, strict=True)]
    assert [c.check for c in worst_first(checks)] == ["b", "d", "c", "a", "e"]


def lanes_state(
    lanes: dict[int, tuple[int, int]], *, exchange: bool = True, plugin: bool = True
) -> BrokerState:
    """A broker whose queue "jobs" has these key lanes (index: (messages, consumers))."""
    types = [{"name": "direct"}, *([{"name": "x-consistent-hash"}] if plugin else [])]
    return replace(
        state_with(10),
        overview={"exchange_types": types},
        key_lanes={f"jobs.key.{i}": {"messages": m, "consumers": c} for i, (m, c) in lanes.items()},
        keys_exchange=exchange,
    )


@pytest.mark.parametrize(
    ("state", "status", "says"),
    [
        (lanes_state({}, exchange=False), "ok", "none yet: 4 are declared with jobs's first"),
        (lanes_state({i: (2, 1) for i in range(4)}), "ok", "4 lanes, 8 jobs with a key waiting"),
        (lanes_state({i: (0, 0) for i in range(4)}), "ok", "4 lanes, 0 jobs"),
        (lanes_state({0: (3, 0), 1: (0, 1), 2: (0, 1), 3: (0, 1)}), "warn", "no worker consumes"),
        (lanes_state({i: (0, 1) for i in range(6)}), "warn", "RICOCHET_KEY_LANES is 4"),
        (
            lanes_state({i: (0, 1) for i in range(4)}, exchange=False),
            "warn",
            "jobs.keys is missing",
        ),
        (lanes_state({}, exchange=False, plugin=False), "warn", "rabbitmq-plugins enable"),
    ],
)
def test_the_key_lanes_check(state: BrokerState, status: Status, says: str) -> None:
    """The plugin, the lanes once the queue has them, a lane with jobs and no worker, a count
    that differs from the setting."""
    found = key_lanes_check(Names("jobs"), 4, state)
    assert (found.status, found.check) == (status, "key lanes")
    assert says in found.detail
