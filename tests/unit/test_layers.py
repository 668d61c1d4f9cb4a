"""The package's layers: no module imports from a layer above its own (docs/design.md)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "app" / "ricochet"
# Bottom to top; a module may import from its own layer and the layers below it.
LAYERS = [
    {"backoff", "errors", "headers", "log", "settings", "tracing"},
    {"broker"},
    {"delivery"},
    {"handlers"},
    {"client"},
    {"observe"},
    {"service"},
    {"worker", "ops"},
    {"monitor"},
    {"cli", "__init__", "__main__"},
]


def layer_of(part: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if part in names)


def part_of(path: Path) -> str:
    """The first name below the package: a sub-package or a top-level module."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_parts(path: Path) -> set[str]:
    parts: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = node.module.split(".")
            if names[0] == "ricochet":
                parts.add(names[1] if len(names) > 1 else node.names[0].name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names = alias.name.split(".")
                if names[0] == "ricochet" and len(names) > 1:
                    parts.add(names[1])
    return parts


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_has_a_layer() -> None:
    """A new sub-package or top-level module is given its place in the layers."""
    for path in MODULES:
        layer_of(part_of(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_up(path: Path) -> None:
    own = layer_of(part_of(path))
    above = {part for part in imported_parts(path) if layer_of(part) > own}
    assert not above, f"{path.relative_to(PACKAGE)} imports from a layer above it: {above}"


def test_no_top_level_app_package() -> None:
    """The import package is ricochet; nothing named app is installed beside it."""
    assert not (PACKAGE.parent / "__init__.py").exists()
    assert not (PACKAGE.parent / "app.py").exists()
