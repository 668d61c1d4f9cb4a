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
    url = f"{monitor_url.rstrip('/')}/api/jobs/{quote(message_id, safe='')}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {"queue": queue} if queue else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as session,
            session.get(url, params=params, headers=headers) as response,
        ):
            if response.status == 401:
                raise MonitorUnanswered("it refused RICOCHET_CONSOLE_TOKEN")
            if response.status not in (200, 404):
                raise MonitorUnanswered(f"it answered HTTP {response.status}")
            answer = await response.json()
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
        raise MonitorUnanswered(str(error) or type(error).__name__) from None
    if not isinstance(answer, dict) or "complete" not in answer:
        raise MonitorUnanswered("its answer is not a job of its index")
    return answer if response.status == 200 else None


async def waiting_from_monitor(monitor_url: str, query: dict[str, str]) -> Listing:
    """The waiting jobs the monitor lists from its index for `ricochet waiting`'s filters
    (queue, type, message_id, limit); MonitorUnanswered when it does not answer as a monitor."""
    url = f"{monitor_url.rstrip('/')}/api/waiting"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)) as session,
            session.get(url, params=query) as response,
        ):
            if response.status != 200:
                raise MonitorUnanswered(f"it answered HTTP {response.status}")
            answer = await response.json()
        return listing_of(answer)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
        raise MonitorUnanswered(str(error) or type(error).__name__) from None
    except (KeyError, TypeError, AttributeError) as error:
        raise MonitorUnanswered(f"its answer is not a list of waiting jobs ({error})") from None
