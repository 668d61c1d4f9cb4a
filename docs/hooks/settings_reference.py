"""MkDocs hook: the settings reference, made from ricochet.settings.Settings as the site is built.

Each row is a field's variable, its default, what it allows (the words an invalid value's error
message uses) and its description, so the table cannot drift from the code. The rows are those
`ricochet settings` prints (ricochet.ops.reference).
"""

import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page
from ricochet.ops.reference import setting_rows

PAGE = "settings.md"
# The table takes the place of what stands between these lines in docs/settings.md.
TABLE = re.compile(r"<!-- settings table -->\n.*?<!-- /settings table -->\n", re.DOTALL)


def on_page_markdown(markdown: str, *, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    table, found = TABLE.subn(lambda _: reference(), markdown)
    if found != 1:
        raise ValueError(f"{PAGE} has {found} places for the settings table, not one")
    return table


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
