"""A job's priority: checked where it is given, sent as 4 when not, declared on classic queues
with RICOCHET_MAX_PRIORITY, and how each broker applies it, as doctor says (SPEC 28)."""

import datetime as dt
import os

import pytest
from ricochet import InvalidJob, Router, priority
from ricochet.broker.plan import MAX_PRIORITY, plan
from ricochet.client.message import job_message
from ricochet.errors import ConfigError
from ricochet.ops.versions import priority_check
from ricochet.priority import Honouring, honouring
from ricochet.settings import Settings, load_settings

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(("given", "sent"), [(None, 4), (0, 0), (7, 7), (9, 9)])
def test_a_job_is_sent_with_its_priority_or_4(given: int | None, sent: int) -> None:
    message = job_message("work", {}, now=NOW, priority=given)
    assert message.properties.priority == sent


@pytest.mark.parametrize("value", [-1, 10, 255, True, 4.0, "5"])
def test_a_priority_out_of_bounds_is_refused_before_anything_is_sent(value: object) -> None:
    with pytest.raises(InvalidJob, match=r"priority is .*: an int of 0-9 is allowed"):
        job_message("work", {}, now=NOW, priority=value)  # type: ignore[arg-type]


def test_a_type_s_priority_is_checked_and_given_to_its_recurring_jobs() -> None:
    router = Router()
    with pytest.raises(ValueError, match=r"priority for job type 'bad' is 12"):
        router.handler("bad", priority=12)
    router.handler("cleanup", priority=1)(lambda job: None)
    router.handler("plain")(lambda job: None)
    router.schedule("nightly", "cleanup", cron="0 3 * * *")
    router.schedule("often", "plain", every=60)
    router.schedule("elsewhere", "unknown", every=60)
    assert [(s.name, s.priority) for s in router.schedules] == [
        ("nightly", 1),
        ("often", None),
        ("elsewhere", None),
    ]


def test_max_priority_is_the_main_classic_queue_s_argument_only() -> None:
    p = plan(Settings(queue="jobs", queue_type="classic", max_priority=5))
    assert p.queues[0].arguments[MAX_PRIORITY] == 5
    others = [*p.queues[1:], *p.tiers]
    assert all(MAX_PRIORITY not in spec.arguments for spec in others)
    for settings in (Settings(queue="jobs", queue_type="classic"), Settings(queue="jobs")):
        assert all(MAX_PRIORITY not in spec.arguments for spec in plan(settings).queues)


def test_max_priority_on_quorum_queues_exits_naming_both_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [n for n in os.environ if n.startswith("RICOCHET_")]:
        monkeypatch.delenv(name)  # the tests' own (RICOCHET_TEST_*) are no settings
    monkeypatch.setenv("RICOCHET_MAX_PRIORITY", "5")
    with pytest.raises(ConfigError, match=r"RICOCHET_MAX_PRIORITY is for classic queues.*"):
        load_settings()
    monkeypatch.setenv("RICOCHET_MAX_PRIORITY", "10")
    monkeypatch.setenv("RICOCHET_QUEUE_TYPE", "classic")
    with pytest.raises(ConfigError, match=r"RICOCHET_MAX_PRIORITY='10' is invalid"):
        load_settings()
    monkeypatch.setenv("RICOCHET_MAX_PRIORITY", "4")
    with pytest.raises(ConfigError, match=r"RICOCHET_MAX_PRIORITY=4 would count .* set 5-9"):
        load_settings()
    monkeypatch.setenv("RICOCHET_MAX_PRIORITY", "9")
    assert load_settings().max_priority == 9


@pytest.mark.parametrize(
    ("queue_type", "max_priority", "version", "how"),
    [
        ("quorum", 0, (3, 10, 8), Honouring.NONE),
        ("quorum", 0, (3, 13, 7), Honouring.NONE),
        ("quorum", 0, (4, 0, 5), Honouring.BANDS),
        ("quorum", 0, (4, 2, 1), Honouring.BANDS),
        ("quorum", 0, (4, 3, 0), Honouring.STRICT),
        ("quorum", 0, (4, 3, 6), Honouring.STRICT),
        ("quorum", 0, None, None),
        ("classic", 0, (4, 3, 6), Honouring.NONE),
        ("classic", 5, (3, 10, 8), Honouring.STRICT),
        ("classic", 9, None, Honouring.STRICT),
    ],
)
def test_how_each_broker_orders_a_backlog_is_said_by_doctor(
    queue_type: str, max_priority: int, version: tuple[int, ...] | None, how: Honouring | None
) -> None:
    assert honouring(queue_type, max_priority, version) == how
    settings = Settings(queue="jobs", queue_type=queue_type, max_priority=max_priority)
    check = priority_check(settings, version)
    assert (check.check, check.status) == ("priority", "ok")
    expected = {
        Honouring.NONE: "priority is not applied",
        Honouring.BANDS: "two bands",
        Honouring.STRICT: "delivered by priority",
        None: "was not read",
    }[how]
    assert expected in check.detail
    if how is Honouring.STRICT and queue_type == "classic":
        assert f"x-max-priority {max_priority}" in check.detail


def test_the_default_sits_in_the_lower_band_of_quorum_queues_of_4_0() -> None:
    """A job sent without a priority is in 4.0-4.2's normal band, so work can go above it."""
    assert priority.DEFAULT < priority.QUORUM_HIGH_BAND_FROM <= priority.HIGHEST
