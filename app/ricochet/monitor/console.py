"""The failed-jobs console: the failed queue as HTML pages, on the monitor's HTTP server.

GET /failed groups the copies by reason, a page at a time; GET /failed/<message_id> shows one.
GET /schedules lists the recurring jobs of RICOCHET_HANDLER's Router, as `ricochet schedules`.
GET /waiting shows the jobs that wait for a later attempt, grouped by the reason of their last
failure, each with a cancel form.
A monitor of several queues (RICOCHET_QUEUES) shows one queue's failed jobs at a time, chosen by
`?queue=` (or the form's queue field), its first queue when not told.
Replay, discard and cancel are forms that POST, and work only when RICOCHET_CONSOLE_TOKEN is set
and the form carries it: a token in the form, not a cookie, so another site cannot make a browser
send it (CSRF). Pages are rendered by Jinja2 with autoescaping, and served with a policy that runs
no script at all, so nothing a job carries can run in the page.

Anyone who reaches the port may ask for pages, so what a page costs is bounded whatever the
failed queue holds: a page lists a bounded number of jobs and clips what it shows of each value;
it is rendered in a thread, off the event loop the probes answer on; the page views that come
while a scan runs share it, and a scan no view waits for any more ends; beyond
PAGE_VIEWS_AT_ONCE requests the console answers 503 at once, leaving the connections to the
probes.
"""

import asyncio
import contextlib
import functools
import hmac
import json
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import parse_qsl, quote

import jinja2
from aio_pika.abc import AbstractConnection
from aiohttp import web

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.cancels import publish_cancel
from ricochet.broker.connection import close_quietly, connect, connection_name
from ricochet.broker.journal import now_ms, write_entries
from ricochet.client.message import cancelled_id
from ricochet.delivery.failed import REASON_MAX_CHARS, FailureInfo
from ricochet.errors import ConfigError, InvalidJob, RicochetError
from ricochet.handlers.invoker import load_handler
from ricochet.handlers.router import Router
from ricochet.log import get_logger
from ricochet.monitor.groups import Listing, listing, waiting_groups
from ricochet.names import Names
from ricochet.ops.failed_queue import CopyDetails, details_of, discard_failed
from ricochet.ops.jobs import moved_entries
from ricochet.ops.replay import replay
from ricochet.ops.scan import Copy, scanning
from ricochet.ops.schedules import read_schedules
from ricochet.ops.selection import Outcome, Selection
from ricochet.ops.waiting import Indexed, list_waiting
from ricochet.ops.waits import Listing as WaitingListing
from ricochet.settings import Settings, variable_name

log = get_logger("ricochet.console")
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A page waits this long for the broker before it says it cannot reach it.
CONNECT_TIMEOUT_S = 5.0
HEADERS = {
    # No script, no frames, forms only to this server: escaping is the first guard, this the second.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",  # pages hold payloads
}
ACTIONS = ("replay", "discard")
READ_ONLY = f"the console is read-only: {variable_name('console_token')} is not set"
# What the console cannot read the failed queue through: a page says so with a 503.
UNREADABLE = (RicochetError, *CONNECTION_ERRORS)

# Console requests served at once. They share the HTTP server's connections with the probes, so
# more get a 503 at once, and their connection back, rather than waiting on one.
PAGE_VIEWS_AT_ONCE = 8
BUSY = "the console is busy with other page views: try again in a moment\n"
PAGE_MAX_BYTES = 1_000_000
# What a page shows of a value at most, in characters: a job's type, kind and failed_at, a
# message_id's text (its link carries it whole: AMQP caps it at 255 bytes), a reason in the
# summary table, the types of a group; on a job's page, the copies of one message_id, and each
# copy's traceback, body (less in the compact form of a page too large otherwise) and header value.
FIELD_CHARS = 60
ID_CHARS = 100
SUMMARY_REASON_CHARS = 200
TYPES_SHOWN = 5
COPIES_SHOWN = 3
TRACEBACK_CHARS = 16_384
BODY_CHARS = 65_536
COMPACT_BODY_CHARS = 4_096
VALUE_CHARS = 8_192

