"""What the README's install commands give: the quick start's install has everything its
commands use (`-n` included), and every extra the README or an error message names exists."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def _quick_start_extras() -> list[str]:
    """The extras of the README's first install command (the quick start's)."""
    found = re.search(r'pip install -e "\.\[([a-z,-]+)\]"', README)
    assert found, "the README's quick start has no `pip install -e \".[...]\"`"
    return found.group(1).split(",")


def test_the_quick_starts_install_gives_parallel_workers():
    """`pytest suites -n 2` (the README's own example) works after the quick start."""
    extras = PROJECT["optional-dependencies"]
    given = _names(PROJECT["dependencies"])
    for extra in _quick_start_extras():
        given |= _names(extras[extra])
    assert "pytest-xdist" in given
    assert "pytest suites -n 2" in README


def test_every_extra_the_readme_and_the_docs_name_exists():
    extras = set(PROJECT["optional-dependencies"])
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        named = {e for group in re.findall(r'\.\[([a-z0-9,-]+)\]', text)
                 for e in group.split(",")}
        assert named <= extras, (page.name, named - extras)
    assert re.findall(r'\.\[([a-z,-]+)\]', README)


def test_every_header_the_recipes_name_is_package_data():
    """A built wheel holds every header the build recipes put on a compiler's include path
    (the HIP->CUDA header and RCCL's declarations are in folders below include/)."""
    import fnmatch

    import tomllib

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["pytest_commbench"]
    package = root / "pytest_commbench"
    for header in (package / "include").rglob("*.h"):
        rel = header.relative_to(package).as_posix()
        assert any(fnmatch.fnmatchcase(rel, p) and rel.count("/") == p.count("/")
                   for p in patterns), f"{rel} is not package data"
