"""Router: dispatch jobs to handlers by type, with optional pydantic payload models."""

import datetime as dt
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ricochet import ladders, rates
from ricochet import priority as priorities
from ricochet.broker.plan import MAX_TIERS
from ricochet.errors import InvalidPayload, PermanentError, UnknownJobType
from ricochet.handlers.job import Job
from ricochet.ladders import Ladder, is_int
from ricochet.schedules.schedule import Schedule, schedule

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Route:
    """A registered handler: the function, its payload model, whether it is a coroutine, its
    type's retry budget, ladder and timeout (None: the worker's), the exceptions that fail a
    job at once, whether a cancel interrupts it (its task cancelled) rather than only flag
    the job, and whether the journal records what it returns."""

    fn: Callable[..., Any]
    model: type[BaseModel] | None
    is_async: bool
    max_retries: int | None = None
    give_up_on: tuple[type[Exception], ...] = (PermanentError,)
    retry_delays_ms: Ladder | None = None
    timeout_s: float | None = None
    interrupt: bool = False
    keep_result: bool = True
    priority: int | None = None
    # Derives a job's key from its payload (SPEC 28), for the jobs sent without one.
    key: Callable[[Any], Any] | None = None
    # The type's rate limit, shared by every worker of the vhost (SPEC 28).
    rate: rates.Limit | None = None


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for coroutine functions and objects whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own __call__
    )