FORM = "application/x-www-form-urlencoded"
FORM_MAX_FIELDS = 8
# A count or page number in a query: ASCII digits only (str.isdigit() also takes "²", which
# int() refuses), and few enough for int() (which refuses more than 4,300).
NUMBER = re.compile(r"[0-9]{1,9}")


def templates() -> jinja2.Environment:
    """The console's templates (package data), every value escaped unless marked safe."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ricochet.monitor", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["url"] = lambda text: quote(str(text), safe="")
    env.filters["pretty"] = _pretty
    env.filters["clip"] = clip
    env.filters["names"] = names
    env.globals.update(
        queues=(),  # the monitor's queues, when it watches more than one
        id_chars=ID_CHARS,
        reason_max_chars=REASON_MAX_CHARS,
        summary_reason_chars=SUMMARY_REASON_CHARS,
        traceback_chars=TRACEBACK_CHARS,
        body_chars=BODY_CHARS,
        compact_body_chars=COMPACT_BODY_CHARS,
        value_chars=VALUE_CHARS,
    )
    return env


def _pretty(value: Any) -> str:
    """A header value as text: strings as they are, tables and arrays as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def clip(text: str | None, chars: int = FIELD_CHARS) -> str | None:
    """At most chars characters of text, with an ellipsis when it was longer (None stays None)."""
    if text is None or len(text) <= chars:
        return text
    return text[:chars] + "…"


def names(values: Iterable[str], shown: int = TYPES_SHOWN) -> str:
    """'a, b, c and 4 more': the first values in sorted order, each clipped."""
    ordered = sorted(values)
    text = ", ".join(clip(v) or "" for v in ordered[:shown])
    return f"{text} and {len(ordered) - shown} more" if len(ordered) > shown else text


def token_matches(expected: str | None, given: str | None) -> bool:
    """Whether a form's token is the configured one (constant time); never without one."""
    if expected is None or given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def query_number(query: Mapping[str, str], name: str, least: int = 0) -> int | None:
    """A whole number from the query string (None when absent); HTTPBadRequest saying what it
    must be when it is anything else."""
    text = query.get(name)
    if text is None:
        return None
    if NUMBER.fullmatch(text) is None or int(text) < least:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number from {least} to 999999999\n")
    return int(text)


def form_token(body: bytes) -> str | None:
    """The token field of a URL-encoded form, read before anything else is: as Latin-1, which
    reads any bytes and cannot fail, and reads the token (printable ASCII) as it was sent."""
    try:
        fields = parse_qsl(
            body.decode("latin-1"), encoding="latin-1", max_num_fields=FORM_MAX_FIELDS
        )
    except ValueError:  # too many fields: no form of the console's
        return None
    return next((value for name, value in fields if name == "token"), None)


async def posted_form(request: web.Request) -> bytes:
    """The body of a console form, once its headers say it is one: HTTPUnsupportedMediaType
    for another content type, HTTPBadRequest for a charset other than UTF-8."""
    if request.content_type != FORM:
        raise web.HTTPUnsupportedMediaType(text=f"a console form is sent as {FORM}\n")
    if (request.charset or "utf-8").lower() not in ("utf-8", "utf8"):
        raise web.HTTPBadRequest(text="a console form is read as UTF-8, in no other charset\n")
    return await request.read()


def form_fields(body: bytes) -> dict[str, str]:
    """The fields of a URL-encoded UTF-8 form, the first of each name; ValueError when the body
    is not one."""
    try:
        fields = parse_qsl(
            body.decode("ascii"),
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=FORM_MAX_FIELDS,
        )
    except ValueError:  # UnicodeDecodeError included
        raise ValueError(
            f"a console form is URL-encoded UTF-8 of at most {FORM_MAX_FIELDS} fields"
        ) from None
    found: dict[str, str] = {}
    for name, value in fields:
        found.setdefault(name, value)
    return found


@dataclass
class Stop:
    """How a shared scan learns that no page view waits for it any more, and whether it holds
    copies (then it must be stopped, not cancelled)."""

    requested: bool = False
    holding: bool = False


@dataclass
class _Flight:
    task: asyncio.Task[Any]
    stop: Stop
    waiting: int = 0


