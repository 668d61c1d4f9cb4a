"""What an earlier ricochet left, as the management API lists it: what `ricochet migrate` moves
and `doctor` names (pure)."""

from typing import Any

from ricochet.broker.legacy import old_levels, old_stores, older_workers
from ricochet.names import Names
from ricochet.ops.checks import BrokerState, earlier_check
from ricochet.ops.doctor import earlier_objects

QUEUES = [
    {"name": "jobs.cancels", "type": "stream"},
    {"name": "ricochet.cancels", "type": "stream"},  # the shared store: this version's
    {"name": "mail.cancels", "type": "quorum"},  # not a store: a queue of that name
    {"name": "jobs", "type": "quorum"},
]
EXCHANGES = [
    {"name": "jobs.delay.24"},
    {"name": "ricochet.delay.24"},  # the shared levels' entry
    {"name": "jobs.delay.23"},
]


def test_only_an_earlier_versions_stores_and_levels_are_found() -> None:
    assert old_stores(QUEUES) == ["jobs"]
    assert old_levels(EXCHANGES) == ["jobs"]


def test_doctor_names_what_a_queue_has_left_and_says_to_migrate() -> None:
    found = earlier_objects(Names("jobs"), QUEUES, EXCHANGES)
    assert found == ["jobs.cancels", "jobs.delay.0..24"]
    state = BrokerState("http://localhost:15672/api/", "/", {}, {}, {}, [], earlier=found)
    check = earlier_check(state)
    assert check.status == "warn"
    assert "run `ricochet migrate`" in check.detail
    assert earlier_check(BrokerState("", "/", {}, {}, {}, [])).status == "ok"
    assert earlier_objects(Names("mail"), QUEUES, EXCHANGES) == []


def test_an_older_worker_of_any_queue_is_counted_for_migrate() -> None:
    connections: list[dict[str, Any]] = [
        {"client_properties": {"connection_name": "ricochet worker jobs host:1"}},
        {"client_properties": {"connection_name": "ricochet worker mail host:2"}},
        {
            "client_properties": {
                "connection_name": "ricochet worker jobs host:3",
                "ricochet_shared_waiting": True,
            }
        },
        {"client_properties": {"connection_name": "ricochet monitor jobs host:4"}},
    ]
    assert older_workers(connections) == 2
    assert older_workers(connections, "jobs") == 1
