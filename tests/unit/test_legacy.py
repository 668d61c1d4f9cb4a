"""Retiring the per-queue delay levels of earlier versions: the decisions, pure."""

from typing import Any

from ricochet.broker.connection import SHARED_WAITING
from ricochet.broker.legacy import held, older_workers


def connection(name: str, shared: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {"connection_name": name}
    if shared:
        properties[SHARED_WAITING] = True
    return {"client_properties": properties}


def test_only_workers_of_the_queue_without_the_mark_are_older() -> None:
    """A worker of Q that does not say it waits in the shared levels publishes to the old ones;
    this version's workers, another queue's, and other roles do not count."""
    connections: list[dict[str, Any]] = [
        connection("ricochet worker jobs host:1", shared=False),
        connection("ricochet worker jobs host:2", shared=True),
        connection("ricochet worker jobs.x host:3", shared=False),
        connection("ricochet monitor jobs host:4", shared=False),
        {"client_properties": None},
        {},
    ]
    assert older_workers(connections, "jobs") == 1
    assert older_workers(connections, "jobs.x") == 1
    assert older_workers(connections, "other") == 0


def test_levels_hold_what_either_count_sees() -> None:
    """The API's figures lag; the ready counts read now do not see jobs being dead-lettered:
    the larger of the two counts, and a level that is gone holds none."""
    assert held([None, {"messages": 0, "messages_dlx": 0}], [None, 0]) == 0
    assert held([{"messages": 0, "messages_dlx": 1}], [0]) == 1
    assert held([{"messages": 0, "messages_dlx": 0}], [2]) == 2
    assert held([{"messages": 3, "messages_dlx": None}], [1]) == 3