class Flights:
    """Scans shared by the page views that ask for the same page while one runs.

    The last view to leave (its client gone, so the server cancelled its handler) ends the scan:
    one that holds no copies yet (it waits for the lock, the broker or another reader) is
    cancelled; one that holds copies is stopped at its next copy, so that it hands them back in
    one nack as every scan's end does, not by closing its channel, which some brokers count as
    a delivery of each copy.
    """

    def __init__(self) -> None:
        self._flying: dict[tuple[str, str | None], _Flight] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # referenced until they end

    async def join(
        self, key: tuple[str, str | None], scan: Callable[[Stop], Coroutine[Any, Any, T]]
    ) -> T:
        """The result of the scan for key (a queue, and a message_id or None for the list)
        under way, or of a new one of scan(stop)."""
        flight = self._flying.get(key)
        if flight is None:
            stop = Stop()
            task = asyncio.get_running_loop().create_task(scan(stop))
            flight = self._flying[key] = _Flight(task, stop)
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._landed, key, flight))
            log.info("console scan", queue=key[0], message_id=key[1])
        flight.waiting += 1
        try:
            return cast(T, await asyncio.shield(flight.task))
        finally:
            flight.waiting -= 1
            if not flight.waiting and not flight.task.done():
                self._abandon(key, flight)

    def _abandon(self, key: tuple[str, str | None], flight: _Flight) -> None:
        if self._flying.get(key) is flight:
            del self._flying[key]  # a view that comes now starts a scan of its own
        flight.stop.requested = True
        if not flight.stop.holding:
            flight.task.cancel()
        log.info(
            "console scan abandoned", queue=key[0], message_id=key[1], holding=flight.stop.holding
        )

    def _landed(
        self, key: tuple[str, str | None], flight: _Flight, task: asyncio.Task[Any]
    ) -> None:
        self._tasks.discard(task)
        if self._flying.get(key) is flight:
            del self._flying[key]
        if not task.cancelled():
            task.exception()  # its waiters saw it, or there were none left to see it


@dataclass
class Found:
    """The copies of one message_id that a scan found: how many, the oldest few in full."""

    message_id: str
    count: int = 0
    copies: list[CopyDetails] = field(default_factory=list)

    def add(self, copy: Copy) -> None:
        if copy.failure.message_id != self.message_id:
            return
        self.count += 1
        if len(self.copies) < COPIES_SHOWN:
            self.copies.append(details_of(copy.message, copy.failure))


