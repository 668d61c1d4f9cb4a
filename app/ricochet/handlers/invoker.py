"""Loading the configured handler and calling it: async directly, sync in a thread of its own."""

import asyncio
import contextlib
import contextvars
import importlib
import itertools
import threading
from collections.abc import Callable
from typing import Any

import structlog

from ricochet.delivery.retry import Outcome
from ricochet.errors import ConfigError, HandlerTimeout, PermanentError, RetryLater
from ricochet.handlers.deadline import Deadlines
from ricochet.handlers.job import Job
from ricochet.handlers.router import Route, Router, is_async_callable

log = structlog.get_logger("ricochet.handler")


def load_handler(ref: str) -> Router | Callable[[Job], Any]:
    """Import module.path:attribute; ConfigError when it is missing or not callable."""
    module_name, _, attribute = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise ConfigError(
            f"RICOCHET_HANDLER={ref!r} is invalid: cannot import it ({error})"
        ) from None
    if not isinstance(target, Router) and not callable(target):
        raise ConfigError(f"RICOCHET_HANDLER={ref!r} is invalid: not a callable or an app.Router")
    return target  # type: ignore[no-any-return]


class Invoker:
    """Calls the handler for one job within the timeout and classifies the outcome."""

    def __init__(self, target: Router | Callable[[Job], Any], timeout_s: float):
        self._target = target
        self._plain = (
            None if isinstance(target, Router) else Route(target, None, is_async_callable(target))
        )
        self._deadlines = Deadlines(timeout_s)

    def _resolve(self, job: Job) -> tuple[Route, tuple[Any, ...]]:
        if self._plain is not None:
            return self._plain, (job,)
        assert isinstance(self._target, Router)
        return self._target.resolve(job)

    def max_retries(self, job_type: str | None) -> int | None:
        """The retry budget the handler of this job type sets, if any."""
        return self._target.max_retries(job_type) if isinstance(self._target, Router) else None

    async def _call(self, route: Route, args: tuple[Any, ...]) -> None:
        deadline = self._deadlines.start()
        try:
            with deadline:
                if route.is_async:
                    await route.fn(*args)
                else:
                    await _in_thread(route.fn, *args)
        except TimeoutError:
            if not deadline.expired:
                raise  # the handler's own (a socket's, say): a failure like any other
            if not route.is_async:
                running = sum(t.name.startswith(THREAD_NAME) for t in threading.enumerate())
                log.warning("sync handler still runs after its timeout", threads=running)
            limit_s = self._deadlines.timeout_s
            raise HandlerTimeout(f"handler ran longer than {limit_s:g} s") from None

    async def __call__(self, job: Job) -> tuple[Outcome, BaseException | None]:
        """Run the job; never raises for what the handler does (only for cancellation)."""
        give_up_on: tuple[type[Exception], ...] = (PermanentError,)  # until the route is known
        try:
            route, args = self._resolve(job)
            give_up_on = route.give_up_on
            await self._call(route, args)
        except RetryLater as error:  # asked for a time, which a give_up_on class never overrides
            return Outcome.LATER, error
        except Exception as error:  # transient by contract, unless the route gives up on it
            outcome = Outcome.PERMANENT if isinstance(error, give_up_on) else Outcome.TRANSIENT
            return outcome, error
        return Outcome.SUCCEEDED, None


THREAD_NAME = "ricochet-job"
_thread_numbers = itertools.count(1)


async def _in_thread(fn: Callable[..., Any], *args: Any) -> None:
    """Run fn(*args) in a new daemon thread and wait for it (with the caller's context).

    A thread cannot be stopped, so a handler past its timeout keeps running. In a fixed pool it
    would keep its thread too, and once all were taken the next sync jobs would time out
    without having run; a thread of its own per call never leaves a job waiting for one. Being
    a daemon, a hung one does not hold the process at exit either: its job is back in the queue
    once the connection closes.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    context = contextvars.copy_context()

    def settle(error: BaseException | None) -> None:
        if done.done():  # timed out or cancelled meanwhile
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            context.run(fn, *args)
        except BaseException as raised:  # handed to the waiting coroutine, as an executor does
            error = raised
        with contextlib.suppress(RuntimeError):  # the loop closed while the handler hung
            loop.call_soon_threadsafe(settle, error)

    name = f"{THREAD_NAME}-{next(_thread_numbers)}"
    threading.Thread(target=run, name=name, daemon=True).start()
    await done
