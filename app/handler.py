"""Loading the configured handler and calling it: async directly, sync in a worker thread."""

import asyncio
import importlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.errors import ConfigError, HandlerTimeout, PermanentError
from app.job import Job
from app.retry import Outcome
from app.router import Route, Router, is_async_callable


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

    def __init__(self, target: Router | Callable[[Job], Any], timeout_s: float, threads: int):
        self._target = target
        self._plain = (
            None if isinstance(target, Router) else Route(target, None, is_async_callable(target))
        )
        self._timeout_s = timeout_s
        # One thread per possible concurrent job, so sync jobs never queue behind each other.
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ricochet-job")

    def _resolve(self, job: Job) -> tuple[Route, tuple[Any, ...]]:
        if self._plain is not None:
            return self._plain, (job,)
        assert isinstance(self._target, Router)
        return self._target.resolve(job)

    async def _call(self, job: Job) -> None:
        route, args = self._resolve(job)
        # asyncio.timeout rather than wait_for, which on Python 3.11 wraps every call in a task.
        try:
            async with asyncio.timeout(self._timeout_s):
                if route.is_async:
                    await route.fn(*args)
                else:
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(self._pool, route.fn, *args)
        except TimeoutError:
            raise HandlerTimeout(f"handler ran longer than {self._timeout_s:g} s") from None

    async def __call__(self, job: Job) -> tuple[Outcome, BaseException | None]:
        """Run the job; never raises for what the handler does (only for cancellation)."""
        try:
            await self._call(job)
        except PermanentError as error:
            return Outcome.PERMANENT, error
        except Exception as error:  # any other failure is transient by contract
            return Outcome.TRANSIENT, error
        return Outcome.SUCCEEDED, None

    def close(self) -> None:
        """Stop the thread pool without waiting for a handler that still runs."""
        self._pool.shutdown(wait=False, cancel_futures=True)
