"""The documentation's relative links lead somewhere: each file exists, each anchor is a heading."""

import re
from pathlib import Path

import pytest

from tests.support import ROOT

DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks, where links and headings mean something."""
    lines: list[str] = []
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the file's headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated heading numbered from -1."""
    seen: dict[str, int] = {}
    for line in prose(path):
        heading = re.match(r"#{1,6} (.+)", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def relative_links(path: Path) -> list[str]:
    return [
        target
        for line in prose(path)
        for target in LINK.findall(line)
        if not re.match(r"[a-z]+:", target)
    ]


def test_anchors_follow_github_rules() -> None:
    """A heading's anchor is what GitHub links to, so the check below accepts no more."""
    assert {"quickstart", "writing-a-handler"} <= anchors(ROOT / "README.md")
    assert "status-at-3-am" in anchors(ROOT / "docs" / "operations.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    """Each relative link names a file that exists and, after `#`, one of its headings."""
    broken = []
    for link in relative_links(doc):
        target, _, anchor = link.partition("#")
        file = (doc.parent / target).resolve() if target else doc
        if not file.exists() or (anchor and anchor not in anchors(file)):
            broken.append(link)
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_docs_are_linked_from_the_readme() -> None:
    """Nothing in docs/ is out of the reader's reach: the README links every file."""
    linked = {
        (ROOT / link.partition("#")[0]).resolve() for link in relative_links(ROOT / "README.md")
    }
    assert set((ROOT / "docs").glob("*.md")) <= linked
