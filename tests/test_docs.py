"""The README is the front door (short), and no relative link in it or in the docs pages
points at a file that is not there (mkdocs --strict checks docs/ links too, but only where
the site is built; this runs with the suite)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

README_MAX_LINES = 300

PAGES_FROM_OTHER_BRANCHES = frozenset()
"""Pages the README links to that are written on other branches (each from the README section
it replaces). Until they are merged their links are allowed from the README alone; once one
exists it is checked like any other, so this set can be emptied after the merge."""

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _relative_links(page: Path) -> list[str]:
    """Link targets outside code blocks that are neither URLs nor anchors on the same page."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return [target.split("#", 1)[0] for target in _LINK.findall(text)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to a docs/ page"


def test_every_relative_link_in_the_readme_exists() -> None:
    missing = [t for t in _relative_links(ROOT / "README.md")
               if not (ROOT / t).exists() and t not in PAGES_FROM_OTHER_BRANCHES]
    assert missing == []


def test_every_relative_link_in_the_docs_pages_exists() -> None:
    missing = [f"{page.name}: {t}" for page in sorted(DOCS.glob("*.md")) for t in _relative_links(page)
               if not (page.parent / t).exists()]
    assert missing == []


def test_the_link_check_sees_links() -> None:
    """The checks above are not vacuous: the README links to the tutorial, the docs pages to
    one another, and a code block's brackets are not links."""
    assert "docs/tutorial.md" in _relative_links(ROOT / "README.md")
    assert "language.md" in _relative_links(DOCS / "index.md")
    assert all(" " not in t for page in DOCS.glob("*.md") for t in _relative_links(page))
