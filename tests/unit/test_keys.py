"""A job's key (SPEC 28), without a broker: what a key may be, where a job with one goes before
and after its handler ran, the key lanes' plan, and the names a queue may not take."""

import datetime as dt
from typing import Any

import pytest
from ricochet import InvalidJob, Router
from ricochet.broker.plan import CONSISTENT_HASH_EXCHANGE, SINGLE_ACTIVE_CONSUMER, key_lanes_plan
from ricochet.client.message import job_message
from ricochet.delivery.events import Settled
from ricochet.delivery.retry import (
    Delay,
    Facts,
    Line,
    Outcome,
    Retry,
    RetryByCopy,
    Run,
    decide,
    read_facts,
)
from ricochet.headers import KEY, RETRIES
from ricochet.keys import checked, key_of
from ricochet.names import refusal
from ricochet.observe.journal import entry_of


def facts(
    headers: dict[str, Any], *, routing_key: str = "jobs", lined: bool = False, **kw: Any
) -> Facts:
    """The facts of a delivery of queue "jobs" (from its lane when lined), its key its
    header's."""
    key_tier = int(routing_key.rsplit(".", 1)[1]) if ".attempt." in routing_key else None
    return read_facts(
        headers,
        redelivered=False,
        routing_key=routing_key,
        from_tier=key_tier is not None,
        queue="jobs",
        max_retries=3,
        type_max_retries=None,
        key_tier=key_tier,
        key=headers.get(KEY),
        lined=lined,
        **kw,
    )


@pytest.mark.parametrize("key", ["k", "integration-42", "é" * 127, "x" * 255])
def test_a_key_is_a_non_empty_string_of_at_most_255_bytes(key: str) -> None:
    assert checked(key) == key


@pytest.mark.parametrize("key", ["", "x" * 256, "é" * 128, 7, None, b"k", "\ud800"])
def test_anything_else_is_refused_naming_what_it_is(key: object) -> None:
    with pytest.raises(ValueError, match="the key"):
        checked(key, "the key")


def test_the_header_wins_over_the_key_function_and_a_long_string_header_is_read() -> None:
    assert key_of({KEY: "a"}, lambda: "b") == "a"
    assert key_of({KEY: b"bytes"}) == "bytes"  # a foreign producer's long string
    assert key_of({}, lambda: "b") == "b"
    assert key_of({}) is None
    with pytest.raises(ValueError, match="key function"):
        key_of({}, lambda: 42)


def test_a_job_with_a_key_from_its_queue_joins_its_line_and_runs_from_there() -> None:
    """Before its handler: from the queue it goes to its lane (no attempt spent), from its
    lane it runs; a run-at ahead is waited for first, and a cancel still drops it."""
    assert decide(facts({KEY: "k"}), None) == Line()
    assert decide(facts({KEY: "k"}, lined=True), None) == Run()
    assert decide(facts({}), None) == Run()
    ahead = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert isinstance(decide(facts({KEY: "k", "run-at": ahead}), None), Delay)
    assert decide(facts({KEY: "k"}, cancelled=True), None).ACTION == "cancel"


def test_a_lane_never_dead_letters_a_retry_it_goes_to_its_tier_by_a_copy() -> None:
    """A lane's nack would dead-letter with the lane's name in x-death, which the attempt count
    does not read: its retries go by a copy that carries them; from the queue, a nack as ever."""
    assert decide(facts({KEY: "k"}, lined=True), Outcome.TRANSIENT) == RetryByCopy(1)
    assert decide(facts({}), Outcome.TRANSIENT) == Retry(1)
    # Back from tier 1, sent on to its lane with its retry counted: attempt 2, tier 2 next.
    back = facts({KEY: "k", RETRIES: 1}, routing_key="jobs.attempt.1", lined=True)
    assert (back.attempt, back.max_attempts) == (2, 4)
    assert decide(back, Outcome.TRANSIENT) == RetryByCopy(2)


def test_a_job_sent_on_to_its_lane_writes_no_journal_entry() -> None:
    """The job is the same; its lane's delivery writes what comes next."""
    event = Settled("id", facts({KEY: "k"}), Line(), None, None, "sync", None, None)
    assert entry_of(event, "jobs", 0, lambda k: None, 100) is None


def test_the_lanes_plan_a_consistent_hash_exchange_over_single_consumer_lanes() -> None:
    plan = key_lanes_plan("jobs", 3, (4, 0, 5))
    assert plan.exchange.name == "jobs.keys"
    assert plan.exchange.kind == CONSISTENT_HASH_EXCHANGE
    assert plan.exchange.arguments == {"hash-header": KEY, "alternate-exchange": "jobs.return"}
    assert [lane.name for lane in plan.lanes] == ["jobs.key.0", "jobs.key.1", "jobs.key.2"]
    assert all(lane.arguments[SINGLE_ACTIVE_CONSUMER] is True for lane in plan.lanes)
    assert all(lane.arguments["x-queue-type"] == "quorum" for lane in plan.lanes)
    assert all(lane.arguments["x-delivery-limit"] == -1 for lane in plan.lanes)  # 4.x
    assert "x-delivery-limit" not in key_lanes_plan("jobs", 1, (3, 10)).lanes[0].arguments
    assert [(b.source, b.destination, b.routing_key) for b in plan.bindings] == [
        ("jobs.keys", f"jobs.key.{i}", "1") for i in range(3)
    ]


@pytest.mark.parametrize("name", ["jobs.keys", "jobs.key.0", "jobs.key.15"])
def test_a_queue_may_not_take_a_key_lanes_name(name: str) -> None:
    assert refusal(name) is not None
    assert refusal("jobs.keyring") is None


def test_the_client_sends_the_key_in_its_header_and_refuses_one_it_cannot_send() -> None:
    now = dt.datetime.now(dt.UTC)
    _, properties = job_message("sync", {}, now=now, key="k")
    assert properties.headers is not None
    assert properties.headers[KEY] == "k"
    with pytest.raises(InvalidJob, match="key"):
        job_message("sync", {}, now=now, key="x" * 256)
    with pytest.raises(InvalidJob, match=KEY):
        job_message("sync", {}, now=now, headers={KEY: "k"})


def test_a_types_key_must_be_a_function() -> None:
    router = Router()
    with pytest.raises(TypeError, match="key"):
        router.handler("sync", key="integration")  # type: ignore[arg-type]
