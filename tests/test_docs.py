"""The README stays a short front page, and the Markdown pages' relative links and anchors all resolve.

Links are read with markdown-it-py (CommonMark), so text inside code spans and fenced blocks is never taken
for a link; anchors are GitHub's heading slugs, the ones its rendering of these pages produces.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200          # issue 22 item 7: the README keeps the front page; the reference lives in docs/
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MD = MarkdownIt("commonmark").enable("table")


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a Markdown page, repeated headings numbered as GitHub does (-1, -2, ...)."""
    tokens, seen, out = _MD.parse(text), Counter(), set()
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type == "heading_open":
            plain = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
            slug = github_slug(plain)
            out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return out


def links(text: str) -> list[str]:
    """The targets of every link and image in a Markdown page (code spans and blocks are not links)."""
    found = []
    for token in _MD.parse(text):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(child.attrGet("href"))
            elif child.type == "image":
                found.append(child.attrGet("src"))
    return found


def broken_links(page: Path) -> list[str]:
    """Relative links of a page whose file is missing, or whose '#anchor' names no heading of that file."""
    problems = []
    for href in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.I):          # http:, https:, mailto: ... not checked here
            continue
        path, _, anchor = href.partition("#")
        target = (page.parent / unquote(path)).resolve() if path else page
        if not target.exists():
            problems.append(f"{href}: no file {target}")
        elif anchor and target.suffix == ".md" and unquote(anchor) not in anchors(target.read_text()):
            problems.append(f"{href}: no heading with anchor #{anchor} in {target.name}")
    return problems


def test_the_readme_stays_under_200_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n < README_MAX_LINES, f"README.md has {n} lines; move the detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / h.partition("#")[0]).resolve() for h in links((ROOT / "README.md").read_text())}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    """The checker itself: a good link passes, a missing file, a missing anchor and a missing local anchor fail."""
    (tmp_path / "other.md").write_text("# Other page\n\n## Does it work? `python -m x --y`\n\n## Same\n\n## Same\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#does-it-work-python--m-x---y) [ok](other.md#same-1) [ok](#page)\n"
                    "[gone](missing.md) [bad](other.md#nowhere) [bad](#nowhere) [web](https://example.org/x)\n\n"
                    "```\n[not a link](missing-too.md)\n```\n`[nor this](missing-three.md)`\n")
    problems = broken_links(page)
    assert len(problems) == 3, problems
    assert problems[0].startswith("missing.md: no file")
    assert problems[1] == "other.md#nowhere: no heading with anchor #nowhere in other.md"
    assert problems[2] == "#nowhere: no heading with anchor #nowhere in page.md"


DATE = re.compile(r"\b(19|20)\d\d-\d\d-\d\d\b|\b(January|February|March|April|May|June|July|August|September|October|"
                  r"November|December) \d{4}\b")
DURATION = re.compile(r"\b\d+(\.\d+)? ?(s|sec|seconds?|min|minutes?|hours?)\b")


def test_the_readme_is_a_front_page_not_a_log():
    """Issue 51 item 5: no date and no list of measured durations (those live in docs/testing.md and CI's output);
    a sentence of expected time per command is all (at most one number of minutes for each of the few commands that
    state one)."""
    text = (ROOT / "README.md").read_text()
    assert not DATE.search(text), f"README.md has a date: {DATE.search(text).group(0)!r}"
    durations = [m.group(0) for m in DURATION.finditer(text)]
    assert len(durations) <= 3, f"README.md lists measured durations: {durations}; move them to docs/testing.md"


def test_the_readme_shows_an_adapter_in_code():
    text = (ROOT / "README.md").read_text()
    assert "```python" in text and "class " in text.split("```python", 1)[1].split("```", 1)[0]