class Router:
    """Maps job types to handlers: `@router.handler("type", model=Model)`."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self._schedules: dict[str, Schedule] = {}

    def handler(
        self,
        job_type: str,
        *,
        model: type[BaseModel] | None = None,
        max_retries: int | None = None,
        give_up_on: tuple[type[Exception], ...] = (),
        retry_delays_ms: Sequence[int] | None = None,
        timeout_s: float | None = None,
        interrupt: bool = False,
        keep_result: bool = True,
        priority: int | None = None,
        key: Callable[[Any], Any] | None = None,
        rate: str | None = None,
        burst: int | None = None,
    ) -> Callable[[F], F]:
        """Register fn(job), or fn(job, payload) with the payload validated into model.

        max_retries lowers the retry budget for jobs of this type; an exception of a give_up_on
        class fails the job at once, like PermanentError. retry_delays_ms is this type's own
        ladder (ricochet.exponential, linear, fixed make one): retry k waits its k-th delay, and
        its length is the budget. timeout_s replaces RICOCHET_HANDLER_TIMEOUT_S for this type.
        interrupt (async handlers only): a cancel of a running job cancels the handler's task at
        once, and the job ends cancelled; without it the handler sees job.cancelled and stops
        where it chooses. keep_result=False: the journal records none of what this type's
        handler returns (a private type, a secret). priority (0-9): the priority of the jobs
        ricochet enqueues for this type, its recurring jobs (a producer gives its own with
        enqueue(..., priority=)). key: a function of the job's payload (its JSON body) that
        returns the job's key when it was sent without one: jobs of one key run one at a time
        (docs/enqueueing.md#one-job-per-key-at-a-time); a job whose key it cannot give fails at
        once. rate ("N/s", "N/m" or "N/h") and burst (tokens banked, default 1): the type's rate
        limit, shared by every worker and process of the vhost (docs/handlers.md#rate-limits).
        ValueError (TypeError for give_up_on, interrupt, keep_result and key) for a value out of
        bounds.
        """
        _check_max_retries(job_type, max_retries)
        _check_give_up_on(job_type, give_up_on)
        ladder = _checked_ladder(job_type, retry_delays_ms)
        _check_timeout(job_type, timeout_s)
        if not isinstance(interrupt, bool):
            raise TypeError(f"interrupt={interrupt!r} for job type {job_type!r} is not a bool")
        if not isinstance(keep_result, bool):
            raise TypeError(f"keep_result={keep_result!r} for job type {job_type!r} is not a bool")
        if priority is not None:
            priorities.checked(priority, f"priority for job type {job_type!r}")
        if key is not None and not callable(key):
            raise TypeError(f"key={key!r} for job type {job_type!r} is not a function")
        limit = _checked_rate(job_type, rate, burst)

        def register(fn: F) -> F:
            if job_type in self._routes:
                raise ValueError(f"a handler for job type {job_type!r} is already registered")
            is_async = is_async_callable(fn)
            if interrupt and not is_async:
                raise ValueError(
                    f"interrupt=True for job type {job_type!r} needs an async handler: a thread "
                    "cannot be interrupted (a sync handler reads job.cancelled instead)"
                )
            self._routes[job_type] = Route(
                fn,
                model,
                is_async,
                max_retries,
                (PermanentError, *give_up_on),
                ladder,
                None if timeout_s is None else float(timeout_s),
                interrupt,
                keep_result,
                priority,
                key,
                limit,
            )
            return fn

        return register

    def schedule(
        self,
        name: str,
        job_type: str,
        *,
        every: float | dt.timedelta | None = None,
        cron: str | None = None,
        timezone: str = "UTC",
        payload: Any = None,
        queue: str | None = None,
    ) -> Schedule:
        """Enqueue a job of job_type with payload on a timer: `every` (seconds or a timedelta,
        at least 1 s; on its multiples since the Unix epoch) or `cron` (five fields, on the
        wall clock of timezone, an IANA name), on queue (default: the worker's RICOCHET_QUEUE).
        The worker processes run it, one leading each queue's schedules. ValueError for a bad
        value, or a name already registered."""
        registered = schedule(
            name,
            job_type,
            every=every,
            cron=cron,
            timezone=timezone,
            payload=payload,
            queue=queue,
        )
        if registered.name in self._schedules:
            raise ValueError(f"a schedule named {name!r} is already registered")
        self._schedules[registered.name] = registered
        return registered

    @property
    def schedules(self) -> list[Schedule]:
        """The schedules registered, in the order of registration, each with its type's
        priority (None: the default)."""
        return [
            replace(s, priority=route.priority if (route := self.route(s.job_type)) else None)
            for s in self._schedules.values()
        ]

    def route(self, job_type: str | None) -> Route | None:
        """The handler registered for this job type, with its policy; None when there is none."""
        return self._routes.get(job_type or "")

    @property
    def types(self) -> list[str]:
        """The job types this router handles."""
        return sorted(self._routes)

    def resolve(self, job: Job) -> tuple[Route, tuple[Any, ...]]:
        """The route for the job's type and the arguments to call it with."""
        route = self._routes.get(job.type or "")
        if route is None:
            if job.type is None:
                job.payload  # noqa: B018 - an undecodable body is the better reason to give

            raise UnknownJobType(f"no handler for job type {job.type!r} (known: {self.types})")
        if route.model is None:
            return route, (job,)
        try:
            payload = route.model.model_validate_json(job.body)
        except ValidationError as error:
            raise InvalidPayload(
                f"payload does not match {route.model.__name__}: "
                f"{error.error_count()} error(s): {error.errors(include_url=False)}"
            ) from None
        return route, (job, payload)


def _check_max_retries(job_type: str, max_retries: int | None) -> None:
    if max_retries is None:
        return
    if not is_int(max_retries) or not 0 <= max_retries <= MAX_TIERS:
        raise ValueError(
            f"max_retries={max_retries!r} for job type {job_type!r} is invalid: "
            f"allowed is an integer from 0 to {MAX_TIERS}, or None"
        )


def _checked_ladder(job_type: str, retry_delays_ms: Sequence[int] | None) -> Ladder | None:
    if retry_delays_ms is None:
        return None
    try:
        return ladders.checked(retry_delays_ms)
    except ValueError as error:
        raise ValueError(
            f"retry_delays_ms for job type {job_type!r} is invalid: {error}, or None"
        ) from None


def _checked_rate(job_type: str, rate: str | None, burst: int | None) -> rates.Limit | None:
    if rate is None:
        if burst is not None:
            raise ValueError(f"burst for job type {job_type!r} needs a rate")
        return None
    try:
        rates.checked_type(job_type)
        return rates.limit(rate, 1 if burst is None else burst)
    except ValueError as error:
        raise ValueError(f"rate limit for job type {job_type!r}: {error}") from None


def _check_timeout(job_type: str, timeout_s: float | None) -> None:
    if timeout_s is None:
        return
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not 0 < timeout_s < math.inf
    ):
        raise ValueError(
            f"timeout_s={timeout_s!r} for job type {job_type!r} is invalid: allowed a number of "
            "seconds > 0, or None"
        )


def _check_give_up_on(job_type: str, give_up_on: tuple[type[Exception], ...]) -> None:
    if not isinstance(give_up_on, tuple) or not all(
        isinstance(cls, type) and issubclass(cls, Exception) for cls in give_up_on
    ):
        raise TypeError(
            f"give_up_on={give_up_on!r} for job type {job_type!r} is invalid: "
            "allowed is a tuple of exception classes"
        )
