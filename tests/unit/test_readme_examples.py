"""The README's enqueueing examples are the files the integration tests run, word for word."""

import re
from pathlib import Path

import pytest

from tests.support import ROOT

EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.*"))
BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_every_example_is_run_by_a_test() -> None:
    tests = (ROOT / "tests" / "integration" / "test_producers.py").read_text()
    assert EXAMPLES
    for example in EXAMPLES:
        assert example.name in tests or example.stem in tests, example.name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_the_readme_shows_the_example_as_it_is(example: Path) -> None:
    blocks = BLOCK.findall((ROOT / "README.md").read_text())
    assert example.read_text() in blocks
