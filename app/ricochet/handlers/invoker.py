"""Loading the configured handler and calling it: async directly, sync on a handler thread."""

import asyncio
import contextlib
import contextvars
import importlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ricochet import rates
from ricochet.delivery.events import Returned
from ricochet.delivery.retry import Outcome
from ricochet.errors import ConfigError, HandlerTimeout, JobCancelled, PermanentError, RetryLater
from ricochet.handlers.job import Job
from ricochet.handlers.router import Route, Router, is_async_callable
from ricochet.handlers.threads import HandlerThreads
from ricochet.log import get_logger
from ricochet.schedules.schedule import Schedule
from ricochet.settings import variable_name

log = get_logger("ricochet.handler")


def load_handler(ref: str) -> Router | Callable[[Job], Any]:
    """Import module.path:attribute; ConfigError when it is missing or not callable."""
    module_name, _, attribute = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    # ValueError, TypeError: a handler registered with a bad policy (Router.handler) while the
    # module was imported.
    except (ImportError, AttributeError, ValueError, TypeError) as error:
        raise ConfigError(
            f"{variable_name('handler')}={ref!r} is invalid: cannot import it ({error})"
        ) from None
    if not isinstance(target, Router) and not callable(target):
        raise ConfigError(
            f"{variable_name('handler')}={ref!r} is invalid: not a callable or an app.Router"
        )
    return target  # type: ignore[no-any-return]


class Invoker:
    """Calls the handler for one job within its timeout (its type's, else the worker's) and
    classifies the outcome."""

    def __init__(self, target: Router | Callable[[Job], Any], timeout_s: float):
        self._target = target
        self._plain = (
            None if isinstance(target, Router) else Route(target, None, is_async_callable(target))
        )
        self._timeout_s = timeout_s

    def _resolve(self, job: Job) -> tuple[Route, tuple[Any, ...]]:
        if self._plain is not None:
            return self._plain, (job,)
        assert isinstance(self._target, Router)
        return self._target.resolve(job)

    def route(self, job_type: str | None) -> Route | None:
        """The handler of this job type and its policy (a plain handler's has none of its
        own); None when a router has none for it."""
        if self._plain is not None:
            return self._plain
        assert isinstance(self._target, Router)
        return self._target.route(job_type)

    @property
    def schedules(self) -> list[Schedule]:
        """The recurring jobs the handler's Router registered (none for a plain callable)."""
        return self._target.schedules if isinstance(self._target, Router) else []

    def rate_limits(self, configured: Mapping[str, rates.Limit] | None) -> dict[str, rates.Limit]:
        """The rate limit of each limited type: its handler's (rate=), RICOCHET_RATE_LIMITS'
        (configured), the lower of the two where both give one."""
        given: dict[str, list[rates.Limit]] = {t: [x] for t, x in (configured or {}).items()}
        if isinstance(self._target, Router):
            for job_type in self._target.types:
                route = self._target.route(job_type)
                if route is not None and route.rate is not None:
                    given.setdefault(job_type, []).append(route.rate)
        return {t: rates.lowest(limits) for t, limits in given.items()}

    @property
    def longest_timeout_s(self) -> float:
        """The longest any handler may run: the worker's timeout, or a type's if longer."""
        timeouts = [self._timeout_s]
        if isinstance(self._target, Router):
            routes = (self._target.route(job_type) for job_type in self._target.types)
            timeouts += [r.timeout_s for r in routes if r is not None and r.timeout_s is not None]
        return max(timeouts)

    async def _call(self, route: Route, args: tuple[Any, ...], job: Job) -> Any:
        timeout_s = self._timeout_s if route.timeout_s is None else route.timeout_s
        limit = asyncio.timeout(timeout_s)
        try:
            async with limit:
                if route.interrupt:
                    return await _interruptible(job, route.fn(*args))
                if route.is_async:
                    return await route.fn(*args)
                return await _in_thread(route.fn, *args)
        except TimeoutError:
            if not limit.expired():
                raise  # the handler's own (a socket's, say): a failure like any other
            if not route.is_async:
                log.warning("sync handler still runs after its timeout", threads=_threads.busy)
            raise HandlerTimeout(f"handler ran longer than {timeout_s:g} s") from None

    async def __call__(self, job: Job) -> tuple[Outcome, BaseException | None]:
        """Run the job; never raises for what the handler does (only for cancellation). What a
        handler that succeeded returned is job.returned, unless its type keeps no result."""
        give_up_on: tuple[type[Exception], ...] = (PermanentError,)  # until the route is known
        try:
            route, args = self._resolve(job)
            give_up_on = route.give_up_on
            job.raise_if_cancelled()  # cancelled since it was delivered: it does not start
            value = await self._call(route, args, job)
        except JobCancelled as error:  # whatever give_up_on says: a cancel is no failure
            return Outcome.CANCELLED, error
        except RetryLater as error:  # asked for a time, which a give_up_on class never overrides
            return Outcome.LATER, error
        except Exception as error:  # transient by contract, unless the route gives up on it
            outcome = Outcome.PERMANENT if isinstance(error, give_up_on) else Outcome.TRANSIENT
            return outcome, error
        if route.keep_result:
            job.returned = Returned(value)
        return Outcome.SUCCEEDED, None


async def _interruptible(job: Job, call: Awaitable[Any]) -> Any:
    """Await an async handler in a task of its own, which the job's cancel cancels: the handler
    sees CancelledError where it waits, and the job ends cancelled (JobCancelled). A deadline or
    a shutdown cancels the caller's task, and so this one, and stays theirs."""
    handler = asyncio.ensure_future(call)
    job.interrupt_with(handler.cancel)
    try:
        return await handler
    except asyncio.CancelledError:
        caller = asyncio.current_task()
        if job.cancelled and caller is not None and not caller.cancelling():
            raise JobCancelled(f"job {job.message_id!r} was cancelled while it ran") from None
        raise
    finally:
        job.interrupt_with(None)


_threads = HandlerThreads()


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run fn(*args) on one of the handler threads (ricochet.handlers.threads) and wait for it,
    with the caller's context."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():  # timed out or cancelled meanwhile
            return
        if error is None:
            done.set_result(value)
        else:
            done.set_exception(error)

    def run() -> None:
        value, error = None, None
        try:
            value = context.run(fn, *args)
        except BaseException as raised:  # handed to the waiting coroutine, as an executor does
            error = raised
        with contextlib.suppress(RuntimeError):  # the loop closed while the handler hung
            loop.call_soon_threadsafe(settle, value, error)

    _threads.run(run)
    return await done
