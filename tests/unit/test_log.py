"""Secret scrubbing: the password of any URL, and credential query values, are replaced."""

import pytest

from app.log import redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("amqp://guest:guest@localhost:5672/", "amqp://guest:***@localhost:5672/"),
        ("amqps://u:p@ss@host/vhost", "amqps://u:***@host/vhost"),  # a raw @ in the password
        ("amqp://u:p?#x@host", "amqp://u:***@host"),
        ("amqp://:secret@host/", "amqp://:***@host/"),
        ("amqp://guest@host/", "amqp://guest@host/"),  # no password, nothing to hide
        ("amqp://host/v@x", "amqp://host/v@x"),  # an @ in the path is not user info
        (
            "from amqp://a:one@h1/ to http://b:two@h2/",
            "from amqp://a:***@h1/ to http://b:***@h2/",
        ),
        (
            "OperationalError: postgresql+psycopg://app:hunter2@db:5432/orders failed",
            "OperationalError: postgresql+psycopg://app:***@db:5432/orders failed",
        ),
        (
            "GET https://api.example.com/v1?api_key=abc123&page=2",
            "GET https://api.example.com/v1?api_key=***&page=2",
        ),
        ("/hook?x=1&token=abc123#frag", "/hook?x=1&token=***#frag"),
        ("url='https://h/p?access_token=abc123'", "url='https://h/p?access_token=***'"),
        ("https://h/p?X-Amz-Signature=abc123&sig=def", "https://h/p?X-Amz-Signature=***&sig=***"),
        ("https://h/p?page=2&sort=name", "https://h/p?page=2&sort=name"),  # nothing secret
        ("retry=3 key=value", "retry=3 key=value"),  # not a query string
    ],
)
def test_redact(text: str, expected: str) -> None:
    """Every URL's password becomes ***, up to the last @ before the host; the rest is kept."""
    assert redact(text) == expected
