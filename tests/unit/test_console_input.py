"""What the console reads from a request before it acts: counts and page numbers from the
query string, and an action's form, its token first (pure)."""

import pytest
from aiohttp import web
from ricochet.monitor.console import form_fields, form_token, query_number


@pytest.mark.parametrize(
    ("query", "least", "expected"),
    [
        ({}, 0, None),
        ({"n": "0"}, 0, 0),
        ({"n": "17"}, 1, 17),
        ({"n": "999999999"}, 0, 999_999_999),
        ({"n": "0"}, 1, "400"),
        ({"n": "\u00b2"}, 0, "400"),  # a digit to str.isdigit()
        ({"n": "\u0663"}, 0, "400"),  # ARABIC-INDIC THREE: a digit to int()
        ({"n": "9" * 5000}, 0, "400"),
        ({"n": "1000000000"}, 0, "400"),
        ({"n": "-1"}, 0, "400"),
        ({"n": " 1"}, 0, "400"),
        ({"n": ""}, 0, "400"),
    ],
)
def test_query_number(query: dict[str, str], least: int, expected: int | str | None) -> None:
    """Whole numbers of up to nine ASCII digits, from least; anything else is a 400 naming it."""
    if expected == "400":
        with pytest.raises(web.HTTPBadRequest) as refused:
            query_number(query, "n", least)
        assert str(refused.value.text).startswith(f"n must be a whole number from {least}")
    else:
        assert query_number(query, "n", least) == expected


@pytest.mark.parametrize(
    ("body", "token"),
    [
        (b"message_id=a&token=abc", "abc"),
        (b"token=a%2Bb&token=second", "a+b"),
        (b"reason=%ff%fe&token=abc", "abc"),  # the rest need not be UTF-8
        (b"\xff\xfe=\x00&token=abc", "abc"),
        (b"message_id=a", None),
        (b"&" * 100 + b"token=abc", None),  # not a console form
        (b"", None),
    ],
)
def test_form_token_reads_any_body(body: bytes, token: str | None) -> None:
    """The token is found in any body, whatever else it holds, and nothing raises."""
    assert form_token(body) == token


def test_form_fields_are_strict() -> None:
    """The fields of a URL-encoded UTF-8 form, the first of each name; a body that is not one
    raises ValueError saying what a form must be."""
    assert form_fields(b"reason=E%3A+caf%C3%A9%0D%0Ax&reason=2&token=t") == {
        "reason": "E: café\r\nx",
        "token": "t",
    }
    for body in [b"reason=%ff", b"reason=\xc3\xa9", b"a=1&" * 20]:
        with pytest.raises(ValueError, match="URL-encoded UTF-8"):
            form_fields(body)
