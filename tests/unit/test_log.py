"""Secret scrubbing: the password of any URL, and credential query values, are replaced."""

import pytest
from ricochet.log import redact, url_host


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


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://user:s3cret@hooks.example.com/services/T0", "hooks.example.com"),
        ("amqps://u:p@ss@broker/vhost", "broker"),  # a raw @ in the password
        ("http://hooks.example.com/alert", "hooks.example.com"),
        ("http://admin:s3cret@broker:15672/", "broker:15672"),
        ("http://[::1]:15672/api/", "[::1]:15672"),
        ("https://u:s3cret@[2001:db8::7]/", "[2001:db8::7]"),
        ("https://hooks.example.com?token=s3cret&next=http://other/", "hooks.example.com"),
        ("https://hooks.example.com:8443#s3cret", "hooks.example.com:8443"),
        ("hooks.example.com/services/s3cret", "hooks.example.com"),  # no scheme: host first
        ("", ""),
    ],
)
def test_url_host(url: str, host: str) -> None:
    """Only the host and port of a URL are shown: never its credentials, path, query or fragment."""
    assert url_host(url) == host
