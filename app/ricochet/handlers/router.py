"""Router: dispatch jobs to handlers by type, with optional pydantic payload models."""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ricochet.broker.topology import MAX_TIERS
from ricochet.delivery.retry import is_int
from ricochet.errors import InvalidPayload, PermanentError, UnknownJobType
from ricochet.handlers.job import Job

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Route:
    """A registered handler: the function, its payload model, whether it is a coroutine, its
    type's retry budget (None: the settings') and the exceptions that fail a job at once."""

    fn: Callable[..., Any]
    model: type[BaseModel] | None
    is_async: bool
    max_retries: int | None = None
    give_up_on: tuple[type[Exception], ...] = (PermanentError,)


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for coroutine functions and objects whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own __call__
    )


class Router:
    """Maps job types to handlers: `@router.handler("type", model=Model)`."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def handler(
        self,
        job_type: str,
        *,
        model: type[BaseModel] | None = None,
        max_retries: int | None = None,
        give_up_on: tuple[type[Exception], ...] = (),
    ) -> Callable[[F], F]:
        """Register fn(job), or fn(job, payload) with the payload validated into model.

        max_retries lowers the retry budget for jobs of this type; an exception of a give_up_on
        class fails the job at once, like PermanentError.
        """
        _check_max_retries(job_type, max_retries)
        _check_give_up_on(job_type, give_up_on)

        def register(fn: F) -> F:
            if job_type in self._routes:
                raise ValueError(f"a handler for job type {job_type!r} is already registered")
            self._routes[job_type] = Route(
                fn, model, is_async_callable(fn), max_retries, (PermanentError, *give_up_on)
            )
            return fn

        return register

    def max_retries(self, job_type: str | None) -> int | None:
        """The retry budget the handler of this job type sets, if any."""
        route = self._routes.get(job_type or "")
        return route.max_retries if route else None

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


def _check_give_up_on(job_type: str, give_up_on: tuple[type[Exception], ...]) -> None:
    if not isinstance(give_up_on, tuple) or not all(
        isinstance(cls, type) and issubclass(cls, Exception) for cls in give_up_on
    ):
        raise TypeError(
            f"give_up_on={give_up_on!r} for job type {job_type!r} is invalid: "
            "allowed is a tuple of exception classes"
        )
