"""Job attributes and Router dispatch."""

import asyncio
import contextlib
import math
import threading

import pytest
from pydantic import BaseModel
from ricochet import Job, JobCancelled, PermanentError, Router
from ricochet.delivery.retry import Outcome
from ricochet.errors import HandlerTimeout, InvalidPayload, UnknownJobType
from ricochet.handlers.invoker import Invoker


def job(body: bytes, amqp_type: str | None = None) -> Job:
    return Job(body, headers={}, message_id="m", amqp_type=amqp_type, attempt=1, max_attempts=4)


def test_type_from_property_then_body() -> None:
    """type is the AMQP property, else the body's top-level "type" string, else None."""
    assert job(b'{"type": "a"}', "b").type == "b"
    assert job(b'{"type": "a"}').type == "a"
    assert job(b'{"type": 3}').type is None
    assert job(b"[1]").type is None
    assert job(b"\xff").type is None


def test_payload_errors_are_permanent() -> None:
    """A body that is not JSON raises a PermanentError when the payload is read."""
    with pytest.raises(PermanentError, match="not valid JSON"):
        job(b"not json").payload  # noqa: B018
    assert job(b'{"a": 1}').payload == {"a": 1}


class Order(BaseModel):
    order_id: int


def test_router_dispatch() -> None:
    """Handlers are found by type; models validate the payload; unknown types are permanent."""
    router = Router()

    @router.handler("plain")
    def plain(j: Job) -> None: ...

    @router.handler("order", model=Order)
    async def order(j: Job, o: Order) -> None: ...

    route, args = router.resolve(job(b"{}", "plain"))
    assert route.fn is plain
    assert not route.is_async
    assert args == (args[0],)
    route, args = router.resolve(job(b'{"order_id": 7}', "order"))
    assert route.is_async
    assert args[1] == Order(order_id=7)
    with pytest.raises(InvalidPayload, match="does not match Order"):
        router.resolve(job(b'{"order_id": "x"}', "order"))
    with pytest.raises(UnknownJobType, match="'nope'"):
        router.resolve(job(b"{}", "nope"))
    with pytest.raises(InvalidPayload):
        router.resolve(job(b"garbage"))
    with pytest.raises(ValueError, match="already registered"):
        router.handler("plain")(plain)


def test_type_policy_is_known_by_type() -> None:
    """A type's max_retries, ladder and timeout are found by the job's type; other types set
    none, and a type no handler has (or none) has no route."""
    router = Router()

    @router.handler("brief", max_retries=1, retry_delays_ms=[5_000, 10_000], timeout_s=2)
    def brief(j: Job) -> None: ...

    @router.handler("plain")
    def plain(j: Job) -> None: ...

    route = router.route("brief")
    assert route is not None
    assert (route.max_retries, route.retry_delays_ms, route.timeout_s) == (1, (5_000, 10_000), 2.0)
    plain_route = router.route("plain")
    assert plain_route is not None
    assert (plain_route.max_retries, plain_route.retry_delays_ms, plain_route.timeout_s) == (
        None,
        None,
        None,
    )
    assert router.route("nope") is None
    assert router.route(None) is None


@pytest.mark.parametrize(
    "ladder",
    [(), [9], (86_400_001,), (10,) * 26, (1000, True), (1000.0,), "1000", 1000, [1000, None]],
)
def test_invalid_ladder_fails_registration(ladder: object) -> None:
    """retry_delays_ms other than 1-25 integers of 10-86,400,000 is refused when the handler
    is registered, naming the argument and the type."""
    with pytest.raises(ValueError, match=r"retry_delays_ms for job type 'x' is invalid: .*1-25"):
        Router().handler("x", retry_delays_ms=ladder)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [0, -1, math.inf, math.nan, True, "5"])
def test_invalid_timeout_fails_registration(timeout_s: object) -> None:
    """timeout_s must be a finite number of seconds > 0."""
    with pytest.raises(ValueError, match=r"timeout_s=.* for job type 'x' is invalid"):
        Router().handler("x", timeout_s=timeout_s)  # type: ignore[arg-type]


async def test_a_type_s_timeout_replaces_the_worker_s() -> None:
    """A type with timeout_s times out after it, whatever the worker's; the others keep the
    worker's, even while a job of the short type runs beside them."""
    router = Router()

    @router.handler("quick", timeout_s=0.05)
    async def quick(j: Job) -> None:
        await asyncio.sleep(0.3)

    @router.handler("patient")
    async def patient(j: Job) -> None:
        await asyncio.sleep(0.3)

    invoker = Invoker(router, timeout_s=5)
    (quick_outcome, quick_error), (patient_outcome, _) = await asyncio.gather(
        invoker(job(b"{}", "quick")), invoker(job(b"{}", "patient"))
    )
    assert quick_outcome is Outcome.TRANSIENT
    assert str(quick_error) == "handler ran longer than 0.05 s"
    assert patient_outcome is Outcome.SUCCEEDED


