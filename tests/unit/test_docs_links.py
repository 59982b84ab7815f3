"""Every link between the README and docs/ lands: the file exists, and a
#fragment names a heading of it (as GitHub makes anchors of headings)."""
import glob
import os
import re

from tests.conftest import ROOT

PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: str) -> set[str]:
    """GitHub's anchors: lower case, punctuation but - and _ dropped,
    spaces to -, a repeated heading numbered."""
    out: set[str] = set()
    with open(path) as f:
        text = FENCE.sub("", f.read())
    for heading in re.findall(r"^#+\s+(.*?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


def broken_links(page: str) -> list[str]:
    with open(page) as f:
        text = FENCE.sub("", f.read())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(where):
            broken.append(f"{target}: no such file")
        elif fragment and where.endswith(".md") and fragment not in anchors(where):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_link_of_the_readme_and_docs_lands():
    found = {os.path.relpath(p, ROOT): broken_links(p) for p in PAGES}
    assert {page: links for page, links in found.items() if links} == {}


def test_the_checker_sees_a_broken_link_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n## Two words\n[x](b.md) [y](#two-words) [z](#nope)\n"
                                   "```\n[not a link](c.md)\n```\n")
    assert broken_links(str(tmp_path / "a.md")) == ["b.md: no such file", "#nope: no such heading"]
