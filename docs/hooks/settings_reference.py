"""The settings reference of docs/settings.md, made from ricochet.settings.Settings: written into
the page (`python docs/hooks/settings_reference.py`), so that GitHub shows it too, and checked as
the site is built (an MkDocs hook: a page whose table is not the settings' fails the build).

Each row is a field's variable, its default, what it allows (the words an invalid value's error
message uses) and its description. The rows are those `ricochet settings` prints
(ricochet.ops.reference).
"""

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page
from ricochet.ops.reference import setting_rows

PAGE = "settings.md"
# The table stands between these lines in docs/settings.md.
TABLE = re.compile(r"(<!-- settings table -->\n)(.*?)(<!-- /settings table -->\n)", re.DOTALL)


def written(markdown: str) -> str:
    """The table the page holds."""
    found = TABLE.findall(markdown)
    if len(found) != 1:
        raise ValueError(f"{PAGE} has {len(found)} places for the settings table, not one")
    return str(found[0][1])


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri == PAGE and written(markdown) != reference():
        raise ValueError(f"{PAGE}'s table is not the settings': run {Path(__file__).name}")
    return markdown


def reference() -> str:
    """Every setting as a Markdown table: variable, default, allowed, meaning."""
    rows = [
        "| variable | default | allowed | meaning |",
        "|---|---|---|---|",
    ]
    for row in setting_rows():
        default = "unset" if row.default is None else f"`{row.default}`"
        cells = (f"`{row.variable}`", default, row.allowed, row.meaning)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    page = Path(__file__).resolve().parent.parent / PAGE
    text = page.read_text()
    written(text)  # one place for it
    page.write_text(TABLE.sub(lambda found: found[1] + reference() + found[3], text))