@pytest.mark.parametrize("max_retries", [-1, 26, True, 2.0, "3"])
def test_invalid_max_retries_fails_registration(max_retries: object) -> None:
    """max_retries outside 0-25, or not an integer, is refused when the handler is registered."""
    with pytest.raises(ValueError, match=r"max_retries=.* for job type 'x' .* from 0 to 25"):
        Router().handler("x", max_retries=max_retries)  # type: ignore[arg-type]


@pytest.mark.parametrize("give_up_on", [KeyError, (KeyError, "ValueError"), (KeyboardInterrupt,)])
def test_invalid_give_up_on_fails_registration(give_up_on: object) -> None:
    """give_up_on must be a tuple of exception classes, checked when the handler is registered."""
    with pytest.raises(TypeError, match=r"give_up_on=.* for job type 'x' .* exception classes"):
        Router().handler("x", give_up_on=give_up_on)  # type: ignore[arg-type]


class Refused(Exception):
    pass


class RefusedHard(Refused):
    pass


@pytest.mark.parametrize(
    ("raised", "outcome"),
    [
        (RefusedHard("no"), Outcome.PERMANENT),  # a subclass of a give_up_on class too
        (PermanentError("no"), Outcome.PERMANENT),
        (ConnectionError("later"), Outcome.TRANSIENT),
    ],
)
async def test_give_up_on_is_permanent(raised: Exception, outcome: Outcome) -> None:
    """An exception of a give_up_on class is a permanent failure; PermanentError stays one, and
    any other exception stays transient; another type's give_up_on does not apply."""
    router = Router()

    @router.handler("strict", give_up_on=(Refused,))
    def strict(j: Job) -> None:
        raise raised

    @router.handler("lenient")
    def lenient(j: Job) -> None:
        raise RefusedHard("no")

    invoker = Invoker(router, timeout_s=5)
    assert await invoker(job(b"{}", "strict")) == (outcome, raised)
    assert (await invoker(job(b"{}", "lenient")))[0] is Outcome.TRANSIENT


@pytest.mark.parametrize("is_async", [True, False])
async def test_a_timeout_the_handler_raises_is_its_own_failure(is_async: bool) -> None:
    """A TimeoutError the handler raises itself (a socket's, say) is that error, which
    give_up_on can name, not the handler running past RICOCHET_HANDLER_TIMEOUT_S."""
    router = Router()
    raised = TimeoutError("read timed out")

    async def async_fn(j: Job) -> None:
        raise raised

    def sync_fn(j: Job) -> None:
        raise raised

    router.handler("fetch", give_up_on=(TimeoutError,))(async_fn if is_async else sync_fn)
    invoker = Invoker(router, timeout_s=5)
    outcome, error = await invoker(job(b"{}", "fetch"))
    # From a thread, asyncio hands back a copy of a TimeoutError: compare what it says.
    assert outcome is Outcome.PERMANENT
    assert (type(error), str(error)) == (TimeoutError, "read timed out")


async def test_a_handler_past_its_timeout_is_a_transient_handler_timeout() -> None:
    """A handler that runs past the timeout fails transiently with HandlerTimeout."""
    router = Router()

    @router.handler("slow", give_up_on=(TimeoutError,))
    async def slow(j: Job) -> None:
        await asyncio.sleep(5)

    invoker = Invoker(router, timeout_s=0.05)
    outcome, error = await invoker(job(b"{}", "slow"))
    assert outcome is Outcome.TRANSIENT
    assert isinstance(error, HandlerTimeout)


async def test_sync_jobs_run_while_earlier_ones_hang() -> None:
    """Sync handlers past their timeout keep running (a thread cannot be stopped), but they
    never leave later sync jobs waiting for a thread: those run and succeed."""
    release = threading.Event()
    ran: list[str] = []

    def handler(j: Job) -> None:
        if j.message_id == "hang":
            release.wait(10)
        ran.append(str(j.message_id))

    invoker = Invoker(handler, timeout_s=0.2)
    hung = Job(b"{}", headers={}, message_id="hang", amqp_type=None, attempt=1, max_attempts=4)
    try:
        for _ in range(3):
            outcome, error = await invoker(hung)
            assert (outcome, type(error)) == (Outcome.TRANSIENT, HandlerTimeout)
        assert await invoker(job(b"{}")) == (Outcome.SUCCEEDED, None)
        assert ran == ["m"]
    finally:
        release.set()


