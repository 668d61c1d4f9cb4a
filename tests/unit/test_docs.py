"""The documentation site (mkdocs.yml): its strict build refuses broken links, its links are
GitHub's, and its settings reference is made from the settings themselves."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from ricochet.settings import Settings, variable_name

from tests.support import ROOT

MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]


def hook(name: str) -> ModuleType:
    """One of the site's hooks (docs/hooks/), imported as MkDocs imports it: by its path."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_setting_is_documented() -> None:
    """The settings reference has a row per setting: its variable in backticks, its default, what
    it allows and a meaning (the field's description)."""
    table = hook("settings_reference").reference().splitlines()
    rows = {row.split(" | ")[0].removeprefix("| "): row.split(" | ")[1:] for row in table[2:]}
    variables = {f"`{variable_name(name)}`" for name in Settings.model_fields}
    assert set(rows) == variables
    for variable, (default, allowed, meaning) in rows.items():
        assert default, variable
        assert allowed, variable
        assert len(meaning.removesuffix(" |")) > 10, variable


def test_the_settings_page_holds_the_settings_table() -> None:
    """docs/settings.md holds the table itself (GitHub shows the page as it is), and it is the
    one the settings make: `python docs/hooks/settings_reference.py` writes it again."""
    reference = hook("settings_reference")
    page = (ROOT / "docs" / "settings.md").read_text()
    assert reference.written(page) == reference.reference()


@pytest.mark.parametrize(
    ("page", "link", "expected"),
    [
        # From docs/: other pages as they are, files outside docs/ at their place in the site.
        ("docs/performance.md", "design.md#topology", "design.md#topology"),
        ("docs/performance.md", "../bench/README.md#enqueueing", "bench/README.md#enqueueing"),
        ("docs/performance.md", "../bench/results/chart.png", "bench/results/chart.png"),
        ("docs/design.md", "../README.md#quickstart", "index.md#quickstart"),
        # From README.md, the home page: docs/ is the site's top.
        ("README.md", "docs/design.md#topology", "design.md#topology"),
        ("README.md", "#how-it-works", "#how-it-works"),
        # From bench/README.md, one level down in the site as in the repository.
        ("bench/README.md", "../docs/performance.md#enqueueing", "../performance.md#enqueueing"),
        ("bench/README.md", "results/chart.png", "results/chart.png"),
        # Not in the site: left alone, for the strict build to report.
        ("docs/design.md", "../app/ricochet/settings.py", "../app/ricochet/settings.py"),
        ("README.md", "https://www.rabbitmq.com/", "https://www.rabbitmq.com/"),
    ],
)
def test_links_lead_where_the_site_has_the_file(page: str, link: str, expected: str) -> None:
    """A link written for GitHub (a path in the repository) is rewritten to the same file's
    place in the site."""
    rewrite = hook("repository").rewrite
    assert rewrite(f"see [it]({link}).", page) == f"see [it]({expected})."


def test_links_in_code_blocks_are_left_alone() -> None:
    rewrite = hook("repository").rewrite
    code = "```md\n[it](../bench/README.md)\n```\n"
    assert rewrite(code + "[it](../bench/README.md)\n", "docs/x.md") == (
        code + "[it](bench/README.md)\n"
    )


def site_sources(target: Path) -> Path:
    """A copy of what the site is built from: mkdocs.yml and the files it reads."""
    shutil.copy2(ROOT / "mkdocs.yml", target)
    shutil.copytree(ROOT / "docs", target / "docs")
    # The files outside docs/ in the site, and the settings, which `make docs` watches.
    for path in [*hook("repository").OUTSIDE, "app/ricochet/settings.py"]:
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, target / path)
    return target


def test_the_strict_build_refuses_broken_links(tmp_path: Path) -> None:
    """A page that is not there, a heading that is not there (in a page of docs/, in the README
    and in bench/README.md) fail the strict build, each named."""
    site = site_sources(tmp_path)
    broken = {
        "README.md": "[a](docs/no-such-page.md)",
        "docs/design.md": "[b](operations.md#no-such-heading)",
        "docs/performance.md": "[c](../bench/README.md#no-such-heading)",
        "bench/README.md": "[d](../docs/design.md#no-such-heading)",
    }
    for path, link in broken.items():
        with (site / path).open("a") as file:
            file.write(f"\n{link}\n")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [*MKDOCS, "--site-dir", str(tmp_path / "site")],
        cwd=site,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert built.returncode != 0
    warnings = [line for line in built.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == len(broken), built.stderr
    for target in ("no-such-page.md", "operations.md", "bench/README.md", "design.md"):
        assert any(target in w for w in warnings), (target, warnings)


def test_headings_get_github_anchors() -> None:
    """The site's anchors are GitHub's (the links are written for both): punctuation dropped,
    each space a hyphen, case lowered."""
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"slugify: !!python/object/apply:pymdownx\.slugs\.slugify", config)
    slugify = importlib.import_module("pymdownx.slugs").slugify(case="lower")
    assert slugify("Status at 3 a.m.", "-") == "status-at-3-am"
    assert slugify("Worker processes: every core", "-") == "worker-processes-every-core"
    assert slugify("A - B", "-") == "a---b"


def test_the_compose_tests_find_the_commands_they_run() -> None:
    """make test-compose runs the README's opening `docker compose up`, the Quickstart's commands
    (docs/getting-started.md) and the operations guide's replays as printed: each reader finds
    them where the text now lives."""
    from tests.compose.stack import quickstart_commands, readme_up, replay_commands

    assert readme_up().startswith("docker compose up ")
    found = quickstart_commands()
    assert any("ricochet publish" in command for command in found)
    assert found[-1].endswith("ricochet status")
    assert len(replay_commands()) == 2


def test_the_readme_is_a_front_page() -> None:
    """At most about 200 lines: what ricochet is, the two commands first, a handler and an
    enqueue, and links into docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert [line.split()[:2] for line in lines[3:5]] == [["docker", "compose"], ["make", "test"]]
