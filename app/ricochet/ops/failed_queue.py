"""Looking at failed copies, and discarding them: `ricochet failed list|show|discard`.

Listing and showing take nothing: they read the failed queue with a scan, which hands every copy
back at its end. Discarding removes the selected copies for good, committed in batches, and logs
each one (message_id, type, reason; never the body).
"""

import asyncio
import base64
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from aio_pika.abc import AbstractConnection, AbstractMessage

from ricochet.delivery.failed import COPIED_PROPERTIES, FailureInfo
from ricochet.headers import FAILED_TRACEBACK
from ricochet.names import Names
from ricochet.ops.scan import Removal, scanning, select
from ricochet.ops.selection import Outcome, Selection

# Properties a copy may carry beyond those it keeps from its job.
SHOWN_PROPERTIES = (*COPIED_PROPERTIES, "delivery_mode", "expiration", "reply_to", "user_id")


def jsonable(value: Any) -> Any:
    """A header or property value as JSON can hold it: bytes as text when they are UTF-8 (else
    base64), times as ISO-8601, decimals as strings, tables and arrays value by value."""
    if isinstance(value, bytes | bytearray):
        text, _ = body_text(bytes(value))
        return text
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def body_text(body: bytes) -> tuple[str, str]:
    """(text, encoding): the body as text when it is UTF-8, else base64; encoding says which."""
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(body).decode("ascii"), "base64"


@dataclass(frozen=True)
class CopyDetails:
    """Everything about one failed copy: its failure, properties, headers and body."""

    failure: FailureInfo
    properties: dict[str, Any]
    headers: dict[str, Any]
    body: str
    body_encoding: str  # "utf-8" or "base64"

    @property
    def traceback(self) -> str | None:
        value = self.headers.get(FAILED_TRACEBACK)
        return None if value is None else str(value)

    @property
    def other_headers(self) -> dict[str, Any]:
        """The headers but the traceback, which is shown on its own."""
        return {k: v for k, v in self.headers.items() if k != FAILED_TRACEBACK}

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.failure.as_dict(),
            "properties": self.properties,
            "headers": self.headers,
            "body": self.body,
            "body_encoding": self.body_encoding,
        }


def printable(message: AbstractMessage) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """A message's shown properties, its headers, its body and the body's encoding, every value
    made printable (pure)."""
    properties = {
        name: jsonable(getattr(message, name))
        for name in SHOWN_PROPERTIES
        if getattr(message, name, None) is not None
    }
    body, encoding = body_text(message.body)
    return properties, jsonable(dict(message.headers or {})), body, encoding


def details_of(message: AbstractMessage, failure: FailureInfo) -> CopyDetails:
    """A copy's details, every value made printable (pure)."""
    return CopyDetails(failure, *printable(message))


async def list_failed(
    connection: AbstractConnection,
    names: Names,
    selection: Selection,
    limit: int | None = None,
    *,
    management_url: str | None = None,
) -> Outcome:
    """The copies that match, in queue order (at most limit); the queue keeps them all."""
    return await select(connection, names, selection, limit=limit, management_url=management_url)


async def show_failed(
    connection: AbstractConnection,
    names: Names,
    message_id: str,
    *,
    management_url: str | None = None,
) -> list[CopyDetails]:
    """Every copy with this message_id, oldest first (usually one); the queue keeps them."""
    found: list[CopyDetails] = []
    async with scanning(connection, names, management_url=management_url) as scan:
        async for copy in scan.copies():
            if copy.failure.message_id == message_id:
                found.append(details_of(copy.message, copy.failure))
    return found


async def discard_failed(
    connection: AbstractConnection,
    names: Names,
    selection: Selection,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    stop: asyncio.Event | None = None,
    management_url: str | None = None,
) -> Outcome:
    """Remove the matching copies for good (with dry_run: list them and remove nothing)."""
    removal = None if dry_run else Removal("discarded")
    return await select(
        connection,
        names,
        selection,
        removal=removal,
        limit=limit,
        stop=stop,
        management_url=management_url,
    )
