"""Where doctor's GETs go: the API's base URL, the virtual host and the credentials."""

import base64

import pytest
from ricochet.broker.management import api_url, authorization, vhost


@pytest.mark.parametrize(
    ("amqp_url", "expected"),
    [
        ("amqp://guest:guest@localhost:5672/", "/"),
        ("amqp://localhost", "/"),
        ("amqp://localhost/%2F", "/"),
        ("amqps://u:p@broker/prod", "prod"),
    ],
)
def test_vhost(amqp_url: str, expected: str) -> None:
    """The virtual host is the AMQP URL's path, read the way the AMQP client reads it."""
    assert vhost(amqp_url) == expected


@pytest.mark.parametrize(
    ("management_url", "expected"),
    [
        ("http://localhost:15672/", "http://localhost:15672/api/"),
        ("https://admin:s3cret@broker:15671", "https://broker:15671/api/"),
        ("http://broker/rabbitmq/", "http://broker/rabbitmq/api/"),
    ],
)
def test_api_url_has_no_credentials(management_url: str, expected: str) -> None:
    """The base URL keeps a path prefix and drops the credentials (it appears in messages)."""
    assert api_url(management_url) == expected


def decoded(header: str) -> str:
    return base64.b64decode(header.removeprefix("Basic ")).decode()


def test_credentials_from_the_management_url_else_the_amqp_url() -> None:
    """The management URL's user wins; without one, the AMQP URL's (percent-decoded)."""
    amqp = "amqp://app:p%40ss@broker:5672/"
    assert decoded(authorization("http://admin:s3cret@broker:15672/", amqp)) == "admin:s3cret"
    assert decoded(authorization("http://broker:15672/", amqp)) == "app:p@ss"
    assert decoded(authorization("http://broker:15672/", "amqp://broker/")) == "guest:guest"
