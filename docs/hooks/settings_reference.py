"""MkDocs hook: the settings reference, made from ricochet.settings.Settings as the site is built.

Each row is a field's variable, its default, what it allows (the words an invalid value's error
message uses) and its description, so the table cannot drift from the code.
"""

import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page
from pydantic.fields import FieldInfo
from ricochet.settings import ENV_PREFIX, Settings, allowed

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
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise ValueError(f"Settings.{name} has no description: its meaning in the docs")
        cells = (f"`{ENV_PREFIX}{name.upper()}`", default(field), allowed(field), field.description)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def default(field: FieldInfo) -> str:
    """A field's default as a user would write it; unset when it has none."""
    value = field.default
    if value is None:
        return "unset"
    return f"`{written(value)}`"


def written(value: object) -> str:
    """A value as its variable would hold it: 300 for 300.0, a list comma-separated."""
    if isinstance(value, tuple):
        return ",".join(map(written, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
