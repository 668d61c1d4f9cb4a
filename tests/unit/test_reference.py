"""The settings reference that `ricochet settings` prints and the documentation's settings page
shows: made from the fields of Settings, in words a terminal reads."""

import json

import pytest
from click.testing import CliRunner
from ricochet.cli import main
from ricochet.ops.reference import SettingRow, setting_rows, settings_text, written
from ricochet.settings import Settings, variable_name


@pytest.mark.parametrize(
    ("value", "shown"),
    [(300.0, "300"), (2.5, "2.5"), (0.0, "0"), (("exhausted",), "exhausted"), ((1, 2), "1,2")],
)
def test_defaults_are_shown_as_a_variable_holds_them(value: object, shown: str) -> None:
    assert written(value) == shown


def test_a_row_per_setting_with_its_meaning() -> None:
    """Every field of Settings, by its variable, with its default and description."""
    rows = {row.variable: row for row in setting_rows()}
    assert list(rows) == [variable_name(name) for name in Settings.model_fields]
    assert rows["RICOCHET_PREFETCH"] == SettingRow(
        "RICOCHET_PREFETCH",
        "32",
        "1-65535",
        "unacked deliveries, so concurrent jobs, of each worker process",
    )
    assert rows["RICOCHET_ALERT_WEBHOOK_URL"].default is None


def test_the_text_shows_a_links_words_and_unset() -> None:
    row = SettingRow("RICOCHET_X", None, "1-2", "see [Worker processes](deploying.md#worker)")
    assert settings_text([row]) == (
        "RICOCHET_X  (default: unset)\n    allowed: 1-2\n    see Worker processes"
    )


def test_ricochet_settings_prints_every_setting() -> None:
    """`ricochet settings` names each variable, `--json` gives the rows; neither reads the
    environment, so an invalid setting does not stop them."""
    runner = CliRunner(env={"RICOCHET_PREFETCH": "0"})
    text = runner.invoke(main, ["settings"])
    assert text.exit_code == 0, text.output
    for name in Settings.model_fields:
        assert f"{variable_name(name)}  (default: " in text.output
    as_json = runner.invoke(main, ["settings", "--json"])
    assert as_json.exit_code == 0
    assert json.loads(as_json.output) == [row.as_dict() for row in setting_rows()]


def test_the_help_points_to_ricochet_settings() -> None:
    """`ricochet --help` sends a reader to the settings it prints, not to a file of the
    repository that an installed package does not have."""
    words = " ".join(CliRunner().invoke(main, ["--help"]).output.split())
    assert "`ricochet settings` lists them" in words
    assert "docs/settings.md" not in words
