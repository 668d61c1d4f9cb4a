"""The journal's views on the monitor (SPEC 26), read from its index (monitor/index.py):

- GET /api/jobs: recent jobs, newest first, with the filters and the cursor of `ricochet jobs`
  (queue, type, state, limit, before) as query parameters: {"jobs": [...], "next": CURSOR or
  null, "complete": bool};
- GET /api/jobs/<message_id>[?queue=Q]: the job as `ricochet job --json` prints it, with
  "complete"; 404 when the index knows no such job;
- GET /jobs and /jobs/<message_id>: the same as pages of the console.

"complete" is false while the index is still reading what the journal held at the monitor's
start. With RICOCHET_CONSOLE_TOKEN set, a job's result is given only to a request that carries
the token: `Authorization: Bearer TOKEN` for the API, the page's form (a POST) for the page;
others get neither the result nor the progress, and "result_withheld": true when there was one.
"""

import asyncio
import json
from typing import Any

from aiohttp import web

from ricochet.broker.journal import now_ms
from ricochet.monitor.console import (
    HEADERS,
    ID_CHARS,
    Console,
    clip,
    form_token,
    posted_form,
    query_number,
)
from ricochet.monitor.index import JobIndex
from ricochet.ops.jobs import STATES, JobFilter, JobHistory, decode_cursor, page

LIMIT_DEFAULT = 50
LIMIT_MOST = 500
BEARER = "Bearer "


def _text(query: Any, name: str) -> str | None:
    value = query.get(name)
    return value if value else None


def selection(query: Any) -> tuple[JobFilter, int, tuple[int, str, str] | None]:
    """The filters, page size and cursor of a request; HTTPBadRequest saying what is wrong."""
    state = _text(query, "state")
    if state is not None and state not in STATES:
        raise web.HTTPBadRequest(text=f"state must be one of {', '.join(STATES)}\n")
    limit = query_number(query, "limit", least=1) or LIMIT_DEFAULT
    if limit > LIMIT_MOST:
        raise web.HTTPBadRequest(text=f"limit must be a whole number from 1 to {LIMIT_MOST}\n")
    before = _text(query, "before")
    try:
        cursor = None if before is None else decode_cursor(before)
    except ValueError as error:
        raise web.HTTPBadRequest(text=f"before: {error}\n") from None
    return JobFilter(_text(query, "queue"), _text(query, "type"), state), limit, cursor


class JobViews:
    """The journal's API and pages, over the monitor's index and in the console's frame."""

    def __init__(self, console: Console, index: JobIndex) -> None:
        self._console = console
        self._index = index

    def routes(self) -> web.RouteTableDef:
        table = web.RouteTableDef()
        limited = self._console.limited
        table.get("/api/jobs")(limited(self.api_jobs))
        table.get("/api/jobs/{message_id:.+}")(limited(self.api_job))
        table.get("/jobs")(limited(self.jobs_page))
        table.get("/jobs/{message_id:.+}")(limited(self.job_page))
        table.post("/jobs/{message_id:.+}")(limited(self.job_page))
        return table

    def _found(self, request: web.Request) -> JobHistory | None:
        found = self._index.job(request.match_info["message_id"], _text(request.query, "queue"))
        return found[-1] if found else None

    async def _listed(
        self, selected: tuple[JobFilter, int, tuple[int, str, str] | None]
    ) -> tuple[list[JobHistory], str | None]:
        """A page of the index, found in a thread (one pass over half a million jobs takes
        0.4 s: the probes and the index's reader go on meanwhile) over the jobs held now."""
        matches, limit, cursor = selected
        jobs = list(self._index.jobs())
        return await asyncio.to_thread(page, jobs, matches, now_ms(), limit, cursor)

    async def api_jobs(self, request: web.Request) -> web.Response:
        shown, next_cursor = await self._listed(selection(request.query))
        now = now_ms()
        rows = [job.row(now) for job in shown]
        return _json({"jobs": rows, "next": next_cursor, "complete": self._index.complete})

    async def api_job(self, request: web.Request) -> web.Response:
        job = self._found(request)
        complete = self._index.complete
        if job is None:
            missing = f"no job {request.match_info['message_id']!r} in the journal's index"
            return _json({"error": missing, "complete": complete}, 404)
        auth = request.headers.get("Authorization", "")
        given = auth[len(BEARER) :] if auth.startswith(BEARER) else None
        if given is not None and self._console.token_given(given) is False:
            return _json({"error": "wrong console token", "complete": complete}, 401)
        return _json({**self._as_dict(job, given), "complete": complete})

    def _as_dict(self, job: JobHistory, token: str | None) -> dict[str, Any]:
        """The job as `ricochet job --json` prints it; without the console token (when one is
        set) with neither its result nor its progress, what a handler returned or reported."""
        if self._console.token_given(token) is not False:
            return job.as_dict(now_ms())
        shown = job.as_dict(now_ms(), with_result=False)
        withheld = bool(job.result) or shown["progress"] is not None
        return {**shown, "progress": None, **({"result_withheld": True} if withheld else {})}

    async def jobs_page(self, request: web.Request) -> web.Response:
        selected = selection(request.query)
        shown, next_cursor = await self._listed(selected)
        now = now_ms()
        matches, limit, _ = selected
        filters = {k: v for k, v in vars(matches).items() if v is not None}
        values = {
            "rows": [job.row(now) for job in shown],
            "next": next_cursor,
            "filters": filters,
            "paging": {**filters, **({"limit": limit} if limit != LIMIT_DEFAULT else {})},
            "states": STATES,
            "complete": self._index.complete,
            "entries": self._index.entries,
        }
        return await self._console.show("jobs.html", values)

    async def job_page(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        given = None
        if request.method == "POST":
            given = form_token(await posted_form(request))
            if self._console.token_given(given) is False:
                return await self._console.error(403, "missing or wrong console token")
        job = self._found(request)
        if job is None:
            return await self._console.error(
                404, f"no job {clip(message_id, ID_CHARS)!r} in the journal's index"
            )
        shown = self._as_dict(job, given)
        values = {
            "job": shown,
            "queue_of_job": job.queue,
            "result": json.dumps(shown["result"], indent=2, ensure_ascii=False),
            "progress": json.dumps(shown["progress"], ensure_ascii=False),
            "complete": self._index.complete,
        }
        return await self._console.show("history.html", values)


def _json(value: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(value, status=status, headers=HEADERS)
