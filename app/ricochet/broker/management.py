"""The management HTTP API, read with GETs only: what doctor checks, and what a start must know
before it deletes a quorum tier."""

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp

from ricochet.errors import ManagementUnavailable
from ricochet.log import url_host
from ricochet.settings import variable_name

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


class Api:
    """GETs against one API base URL; every failure is a ManagementUnavailable."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self._session = session
        self.base = base

    async def get(self, path: str, **params: str | int) -> Any:
        """The decoded JSON answer, or None for 404."""
        url = self.base + path
        try:
            async with self._session.get(url, params=params) as response:
                if response.status == 404:
                    return None
                if response.status in (401, 403):
                    raise ManagementUnavailable(
                        f"the management API at {self.base} refused the credentials "
                        f"(HTTP {response.status}): set {variable_name('management_url')} with "
                        "a user that has the monitoring or management tag"
                    )
                response.raise_for_status()
                return await response.json()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ManagementUnavailable(
                f"the management API at {self.base} is unreachable ({type(error).__name__}: "
                f"{error}): check {variable_name('management_url')} and that the management "
                "plugin runs"
            ) from None

    async def listing(
        self, kind: str, vhost: str, name_regex: str, columns: str
    ) -> list[dict[str, Any]]:
        """Every queue or exchange of the vhost whose name matches, page by page."""
        items: list[dict[str, Any]] = []
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
                    f"the broker has no virtual host {vhost!r} "
                    f"(the path of {variable_name('amqp_url')})"
                )
            items += answer["items"]
            if page >= answer["page_count"]:
                return items
            page += 1

    async def queue(self, vhost: str, name: str, columns: str) -> dict[str, Any] | None:
        """One queue's object, or None when it does not exist."""
        answer: dict[str, Any] | None = await self.get(
            f"queues/{quote(vhost, safe='')}/{quote(name, safe='')}", columns=columns
        )
        return answer

    async def policies(self, vhost: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The vhost's policies and operator policies, as defined now (the policymaker tag reads
        the first, administrator the second)."""
        found = [
            await self.get(f"{kind}/{quote(vhost, safe='')}")
            for kind in ("policies", "operator-policies")
        ]
        if not all(isinstance(listed, list) for listed in found):
            raise ManagementUnavailable(f"the management API lists no policies of {vhost!r}")
        return found[0], found[1]


@asynccontextmanager
async def open_api(management_url: str, amqp_url: str) -> AsyncIterator[Api]:
    """A session on the API, with the credentials of the management URL or the AMQP URL."""
    headers = {"Authorization": authorization(management_url, amqp_url)}
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        yield Api(session, api_url(management_url))
