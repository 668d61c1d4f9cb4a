"""`ricochet job` and `ricochet waiting` asking the monitor's index of the journal
(RICOCHET_MONITOR_URL, SPEC 26) instead of reading the journal back."""

from typing import Any
from urllib.parse import quote

import aiohttp

from ricochet.ops.waits import Listing, listing_of

# The monitor answers from memory within a second; past this it is taken as not answering.
ASK_TIMEOUT_S = 10.0


class MonitorUnanswered(Exception):
    """The monitor did not answer, or not as a monitor of ricochet's: the caller reads the
    journal back instead (not a RicochetError: no command ends on it)."""


async def job_from_monitor(
    monitor_url: str, message_id: str, queue: str | None, token: str | None
) -> dict[str, Any] | None:
    """The job as the monitor's index knows it (with "complete": whether the index had read the
    whole journal), or None when it knows no such job; MonitorUnanswered when the monitor does
    not answer as one."""
    path = f"api/jobs/{quote(message_id, safe='')}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {"queue": queue} if queue else {}
    status, answer = await _ask(monitor_url, path, params, headers, (200, 404))
    if not isinstance(answer, dict) or "complete" not in answer:
        raise MonitorUnanswered("its answer is not a job of its index")
    return answer if status == 200 else None


async def waiting_from_monitor(monitor_url: str, query: dict[str, str]) -> Listing:
    """The waiting jobs the monitor lists from its index for `ricochet waiting`'s filters
    (queue, type, message_id, limit); MonitorUnanswered when it does not answer as a monitor."""
    _, answer = await _ask(monitor_url, "api/waiting", query, {}, (200,))
    try:
        return listing_of(answer)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise MonitorUnanswered(f"its answer is not a list of waiting jobs ({error})") from None


async def _ask(
    monitor_url: str,
    path: str,
    params: dict[str, str],
    headers: dict[str, str],
    statuses: tuple[int, ...],
) -> tuple[int, Any]:
    """(status, JSON) of a GET of the monitor's path, within ASK_TIMEOUT_S; MonitorUnanswered
    when it does not answer, refuses the console token, or answers another status."""
    url = f"{monitor_url.rstrip('/')}/{path}"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as session,
            session.get(url, params=params, headers=headers) as response,
        ):
            if response.status == 401:
                raise MonitorUnanswered("it refused RICOCHET_CONSOLE_TOKEN")
            if response.status not in statuses:
                raise MonitorUnanswered(f"it answered HTTP {response.status}")
            return response.status, await response.json()
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
        raise MonitorUnanswered(str(error) or type(error).__name__) from None
