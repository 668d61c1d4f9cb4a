"""The console against the real broker, given requests it cannot read: a count or page
number that is no small whole number, a form in a charset no codec reads, or not URL-encoded
UTF-8. Each gets a 4xx saying why, never a 500; a form's token is checked before its other
fields are read; none changes the failed queue."""

import aiohttp
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.names import Names

from tests.integration.test_console import TOKEN, console, get, make_copies
from tests.support import depth


async def post_raw(url: str, body: bytes, content_type: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=body, headers={"Content-Type": content_type}, allow_redirects=False
        ) as response,
    ):
        return response.status, await response.text()


@pytest.mark.parametrize(
    "query",
    [
        "replayed=\u00b2",  # a digit to str.isdigit(), not to int()
        "discarded=" + "9" * 5000,  # more digits than int() converts
        "replayed=-1",
        "discarded=",
        "page=0",
        "page=two",
        "page=\u00b2",
        "page=" + "9" * 5000,
    ],
)
async def test_a_query_it_cannot_read_is_a_400(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, query: str
) -> None:
    """A count or page number that is not a small whole number gets 400 saying which."""
    await make_copies(connection, channel, queue_name)
    async with console(queue_name, TOKEN) as base:
        status, text = await get(f"{base}/failed?{query}")
    assert status == 400
    assert query.partition("=")[0] in text
    assert len(text) < 200


URLENCODED = "application/x-www-form-urlencoded"


async def test_a_form_it_cannot_read_is_a_4xx_and_the_token_comes_first(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """A form declared in a charset no codec reads (or any but UTF-8), or of another media type,
    gets a 4xx whoever sends it; a body that is not URL-encoded UTF-8 gets 403 without the token
    and 400 with it. None changes the failed queue."""
    await make_copies(connection, channel, queue_name)
    form = f"message_id=evil&token={TOKEN}".encode()
    async with console(queue_name, TOKEN) as base:
        url = f"{base}/failed/actions/discard"
        for content_type in [
            f"{URLENCODED}; charset=no-such-codec",
            f"{URLENCODED}; charset=latin-1",
            "multipart/form-data; boundary=x",
            "text/plain",
        ]:
            for body in [form, form.replace(TOKEN.encode(), b"wrong-token-123456")]:
                status, text = await post_raw(url, body, content_type)
                assert status in (400, 415), content_type
                assert len(text) < 200
        for body in [b"message_id=%ff%fe&token=", b"message_id=\xff&token="]:
            status, text = await post_raw(url, body + b"wrong-token-123456", URLENCODED)
            assert status == 403, body
            assert "token" in text
            status, text = await post_raw(url, body + TOKEN.encode(), URLENCODED)
            assert status == 400, body
            assert len(text) < 200
    assert await depth(channel, Names(queue_name).failed) == 6
