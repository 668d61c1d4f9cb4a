"""The failed-jobs console: the failed queue as HTML pages, on the monitor's HTTP server.

GET /failed groups the copies by reason; GET /failed/<message_id> shows one. Replay and discard
are forms that POST, and work only when RICOCHET_CONSOLE_TOKEN is set and the form carries it:
a token in the form, not a cookie, so another site cannot make a browser send it (CSRF). Pages
are rendered by Jinja2 with autoescaping, and served with a policy that runs no script at all,
so nothing a job carries can run in the page.
"""

import asyncio
import hmac
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote

import jinja2
import structlog
from aio_pika.abc import AbstractConnection
from aiohttp import web

from ricochet.broker.connection import close_quietly, connect, connection_name
from ricochet.broker.topology import Names
from ricochet.errors import BrokerUnavailable, RicochetError
from ricochet.monitor.groups import group_by_reason
from ricochet.ops.failed_queue import discard_failed, list_failed, show_failed
from ricochet.ops.replay import replay
from ricochet.ops.selection import Outcome, Selection
from ricochet.settings import Settings

log = structlog.get_logger("ricochet.console")
T = TypeVar("T")

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
READ_ONLY = "the console is read-only: RICOCHET_CONSOLE_TOKEN is not set"
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
    return env


def _pretty(value: Any) -> str:
    """A header value as text: strings as they are, tables and arrays as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


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


class Console:
    """The console's request handlers, over one lock: one scan of the failed queue at a time,
    since two at once would each see only the copies the other does not hold."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._names = Names(settings.queue)
        token = settings.console_token
        self._token = None if token is None else token.get_secret_value()
        self._env = templates()
        self._lock = asyncio.Lock()

    def routes(self) -> web.RouteTableDef:
        table = web.RouteTableDef()
        table.get("/failed")(self.index)
        table.post("/failed/actions/{action}")(self.act)
        table.get("/failed/{message_id:.+}")(self.job)
        table.post("/failed")(self.not_an_action)
        table.post("/failed/{message_id:.+}")(self.not_an_action)
        return table

    async def _with_broker(self, work: Callable[[AbstractConnection], Awaitable[T]]) -> T:
        async with self._lock:
            name = connection_name("console", self._settings.queue)
            connection = await connect(self._settings.amqp_url, name, CONNECT_TIMEOUT_S)
            try:
                return await work(connection)
            finally:
                await close_quietly(connection)

    def _page(self, template: str, status: int = 200, **values: Any) -> web.Response:
        html = self._env.get_template(template).render(
            queue=self._names.queue,
            failed_queue=self._names.failed,
            writable=self._token is not None,
            **values,
        )
        return web.Response(
            text=html, status=status, content_type="text/html", charset="utf-8", headers=HEADERS
        )

    async def index(self, request: web.Request) -> web.Response:
        done = {
            name: count
            for name in ("replayed", "discarded")
            if (count := query_number(request.query, name)) is not None
        }
        try:
            outcome = await self._with_broker(lambda c: list_failed(c, self._names, Selection()))
        except (BrokerUnavailable, RicochetError) as error:
            return self._page("error.html", 503, message=str(error))
        return self._page(
            "failed.html",
            total=len(outcome.selected),
            groups=group_by_reason(outcome.selected),
            done=done,
        )

    async def job(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        try:
            found = await self._with_broker(lambda c: show_failed(c, self._names, message_id))
        except (BrokerUnavailable, RicochetError) as error:
            return self._page("error.html", 503, message=str(error))
        if not found:
            return self._page("error.html", 404, message=f"no failed job {message_id!r}")
        return self._page("job.html", message_id=message_id, copies=found)

    async def act(self, request: web.Request) -> web.Response:
        action = request.match_info["action"]
        form = await self._form(request)
        if isinstance(form, web.Response):
            return form
        message_id, reason = form.get("message_id"), form.get("reason")
        if action not in ACTIONS:
            raise web.HTTPNotFound(text=f"the actions are {', '.join(ACTIONS)}\n")
        if message_id:
            selection = Selection(message_id=message_id)
        elif reason:
            selection = Selection(reason_is=reason)
        else:
            raise web.HTTPBadRequest(text="an action needs a message_id or a reason\n")
        try:
            outcome = await self._with_broker(lambda c: self._do(c, action, selection))
        except (BrokerUnavailable, RicochetError) as error:
            return self._page("error.html", 503, message=str(error))
        log.info(
            f"console {action}",
            message_id=selection.message_id,
            reason=selection.reason_is,
            jobs=len(outcome.selected),
            peer=request.remote,
        )
        past = "replayed" if action == "replay" else "discarded"
        raise web.HTTPSeeOther(f"/failed?{past}={len(outcome.selected)}")

    async def _form(self, request: web.Request) -> dict[str, str] | web.Response:
        """An action's form, once its token is checked: a 403 without the token, HTTPBadRequest
        (or 415) for what is no URL-encoded UTF-8 form. What the headers say is checked first,
        then the token, read as the form's other fields cannot be until it matches."""
        if self._token is None:
            return self._refused(READ_ONLY)
        if request.content_type != FORM:
            raise web.HTTPUnsupportedMediaType(text=f"a console form is sent as {FORM}\n")
        if (request.charset or "utf-8").lower() not in ("utf-8", "utf8"):
            raise web.HTTPBadRequest(text="a console form is read as UTF-8, in no other charset\n")
        body = await request.read()
        if not token_matches(self._token, form_token(body)):
            return self._refused("missing or wrong console token")
        try:
            return form_fields(body)
        except ValueError as error:
            raise web.HTTPBadRequest(text=f"{error}\n") from None

    async def not_an_action(self, request: web.Request) -> web.Response:
        """A POST to a page: refused as every POST is on a read-only console; on a writable one
        the forms post to /failed/actions/replay and /failed/actions/discard."""
        if self._token is None:
            return self._refused(READ_ONLY)
        raise web.HTTPMethodNotAllowed(request.method, ["GET"])

    async def _do(self, connection: AbstractConnection, action: str, s: Selection) -> Outcome:
        if action == "replay":
            return await replay(connection, self._names, s)
        return await discard_failed(connection, self._names, s)

    def _refused(self, why: str) -> web.Response:
        return self._page("error.html", 403, message=why)
