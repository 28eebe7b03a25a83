"""Every relative link in README.md and docs/**/*.md (and the HTML report) points at a file or folder that exists."""
import posixpath
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r'\]\(([^)\s]+)\)|(?:src|href)="([^"]+)"')


def _pages():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "docs").rglob("*.html"))]
    return [p for p in pages if p.is_file()]


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """The relative link targets of ``page`` that do not exist under ``root`` (anchors ignored)."""
    text = page.read_text(errors="replace")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # commands in code blocks are not links
    out = []
    for m in LINK.finditer(text):
        target = (m.group(1) or m.group(2)).partition("#")[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:|^/|^<", target):
            continue
        path = posixpath.normpath(posixpath.join(page.parent.relative_to(root).as_posix(), target))
        if not (root / path).exists():
            out.append(target)
    return out


def test_the_checker_finds_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("x")
    page = tmp_path / "docs" / "page.md"
    page.write_text("[ok](there.md#a) [web](https://x.org) [gone](missing.md) ![img](img/a.png)\n```\n[no](code.md)\n```\n")
    assert broken_links(page, tmp_path) == ["missing.md", "img/a.png"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    assert broken_links(page) == []
