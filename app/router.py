"""Router: dispatch jobs to handlers by type, with optional pydantic payload models."""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from app.errors import InvalidPayload, UnknownJobType
from app.job import Job

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Route:
    """A registered handler: the function, its payload model, and whether it is a coroutine."""

    fn: Callable[..., Any]
    model: type[BaseModel] | None
    is_async: bool


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for coroutine functions and objects whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's own __call__
    )


class Router:
    """Maps job types to handlers: `@router.handler("type", model=Model)`."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def handler(self, job_type: str, *, model: type[BaseModel] | None = None) -> Callable[[F], F]:
        """Register fn(job), or fn(job, payload) with the payload validated into model."""

        def register(fn: F) -> F:
            if job_type in self._routes:
                raise ValueError(f"a handler for job type {job_type!r} is already registered")
            self._routes[job_type] = Route(fn, model, is_async_callable(fn))
            return fn

        return register

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