async def test_a_shutdown_cancel_at_the_timeout_stays_a_cancel() -> None:
    """The attempt's task cancelled from elsewhere (a shutdown) while its limit cancels it: the
    shutdown's cancel wins and is not turned into a HandlerTimeout."""

    async def slow(j: Job) -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:  # the limit's cancel: the shutdown's comes meanwhile
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            raise

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(Invoker(slow, timeout_s=0.05)(job(b"{}")))


def test_interrupt_needs_an_async_handler() -> None:
    """A thread cannot be interrupted: interrupt=True on a sync handler is refused when it is
    registered, and a value that is not a bool too."""
    router = Router()
    with pytest.raises(ValueError, match="async handler"):
        router.handler("sync", interrupt=True)(lambda j: None)
    with pytest.raises(TypeError, match="not a bool"):
        router.handler("odd", interrupt="yes")  # type: ignore[arg-type]


async def test_a_cancelled_job_ends_cancelled() -> None:
    """raise_if_cancelled raises JobCancelled once the job is cancelled, and the invoker calls
    that outcome cancelled, even where give_up_on would fail any exception; a job cancelled
    before its handler starts does not run; interrupt=True cancels the handler's await."""
    router = Router()
    ran: list[str] = []

    @router.handler("flag", give_up_on=(Exception,))
    async def flag(j: Job) -> None:
        ran.append("flag")
        j.cancel()
        j.raise_if_cancelled()

    @router.handler("wait", interrupt=True)
    async def wait(j: Job) -> None:
        ran.append("wait")
        asyncio.get_running_loop().call_later(0.05, j.cancel)
        await asyncio.sleep(10)

    invoker = Invoker(router, timeout_s=5)
    for kind in ("flag", "wait"):
        outcome, error = await invoker(job(b"{}", kind))
        assert (outcome, type(error)) == (Outcome.CANCELLED, JobCancelled)
    early = job(b"{}", "flag")
    early.cancel()
    assert (await invoker(early))[0] is Outcome.CANCELLED
    assert ran == ["flag", "wait"]


async def test_an_interrupted_handler_that_stops_the_cancellation_ends_as_it_ends() -> None:
    """An interrupted handler that swallows its CancelledError and returns has succeeded; one
    that raises another error in its place has failed (docs/scheduling.md says both)."""
    router = Router()

    async def interrupted(j: Job) -> None:
        asyncio.get_running_loop().call_later(0.05, j.cancel)
        await asyncio.sleep(10)

    @router.handler("swallow", interrupt=True)
    async def swallow(j: Job) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await interrupted(j)

    @router.handler("replace", interrupt=True)
    async def replace(j: Job) -> None:
        try:
            await interrupted(j)
        finally:
            raise ConnectionError("rollback failed")

    invoker = Invoker(router, timeout_s=5)
    assert await invoker(job(b"{}", "swallow")) == (Outcome.SUCCEEDED, None)
    outcome, error = await invoker(job(b"{}", "replace"))
    assert (outcome, type(error)) == (Outcome.TRANSIENT, ConnectionError)


async def test_an_interrupted_handler_past_its_timeout_times_out() -> None:
    """interrupt=True leaves the timeout its own: a handler past it fails transiently."""
    router = Router()

    @router.handler("slow", interrupt=True)
    async def slow(j: Job) -> None:
        await asyncio.sleep(5)

    outcome, error = await Invoker(router, timeout_s=0.05)(job(b"{}", "slow"))
    assert (outcome, type(error)) == (Outcome.TRANSIENT, HandlerTimeout)


@pytest.mark.parametrize(
    ("timeouts_s", "worker_s", "longest_s"),
    [
        ((), 300.0, 300.0),
        ((None, 5.0), 300.0, 300.0),  # types with shorter timeouts, or the worker's
        ((None, 600.0, 30.0), 300.0, 600.0),  # a type allowed longer than the worker
    ],
)
def test_longest_timeout(
    timeouts_s: tuple[float | None, ...], worker_s: float, longest_s: float
) -> None:
    """The longest any handler may run: the worker's timeout or a type's, whichever is longer
    (how long the parent lets a process's event loop stop before it counts it wedged)."""
    router = Router()
    for n, timeout_s in enumerate(timeouts_s):
        router.handler(f"type-{n}", timeout_s=timeout_s)(lambda job: None)
    assert Invoker(router, timeout_s=worker_s).longest_timeout_s == longest_s


def test_longest_timeout_of_a_plain_handler() -> None:
    """A plain callable runs within the worker's timeout."""
    assert Invoker(lambda job: None, timeout_s=7.0).longest_timeout_s == 7.0
