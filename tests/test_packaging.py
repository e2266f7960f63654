"""The package as people adopt it: one version (``trioq.__version__``) that the installed
metadata, ``trioq --version`` and the newest release of CHANGELOG.md all say; the licence
declared and shipped; every documentation page in the site's nav (mkdocs.yml).

The built sdist and wheel themselves are checked by .ci/run (``python -m build``,
``twine check --strict``, ``trioq demo`` from the wheel in a clean virtualenv, and
.ci/check_dist.py on their file lists)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from clitool import trioq_cli

import trioq

ROOT = Path(__file__).parent.parent
#: A version heading of CHANGELOG.md: ``## [Unreleased]`` or ``## [1.2.3] - 2026-12-02``.
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$", re.M)


def releases(text: str) -> list[tuple[str, str | None]]:
    """CHANGELOG.md's version headings, newest first, as (version, date)."""
    return [(found["version"], found["date"]) for found in HEADING.finditer(text)]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_the_installed_metadata_says_the_package_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", trioq.__version__), trioq.__version__
    assert importlib.metadata.version("trioq") == trioq.__version__


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "trioq.__version__"
    init = (ROOT / "trioq" / "__init__.py").read_text()
    assert re.findall(r"^__version__ = \"(.+)\"$", init, re.M) == [trioq.__version__]


def test_the_command_line_says_the_package_version() -> None:
    out = trioq_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"trioq {trioq.__version__}"


def test_the_changelog_s_newest_release_is_the_package_version() -> None:
    found = releases((ROOT / "CHANGELOG.md").read_text())
    assert found[0] == ("Unreleased", None), "CHANGELOG.md opens with ## [Unreleased]"
    released = found[1:]
    assert released, "CHANGELOG.md has no released version"
    for version, date in released:
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        assert date is not None, f"## [{version}] has no date (## [{version}] - YYYY-MM-DD)"
    versions = [version for version, _ in released]
    assert versions == sorted(versions, key=version_key, reverse=True), "newest first"
    assert len(set(versions)) == len(versions), "a version twice"
    assert versions[0] == trioq.__version__, (
        f"CHANGELOG.md's newest release is {versions[0]}, the package is {trioq.__version__}: "
        "a version bump moves the Unreleased entries under a heading of the new version"
    )


def test_the_parse_of_the_changelog() -> None:
    text = "# C\n\n## [Unreleased]\n\n- x\n\n## [0.10.0] - 2027-01-02\n\n## [0.9.1] - 2026-12-31\n"
    assert releases(text) == [
        ("Unreleased", None), ("0.10.0", "2027-01-02"), ("0.9.1", "2026-12-31")
    ]
    assert version_key("0.10.0") > version_key("0.9.1")


def test_the_licence_is_declared_and_shipped() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    metadata = importlib.metadata.metadata("trioq")
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]


def test_every_documentation_page_is_in_the_site_s_nav() -> None:
    """mkdocs.yml lists every page by hand (Getting started, Guides, Operations, Reference);
    a new docs/*.md needs its line there. (``mkdocs build --strict`` in .ci/run refuses one
    that is not, too; this says so without mkdocs installed.)"""
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r"^\s*- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", config, re.M))
    pages = {path.relative_to(ROOT / "docs").as_posix() for path in (ROOT / "docs").rglob("*.md")}
    assert sorted(pages - listed) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(listed - pages) == [], "mkdocs.yml's nav lists pages that do not exist"
