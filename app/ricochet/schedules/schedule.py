"""A schedule as `router.schedule(...)` registers it, checked there: bad values raise ValueError
when the schedule is registered, not when its first occurrence comes due."""

import datetime as dt
import json
import math
import re
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ricochet.schedules.rules import MS, Every, Rule, cron_rule, utc_text
from ricochet.settings import check_queue_name

NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
# What an AMQP short string (the type property) holds.
JOB_TYPE_MAX_BYTES = 255
SHORTEST_PERIOD_MS = 1000


@dataclass(frozen=True)
class Schedule:
    """A recurring job: each occurrence of rule enqueues job_type with payload on queue (None:
    the worker's RICOCHET_QUEUE), with the message_id occurrence_id() gives it."""

    name: str
    job_type: str
    rule: Rule
    timezone: str
    payload: Any = None
    queue: str | None = None
    priority: int | None = None  # its type's (Router.schedules); None: the default

    def occurrence_id(self, at_ms: int) -> str:
        """The message_id of the occurrence at at_ms: `<name>@<UTC time with ms>Z`."""
        return f"{self.name}@{utc_text(at_ms)}"


def schedule(
    name: object,
    job_type: object,
    *,
    every: object = None,
    cron: object = None,
    timezone: object = "UTC",
    payload: Any = None,
    queue: object = None,
) -> Schedule:
    """A checked Schedule; ValueError naming the argument that is wrong."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(
            f"schedule name={name!r} is invalid: 1-100 characters of A-Za-z0-9._- are allowed"
        )
    zone = _zone(name, timezone)
    if (every is None) == (cron is None):
        raise ValueError(f"schedule {name!r}: give exactly one of every and cron")
    rule = _every(name, every) if every is not None else cron_rule(_text(cron), zone)
    _check_payload(name, payload)
    return Schedule(
        name,
        _job_type(name, job_type),
        rule,
        str(timezone),
        payload,
        None if queue is None else _queue(name, queue),
    )


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"cron={value!r} is invalid: a string of five fields is allowed")
    return value


def _zone(name: str, timezone: object) -> ZoneInfo:
    if not isinstance(timezone, str):
        raise ValueError(f"schedule {name!r}: timezone={timezone!r} is not an IANA zone name")
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"schedule {name!r}: timezone={timezone!r} is not an IANA zone name "
            "(Europe/Paris, America/New_York, UTC, ...)"
        ) from None


def _every(name: str, every: object) -> Every:
    if isinstance(every, dt.timedelta):
        seconds = every.total_seconds()
    elif isinstance(every, int | float) and not isinstance(every, bool):
        seconds = float(every)
    else:
        raise ValueError(
            f"schedule {name!r}: every={every!r} is invalid: seconds or a timedelta are allowed"
        )
    period_ms = seconds * MS
    if not math.isfinite(period_ms) or period_ms < SHORTEST_PERIOD_MS:
        raise ValueError(f"schedule {name!r}: every={every!r} is invalid: at least 1 s is allowed")
    if period_ms != round(period_ms):
        raise ValueError(
            f"schedule {name!r}: every={every!r} is invalid: a whole number of milliseconds is "
            "allowed (occurrence times are named to the millisecond)"
        )
    return Every(round(period_ms))


def _job_type(name: str, job_type: object) -> str:
    if not isinstance(job_type, str) or not job_type:
        raise ValueError(f"schedule {name!r}: job_type={job_type!r} is not a non-empty string")
    try:
        size = len(job_type.encode())
    except UnicodeEncodeError as error:
        raise ValueError(f"schedule {name!r}: job_type cannot be sent: {error}") from None
    if size > JOB_TYPE_MAX_BYTES:
        raise ValueError(
            f"schedule {name!r}: job_type is {size} bytes: at most {JOB_TYPE_MAX_BYTES} fit"
        )
    return job_type


def _check_payload(name: str, payload: Any) -> None:
    if isinstance(payload, bytes):
        return
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"schedule {name!r}: payload cannot be JSON-encoded: {error}") from None


def _queue(name: str, queue: object) -> str:
    try:
        return check_queue_name(queue)
    except ValueError as error:
        raise ValueError(f"schedule {name!r}: queue={queue!r} is invalid: {error}") from None
