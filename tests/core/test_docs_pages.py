"""The README stays a five-minute read and points only at pages and files that exist; every docs page is in the
site's nav (mkdocs build --strict, run by `make test`, checks the links inside docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets and [t for t in targets if t and not (REPO / t).exists()] == []


def test_every_docs_page_is_in_the_nav():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!python", "#"))["nav"]

    def pages(item):
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for v in item.values():
                yield from pages(v)
        else:
            for v in item:
                yield from pages(v)

    listed = set(pages(nav))
    assert {p.name for p in (REPO / "docs").glob("*.md")} <= listed
