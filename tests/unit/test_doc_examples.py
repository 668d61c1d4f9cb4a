"""The documentation's examples are the files the integration tests run, shown as they are."""

import re
from pathlib import Path

import pytest

from tests.support import ROOT

EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.*"))
BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# A page includes a file with pymdownx.snippets: --8<-- "docs/examples/name.py".
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)


def shown(example: Path) -> bool:
    """A page of docs/ includes the file (the site builds it in), or README.md, which GitHub
    shows as it is, holds it word for word in a code block."""
    included = {
        ROOT / path
        for page in (ROOT / "docs").glob("*.md")
        for path in SNIPPET.findall(page.read_text())
    }
    return example in included or example.read_text() in BLOCK.findall(
        (ROOT / "README.md").read_text()
    )


def test_every_example_is_run_by_a_test() -> None:
    tests = "".join(path.read_text() for path in (ROOT / "tests" / "integration").glob("*.py"))
    assert EXAMPLES
    for example in EXAMPLES:
        assert example.name in tests or example.stem in tests, example.name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_the_docs_show_the_example_as_it_is(example: Path) -> None:
    assert shown(example), f"no page includes {example.relative_to(ROOT)}"


def test_every_included_file_is_an_example() -> None:
    """What the pages include is a file the tests run, never another copy."""
    for page in (ROOT / "docs").glob("*.md"):
        for path in SNIPPET.findall(page.read_text()):
            assert ROOT / path in EXAMPLES, f"{page.name} includes {path}"
