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


def test_config_comments_point_at_pages_and_files_that_exist():
    """Every path a shipped config's comment names (docs pages, results files, other configs) exists, and no
    comment sends the reader to a README section (the README is a short landing page)."""
    configs = [REPO / "pivot.yaml", *sorted((REPO / "configs").rglob("*.yaml")), *sorted((REPO / "bench" / "configs").rglob("*.yaml"))]
    missing, readme_sections = [], []
    for path in configs:
        for line in path.read_text().splitlines():
            comment = line.split("#", 1)[1] if "#" in line else ""
            for target in re.findall(r"\b((?:docs|bench|configs)/[\w./-]+\.(?:md|yaml|json|py))", comment):
                if not (REPO / target).exists():
                    missing.append(f"{path.relative_to(REPO)}: {target}")
            if re.search(r"\bREADME\b(?!\.md)", comment):
                readme_sections.append(f"{path.relative_to(REPO)}: {comment.strip()}")
    assert missing == [] and readme_sections == []


def test_every_results_file_is_listed_in_the_benchmarks_page():
    listed = set(re.findall(r"\]\(bench/(RESULTS_[^)]+\.md)\)", (REPO / "docs" / "benchmarks.md").read_text()))
    on_disk = {p.name for p in (REPO / "bench").glob("RESULTS_*.md")}
    assert sorted(on_disk - listed) == [] and sorted(listed - on_disk) == []