class Console:
    """The console's request handlers. Its scans take turns under one lock, since two at once
    would each see only the copies the other does not hold."""

    def __init__(self, settings: Settings, index: Indexed | None = None) -> None:
        self._settings = settings
        # The monitor's index of the journal, which the waiting jobs are listed from.
        self._index = index
        self._queues = settings.queue_names
        # Without ?queue=, the queue commands use (RICOCHET_QUEUE) when watched, else the first.
        self._home = settings.queue if settings.queue in self._queues else self._queues[0]
        token = settings.console_token
        self._token = None if token is None else token.get_secret_value()
        self._env = templates()
        self._lock = asyncio.Lock()
        self._flights = Flights()
        self._serving = 0
        self._actions: set[asyncio.Task[Any]] = set()  # referenced until they end

    def routes(self) -> web.RouteTableDef:
        table = web.RouteTableDef()
        table.get("/failed")(self.limited(self.index))
        table.get("/schedules")(self.limited(self.schedules))
        table.post("/failed/actions/{action}")(self.limited(self.act))
        table.get("/failed/{message_id:.+}")(self.limited(self.job))
        table.post("/failed")(self.limited(self.not_an_action))
        table.post("/failed/{message_id:.+}")(self.limited(self.not_an_action))
        table.get("/waiting")(self.limited(self.waiting))
        table.get("/api/waiting")(self.limited(self.api_waiting))
        table.post("/waiting/cancel")(self.limited(self.cancel))
        for page in ("/waiting", "/schedules"):
            table.post(page)(self.limited(self.not_an_action))
        return table

    def limited(self, handler: Handler) -> Handler:
        """handler, unless PAGE_VIEWS_AT_ONCE requests are being served already: then a 503 at
        once, which closes its connection."""

        async def limited(request: web.Request) -> web.StreamResponse:
            if self._serving >= PAGE_VIEWS_AT_ONCE:
                busy = web.Response(status=503, text=BUSY, headers={**HEADERS, "Retry-After": "5"})
                busy.force_close()
                return busy
            self._serving += 1
            try:
                return await handler(request)
            finally:
                self._serving -= 1

        return limited

    async def _with_broker(
        self, work: Callable[[AbstractConnection], Awaitable[T]], *, scans: bool = True
    ) -> T:
        """work on a connection of its own; in turn with the other scans (under the lock) unless
        it consumes no queue (scans=False: the waiting jobs are listed from the journal)."""
        async with self._lock if scans else contextlib.nullcontext():
            name = connection_name("console", self._settings.queue)
            connection = await connect(self._settings.amqp_url, name, CONNECT_TIMEOUT_S)
            try:
                return await work(connection)
            finally:
                await close_quietly(connection)

    def _names_of(self, queue: str | None) -> Names:
        """The names of the queue a request asks for (RICOCHET_QUEUE, or the first watched, when
        none); a 404 for one the monitor does not watch."""
        if queue is None:
            return Names(self._home)
        if queue not in self._queues:
            raise web.HTTPNotFound(text=f"this monitor watches no queue {clip(queue)!r}\n")
        return Names(queue)

    async def _read_each(self, names: Names, stop: Stop, visit: Callable[[Copy], None]) -> None:
        """Hand every copy of Q.failed to visit, or those up to the one at which stop is
        requested; the scan hands them all back."""

        async def read(connection: AbstractConnection) -> None:
            started = time.monotonic()
            async with scanning(
                connection, names, management_url=self._settings.management_url
            ) as scan:
                stop.holding = True
                async for copy in scan.copies():
                    if stop.requested:
                        break
                    visit(copy)
            log.info(
                "console scan stopped" if stop.requested else "console scan done",
                queue=names.failed,
                copies=scan.read,
                took_s=round(time.monotonic() - started, 3),
            )

        await self._with_broker(read)

    async def _list(self, names: Names, stop: Stop) -> Listing:
        failures: list[FailureInfo] = []
        await self._read_each(names, stop, lambda copy: failures.append(copy.failure))
        return await asyncio.to_thread(listing, failures)

    async def _find(self, names: Names, message_id: str, stop: Stop) -> Found:
        found = Found(message_id)
        await self._read_each(names, stop, found.add)
        return found

    def _render(self, template: str, values: Mapping[str, Any], names: Names) -> str:
        return self._env.get_template(template).render(
            queue=names.queue,
            failed_queue=names.failed,
            queues=self._queues if len(self._queues) > 1 else (),
            writable=self._token is not None,
            **values,
        )

    def _render_job(self, found: Found, names: Names) -> str:
        """A job's page; its compact form when the whole would pass PAGE_MAX_BYTES."""
        values = {"message_id": found.message_id, "copies": found.copies, "count": found.count}
        html = self._render("job.html", {**values, "compact": False}, names)
        if len(html.encode()) > PAGE_MAX_BYTES:
            html = self._render("job.html", {**values, "compact": True}, names)
        return html

    async def _page(self, render: Callable[[], str], status: int = 200) -> web.Response:
        # In a thread: rendering a page takes long enough to keep the probes waiting.
        html = await asyncio.to_thread(render)
        return web.Response(
            text=html, status=status, content_type="text/html", charset="utf-8", headers=HEADERS
        )

    async def error(self, status: int, message: str, names: Names | None = None) -> web.Response:
        names = names or self._names_of(None)
        return await self._page(
            lambda: self._render("error.html", {"message": message}, names), status
        )

    async def show(
        self, template: str, values: Mapping[str, Any], status: int = 200
    ) -> web.Response:
        """A page of another view of the monitor's (the jobs' pages), in the console's frame."""
        names = self._names_of(None)
        return await self._page(lambda: self._render(template, values, names), status)

    def token_given(self, given: str | None) -> bool | None:
        """Whether given is the console token; None when no token is set (nothing is kept from
        anyone)."""
        return None if self._token is None else token_matches(self._token, given)

    async def schedules(self, request: web.Request) -> web.Response:
        """The recurring jobs of RICOCHET_HANDLER's Router, as `ricochet schedules` lists them:
        its module is imported at the first view (a monitor without it serves the rest)."""
        names = self._names_of(None)
        try:
            handler = load_handler(self._settings.handler)
        except ConfigError as error:
            values: dict[str, Any] = {
                "rows": [],
                "problem": f"the handler cannot be imported here: {error}",
            }
            return await self._page(lambda: self._render("schedules.html", values, names))
        registered = handler.schedules if isinstance(handler, Router) else []
        now_ms = time.time_ns() // 1_000_000
        try:
            rows = await self._with_broker(
                lambda c: read_schedules(c, registered, self._settings.queue, now_ms)
            )
        except UNREADABLE as error:
            return await self.error(503, str(error), names)
        values = {"rows": rows, "problem": None}
        return await self._page(lambda: self._render("schedules.html", values, names))

    async def index(self, request: web.Request) -> web.Response:
        names = self._names_of(request.query.get("queue"))
        number = query_number(request.query, "page", least=1) or 1
        done = {
            name: count
            for name in ("replayed", "discarded")
            if (count := query_number(request.query, name)) is not None
        }
        try:
            found = await self._flights.join(
                (names.queue, None), lambda stop: self._list(names, stop)
            )
        except UNREADABLE as error:
            return await self.error(503, str(error), names)
        pages = len(found.pages)
        if number > pages:
            return await self.error(
                404, f"no page {number}: the failed jobs fill {pages} now", names
            )
        values = {
            "total": found.total,
            "reasons": len(found.groups),
            "page": found.pages[number - 1],
            "table": found.reasons_from(found.pages[number - 1]),
            "pages": pages,
            "done": done,
        }
        return await self._page(lambda: self._render("failed.html", values, names))

    async def job(self, request: web.Request) -> web.Response:
        names = self._names_of(request.query.get("queue"))
        message_id = request.match_info["message_id"]
        try:
            found = await self._flights.join(
                (names.queue, message_id), lambda s: self._find(names, message_id, s)
            )
        except UNREADABLE as error:
            return await self.error(503, str(error), names)
        if not found.count:
            return await self.error(
                404, f"no failed job {clip(message_id, ID_CHARS)!r} of {names.queue}", names
            )
        return await self._page(lambda: self._render_job(found, names))

    async def act(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        form = await self._form(request)
        if isinstance(form, web.Response):
            return form
        message_id, reason = form.get("message_id"), form.get("reason")
        names = self._names_of(form.get("queue"))
        if action not in ACTIONS:
            raise web.HTTPNotFound(text=f"the actions are {', '.join(ACTIONS)}\n")
        if message_id:
            selection = Selection(message_id=message_id)
        elif reason:
            selection = Selection(reason_is=reason)
        else:
            raise web.HTTPBadRequest(text="an action needs a message_id or a reason\n")
        try:
            outcome = await self._whole(self._act(names, action, selection, request.remote))
        except UNREADABLE as error:
            return await self.error(503, str(error), names)
        past = "replayed" if action == "replay" else "discarded"
        queue = quote(names.queue, safe="")
        where = f"queue={queue}&" if len(self._queues) > 1 else ""
        raise web.HTTPSeeOther(f"/failed?{where}{past}={len(outcome.selected)}")

    async def waiting(self, request: web.Request) -> web.Response:
        """The jobs of a queue that wait for a later attempt, grouped by the reason of their last
        failure, each with a cancel form (SPEC 23)."""
        names, found = await self._waiting_of(request)
        if isinstance(found, str):
            return await self.error(503, found, names)
        groups = waiting_groups(found.rows)
        values = {
            "total": len(found.rows),
            "shown": sum(len(group.jobs) for group in groups),
            "groups": groups,
            "unrecorded": found.unrecorded,
            "read": found.read,
            "complete": found.complete,
            "cancelled": request.query.get("cancelled"),
        }
        return await self._page(lambda: self._render("waiting.html", values, names))

    async def api_waiting(self, request: web.Request) -> web.Response:
        """The waiting jobs of a queue as `ricochet waiting --json` lists them (its filters as
        query parameters), with the unrecorded ones by place: what the command asks when
        RICOCHET_MONITOR_URL is set."""
        _, found = await self._waiting_of(
            request,
            job_type=request.query.get("type"),
            message_id=request.query.get("message_id"),
            limit=query_number(request.query, "limit", least=1),
        )
        if isinstance(found, str):
            return web.json_response({"error": found}, status=503, headers=HEADERS)
        return web.json_response(found.as_dict(), headers=HEADERS)

    async def _waiting_of(
        self, request: web.Request, **chosen: Any
    ) -> tuple[Names, WaitingListing | str]:
        """The request's queue, and its waiting jobs (listed from the monitor's index: no queue
        is consumed, so no scan is waited for), or why the broker could not be asked."""
        names = self._names_of(request.query.get("queue"))
        settings = self._settings.model_copy(update={"queue": names.queue})
        try:
            found = await self._with_broker(
                lambda c: list_waiting(c, settings, index=self._index, **chosen), scans=False
            )
        except UNREADABLE as error:
            return names, str(error)
        return names, found

    async def cancel(self, request: web.Request) -> web.Response:
        """Cancel one job of a queue, as `ricochet cancel` does (with the console's token)."""
        form = await self._form(request)
        if isinstance(form, web.Response):
            return form
        names = self._names_of(form.get("queue"))
        try:
            message_id = cancelled_id(form.get("message_id"))
        except InvalidJob as error:
            raise web.HTTPBadRequest(text=f"{error}\n") from None
        try:
            await self._whole(self._with_broker(lambda c: publish_cancel(c, names, message_id)))
        except UNREADABLE as error:
            return await self.error(503, str(error), names)
        log.info("console cancel", queue=names.queue, message_id=message_id, peer=request.remote)
        queue, cancelled = quote(names.queue, safe=""), quote(message_id, safe="")
        raise web.HTTPSeeOther(f"/waiting?queue={queue}&cancelled={cancelled}")

    async def _form(self, request: web.Request) -> dict[str, str] | web.Response:
        """An action's form, once its token is checked: a 403 without the token, HTTPBadRequest
        (or 415) for what is no URL-encoded UTF-8 form. What the headers say is checked first,
        then the token, read as the form's other fields cannot be until it matches."""
        if self._token is None:
            return await self._refused(READ_ONLY)
        body = await posted_form(request)
        if not token_matches(self._token, form_token(body)):
            return await self._refused("missing or wrong console token")
        try:
            return form_fields(body)
        except ValueError as error:
            raise web.HTTPBadRequest(text=f"{error}\n") from None

    async def _act(
        self, names: Names, action: str, selection: Selection, peer: str | None
    ) -> Outcome:
        outcome = await self._with_broker(lambda c: self._do(c, names, action, selection))
        log.info(
            f"console {action}",
            queue=names.queue,
            message_id=selection.message_id,
            reason=selection.reason_is,
            jobs=len(outcome.selected),
            peer=peer,
        )
        return outcome

    async def _whole(self, work: Coroutine[Any, Any, T]) -> T:
        """work's result; work goes on to its end if the client leaves meanwhile (the server then
        cancels the handler): an action asked of the failed queue is carried out whole."""
        task = asyncio.get_running_loop().create_task(work)
        self._actions.add(task)
        task.add_done_callback(self._action_ended)
        return await asyncio.shield(task)

    def _action_ended(self, task: asyncio.Task[Any]) -> None:
        self._actions.discard(task)
        if not task.cancelled():
            task.exception()  # the handler saw it, unless its client had left

    async def not_an_action(self, request: web.Request) -> web.Response:
        """A POST to a page: refused as every POST is on a read-only console; on a writable one
        the forms post to /failed/actions/replay, /failed/actions/discard and /waiting/cancel."""
        if self._token is None:
            return await self._refused(READ_ONLY)
        raise web.HTTPMethodNotAllowed(request.method, ["GET"])

    async def _do(
        self, connection: AbstractConnection, names: Names, action: str, s: Selection
    ) -> Outcome:
        url, began_ms = self._settings.management_url, now_ms()
        if action == "replay":
            outcome, event = await replay(connection, names, s, management_url=url), "replayed"
        else:
            outcome, event = (
                await discard_failed(connection, names, s, management_url=url),
                "discarded",
            )
        if self._settings.journal == "on":
            moved = moved_entries(names.queue, outcome.selected, event, began_ms)
            await write_entries(connection, moved)
        return outcome

    async def _refused(self, why: str) -> web.Response:
        return await self.error(403, why)
