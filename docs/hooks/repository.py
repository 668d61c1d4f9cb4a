"""MkDocs hook: repository files outside docs/ that are part of the site.

The pages link to each other as GitHub shows them, by their paths in the repository
(`../bench/README.md#enqueueing` from docs/performance.md, `docs/design.md` from README.md).
The site has these files too, at the paths below; each link from a page is rewritten to the
page it leads to in the site, and `mkdocs build --strict` then checks that it exists, anchor and
all.
"""

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

DOCS = "docs"
# Repository path -> path in the site. README.md is the home page, so the front page on GitHub
# and the site's are one text.
OUTSIDE = {
    "README.md": "index.md",
    "bench/README.md": "bench/README.md",
    "bench/results/chart.png": "bench/results/chart.png",
}
# An inline link or image: [text](target) or ![alt](target).
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    root = Path(config.config_file_path).parent
    for source, target in OUTSIDE.items():
        files.append(File.generated(config, target, abs_src_path=str(root / source)))
    return files


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    return rewrite(markdown, repository_path(page.file.src_uri))


def repository_path(site_path: str) -> str:
    """Where the repository keeps the file the site has at site_path."""
    outside = {target: source for source, target in OUTSIDE.items()}
    return outside.get(site_path, posixpath.join(DOCS, site_path))


def site_path(path: str) -> str | None:
    """Where the site has the repository's file at path, or None when it has no such file."""
    if path in OUTSIDE:
        return OUTSIDE[path]
    if path.startswith(DOCS + "/"):
        return path.removeprefix(DOCS + "/")
    return None


def rewrite(markdown: str, page: str) -> str:
    """The page's Markdown (page is its repository path) with each relative link that leads to
    a file of the site made relative to where the site has the page; code blocks untouched."""
    here = posixpath.dirname(site_path(page) or page)

    def relink(m: re.Match[str]) -> str:
        target, hash_, anchor = m[2].partition("#")
        if not target or re.match(r"[a-z]+:", target):
            return m[0]
        found = site_path(posixpath.normpath(posixpath.join(posixpath.dirname(page), target)))
        if found is None:
            return m[0]  # not in the site: left for the strict build to report
        return f"{m[1]}{posixpath.relpath(found, here or '.')}{hash_}{anchor}{m[3]}"

    parts = FENCE.split(markdown)
    # split() keeps each fence marker: text, marker, code, marker, text, ...
    out, fenced = [], False
    for part in parts:
        if FENCE.fullmatch(part):
            fenced = not fenced
            out.append(part)
        else:
            out.append(part if fenced else LINK.sub(relink, part))
    return "".join(out)
