"""The settings reference: every setting's variable, default, what it allows and its meaning,
made from the fields of ricochet.settings.Settings. `ricochet settings` prints it, and the
documentation site's settings page is built from it (docs/hooks/settings_reference.py)."""

import re
import textwrap
from dataclasses import asdict, dataclass

from ricochet.settings import Settings, allowed, variable_name

# A Markdown link of a description, [text](page.md#part): a terminal shows its text.
_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")


@dataclass(frozen=True)
class SettingRow:
    """One setting as the reference states it (default None: unset)."""

    variable: str
    default: str | None
    allowed: str
    meaning: str

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def written(value: object) -> str:
    """A value as its variable would hold it: 300 for 300.0, a list comma-separated."""
    if isinstance(value, tuple):
        return ",".join(map(written, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def setting_rows() -> list[SettingRow]:
    """Every setting, in the order settings.py declares them; ValueError for a field without
    a description (its meaning)."""
    rows = []
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise ValueError(f"Settings.{name} has no description: its meaning in the reference")
        default = None if field.default is None else written(field.default)
        rows.append(SettingRow(variable_name(name), default, allowed(field), field.description))
    return rows


def settings_text(rows: list[SettingRow], width: int = 100) -> str:
    """The reference for a terminal: per setting, its variable and default, then what it allows
    and what it means, indented; a link of the documentation shows as its text."""
    blocks = []
    for row in rows:
        default = "unset" if row.default is None else row.default
        lines = [f"{row.variable}  (default: {default})"]
        for part in (f"allowed: {row.allowed}", _LINK.sub(r"\1", row.meaning)):
            lines += textwrap.wrap(part, width, initial_indent="    ", subsequent_indent="    ")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
