"""The documentation's links hold: README.md, ARCHITECTURE.md and every page in docs/.

The README is one screen and points into docs/ for everything else, so a renamed heading or
a moved page would leave a newcomer at a dead link. Every relative link must name a file that
exists, and every `#anchor` a heading of that file (GitHub's slug rules). No JAX needed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    text = _CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links_of(page: Path) -> list[str]:
    text = _CODE_BLOCK.sub("", page.read_text(encoding="utf-8"))
    return [m.group(1) for m in _LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for link in links_of(page):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        target_text, _, anchor = link.partition("#")
        target = (page.parent / target_text).resolve() if target_text else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors_of(target):
            broken.append(f"{link}: no heading #{anchor} in {target.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_readme_is_one_screen_with_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = readme.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line for line in first_block.splitlines() if line.strip()]
    assert len(commands) == 2
    assert "pallas-check run samples/" in commands[0]
    assert "python -m pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    test_command = commands[1].split("#", 1)[0].strip()
    assert test_command in ci, "CI must run exactly the README's test command"
    assert len(readme.splitlines()) <= 120


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    linked = {Path(link.partition("#")[0]).name for link in links_of(ROOT / "README.md")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"not linked from README.md: {sorted(pages - linked)}"
