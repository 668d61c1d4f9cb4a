"""Rate limits (SPEC 28) without a broker: what a limit may be, the lowest of several, the
tokens a leader hands out as they fall due, and the objects a limited type takes."""

import pytest
from ricochet import Router
from ricochet.broker.plan import rate_plan
from ricochet.broker.rate_store import Applied, _announced, _body
from ricochet.handlers.invoker import Invoker
from ricochet.names import refusal
from ricochet.ops.checks import RatesSeen, rate_limits_check
from ricochet.rates import Limit, limit, lowest, parse_limits
from ricochet.settings import Settings
from ricochet.worker.rate_limits import FORGET_S, applied, due_tokens


@pytest.mark.parametrize(
    ("rate", "burst", "per_s", "text"),
    [("10/s", 1, 10.0, "10/s"), ("120/m", 5, 2.0, "120/m:5"), ("3600/h", 1, 1.0, "3600/h")],
)
def test_a_limit_is_n_per_second_minute_or_hour_with_a_burst(
    rate: str, burst: int, per_s: float, text: str
) -> None:
    found = limit(rate, burst)
    assert (found.per_s, found.burst, found.text()) == (per_s, burst, text)


@pytest.mark.parametrize(
    ("rate", "burst"),
    [("0/s", 1), ("10/d", 1), ("10", 1), ("1.5/s", 1), (10, 1), ("10001/s", 1), ("1/s", 0)],
)
def test_anything_else_is_refused_saying_what_is_allowed(rate: object, burst: int) -> None:
    with pytest.raises(ValueError, match="allowed"):
        limit(rate, burst)


def test_the_setting_names_each_type_and_the_bad_entry() -> None:
    assert parse_limits("mail=10/s, oauth=100/m:20") == {
        "mail": limit("10/s"),
        "oauth": limit("100/m", 20),
    }
    for bad, says in [
        ("mail", "TYPE=N/s"),
        ("mail=10/s,mail=1/s", "twice"),
        ("a b=1/s", "cannot be limited"),
        ("mail=10/s:x", "burst"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_limits(bad)
    with pytest.raises(ValueError, match="entry 'mail=10/x'"):
        Settings(rate_limits="mail=10/x")


def test_workers_that_disagree_apply_the_lowest_rate_and_the_smallest_burst() -> None:
    assert lowest([limit("10/s", 5), limit("60/m", 3), limit("100/s", 1)]) == Limit(1.0, 1, 60, 60)


def test_a_handler_and_the_setting_for_one_type_give_the_lower() -> None:
    router = Router()
    router.handler("mail", rate="5/s")(lambda job: None)
    router.handler("sms", rate="1/m", burst=3)(lambda job: None)
    invoker = Invoker(router, 10)
    assert invoker.rate_limits({"mail": limit("50/s"), "push": limit("2/s")}) == {
        "mail": limit("5/s"),
        "sms": limit("1/m", 3),
        "push": limit("2/s"),
    }
    with pytest.raises(ValueError, match="burst"):
        router.handler("x", burst=2)
    with pytest.raises(ValueError, match="cannot be limited"):
        router.handler("a b", rate="1/s")


def test_tokens_fall_due_one_interval_apart_and_a_late_leader_hands_out_the_burst_at_most() -> None:
    four = limit("4/s", 2)  # a token every 0.25 s
    assert due_tokens(10.0, 9.9, four) == (0, 10.0)
    assert due_tokens(10.0, 10.0, four) == (1, 10.25)
    assert due_tokens(10.0, 10.3, four) == (2, 10.5)
    assert due_tokens(10.0, 20.0, four) == (2, 20.25)  # ten seconds late: a bucket full


def test_the_leader_applies_its_own_and_the_fresh_announcements() -> None:
    own = {"mail": limit("10/s")}
    announced = {
        "a": (100.0, {"mail": limit("2/s"), "sms": limit("1/s")}),
        "gone": (100.0 - FORGET_S - 1, {"mail": limit("1/m")}),
    }
    found = applied(own, announced, 100.0)
    assert found.limits == {"mail": limit("2/s"), "sms": limit("1/s")}
    assert found.differing == {"mail": ["10/s", "2/s"]}  # the silent one is forgotten


def test_an_announcement_reads_back_and_a_forged_one_is_dropped() -> None:
    limits = {"mail": limit("10/s", 3)}
    assert _announced(_body("p", limits)) == ("p", limits)
    for forged in [b"{", b'{"process": 1}', b'{"process": "p", "limits": {"a b": [1, 1, 1]}}']:
        assert _announced(forged) is None
    assert _announced(b'{"process": "p", "limits": {"m": [1, 7, 1]}}') is None  # no such period


def test_a_limited_type_takes_tokens_a_waiting_queue_and_the_announcements() -> None:
    plan = rate_plan("jobs", ["mail"], (4, 0, 5))
    assert [q.name for q in plan.queues] == ["jobs.rates", "jobs.tokens.mail", "jobs.limited.mail"]
    assert plan.queues[2].arguments == {"x-queue-type": "quorum", "x-delivery-limit": -1}
    assert [(b.source, b.destination) for b in plan.bindings] == [
        ("jobs.limited.mail", "jobs.limited.mail")
    ]
    for name in ["jobs.tokens.mail", "jobs.limited.mail", "jobs.rates", "jobs.rates.applied"]:
        assert refusal(name) is not None


@pytest.mark.parametrize(
    ("seen", "status", "says"),
    [
        (None, "warn", "unknown"),
        (RatesSeen(Applied({}, {}), {}, led=False), "ok", "none: no worker limits"),
        (RatesSeen(Applied({"mail": limit("4/s")}, {}), {"mail": 3}, True), "ok", "mail 4/s (3 w"),
        (
            RatesSeen(Applied({"mail": limit("2/s")}, {"mail": ["2/s", "9/s"]}), {}, True),
            "warn",
            "workers disagree (mail: 2/s, 9/s): the lowest applies",
        ),
        (RatesSeen(Applied({"mail": limit("4/s")}, {}), {"mail": 3}, False), "warn", "no process"),
        (RatesSeen(Applied({"mail": limit("4/s")}, {}), {"mail": 0}, False), "ok", "0 waiting"),
    ],
)
def test_doctors_rate_limits_row(seen: RatesSeen | None, status: str, says: str) -> None:
    found = rate_limits_check("jobs", seen)
    assert (found.check, found.status) == ("rate limits", status)
    assert says in found.detail
