"""The management HTTP API, read with GETs only: the answers doctor's checks read."""

import asyncio
import base64
import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp

from app.checks import JSON, BrokerState, exchange_names, queue_names
from app.errors import ManagementUnavailable
from app.log import url_host
from app.topology import Plan

# Only what the checks read, so the answers stay small on a broker with many queues.
OVERVIEW_COLUMNS = "rabbitmq_version,product_version"
QUEUE_COLUMNS = (
    "name,type,arguments,messages,messages_ready,messages_unacknowledged,consumers,"
    "policy,operator_policy,effective_policy_definition,leader,node"
)
EXCHANGE_COLUMNS = "name,type,arguments"
BINDING_COLUMNS = "source,destination,destination_type,routing_key,properties_key"
PAGE_SIZE = 500  # the API's largest page
TIMEOUT_S = 10


def vhost(amqp_url: str) -> str:
    """The virtual host of an AMQP URL, as the AMQP client reads it ('/' for an empty path)."""
    return unquote(urlsplit(amqp_url).path[1:]) or "/"


def api_url(management_url: str) -> str:
    """The API's base URL without credentials: http://host:15672/api/."""
    parts = urlsplit(management_url)
    return f"{parts.scheme}://{url_host(management_url)}{parts.path.rstrip('/')}/api/"


def authorization(management_url: str, amqp_url: str) -> str:
    """Basic credentials from the management URL, else from the AMQP URL (else guest)."""
    for url in (management_url, amqp_url):
        parts = urlsplit(url)
        if parts.username is not None:
            user, password = unquote(parts.username), unquote(parts.password or "")
            break
    else:
        user, password = "guest", "guest"
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class _Api:
    """GETs against one API base URL; every failure is a ManagementUnavailable."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self._session = session
        self._base = base

    async def get(self, path: str, **params: str | int) -> Any:
        """The decoded JSON answer, or None for 404."""
        url = self._base + path
        try:
            async with self._session.get(url, params=params) as response:
                if response.status == 404:
                    return None
                if response.status in (401, 403):
                    raise ManagementUnavailable(
                        f"the management API at {self._base} refused the credentials "
                        f"(HTTP {response.status}): set RICOCHET_MANAGEMENT_URL with a user "
                        "that has the monitoring or management tag"
                    )
                response.raise_for_status()
                return await response.json()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ManagementUnavailable(
                f"the management API at {self._base} is unreachable ({type(error).__name__}: "
                f"{error}): check RICOCHET_MANAGEMENT_URL and that the management plugin runs"
            ) from None

    async def listing(self, kind: str, vhost: str, name_regex: str, columns: str) -> list[JSON]:
        """Every queue or exchange of the vhost whose name matches, page by page."""
        items: list[JSON] = []
        page = 1
        while True:
            answer = await self.get(
                f"{kind}/{quote(vhost, safe='')}",
                page=page,
                page_size=PAGE_SIZE,
                name=name_regex,
                use_regex="true",
                columns=columns,
            )
            if answer is None:
                raise ManagementUnavailable(
                    f"the broker has no virtual host {vhost!r} (the path of RICOCHET_AMQP_URL)"
                )
            items += answer["items"]
            if page >= answer["page_count"]:
                return items
            page += 1


async def read_state(management_url: str, amqp_url: str, plan: Plan) -> BrokerState:
    """The overview, and the queues, exchanges and bindings of the plan's names as they are."""
    base, vh = api_url(management_url), vhost(amqp_url)
    headers = {"Authorization": authorization(management_url, amqp_url)}
    # The main queue's name and every name under it; the checks pick theirs.
    names = f"^{re.escape(plan.names.queue)}(\\..*)?$"
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        api = _Api(session, base)
        overview, queues, exchanges = await asyncio.gather(
            api.get("overview", columns=OVERVIEW_COLUMNS),
            api.listing("queues", vh, names, QUEUE_COLUMNS),
            api.listing("exchanges", vh, names, EXCHANGE_COLUMNS),
        )
        wanted_queues, wanted_exchanges = set(queue_names(plan)), set(exchange_names(plan))
        ours_q = {q["name"]: q for q in queues if q["name"] in wanted_queues}
        ours_x = {x["name"]: x for x in exchanges if x["name"] in wanted_exchanges}
        v = quote(vh, safe="")
        paths = [
            *(
                f"exchanges/{v}/{quote(x, safe='')}/bindings/{side}"
                for x in ours_x
                for side in ("source", "destination")
            ),
            *(f"queues/{v}/{quote(q, safe='')}/bindings" for q in ours_q),
        ]
        answers = await asyncio.gather(*(api.get(p, columns=BINDING_COLUMNS) for p in paths))
    # A binding between two of ricochet's names is listed at both ends.
    unique = {
        (b["source"], b["destination"], b["destination_type"], b["properties_key"]): b
        for answer in answers
        for b in answer or []
    }
    return BrokerState(base, vh, overview or {}, ours_q, ours_x, list(unique.values()))
