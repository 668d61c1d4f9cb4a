"""Secret scrubbing: the password of any URL in a log value is replaced, whatever it holds."""

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
    ],
)
def test_redact(text: str, expected: str) -> None:
    """Every URL's password becomes ***, up to the last @ before the host; the rest is kept."""
    assert redact(text) == expected
