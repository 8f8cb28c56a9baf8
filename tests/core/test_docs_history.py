"""README.md and docs/ state the present: what the code does and what was measured. History (renames, what changed,
what was slower before) belongs in CHANGELOG.md and git log; these phrasings on a user page fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
USER_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
HISTORY = re.compile("|".join(f"(?:{p})" for p in (
    r"used to (?:fail|be|run|take)",
    r"no longer (?:does|fails|runs|needs|has)",
    r"kept for the record",
    r"on the way",
    r"this time",
    r"(?:not|never) (?:been )?run on a GPU here",
    r"no GPU (?:machine )?was (?:available|lent)",
    r"went from",
    r"was fixed",
    r"before this (?:design|change|scheme)",
    r"(?:^|[.!?:]\s+)Earlier\b",
    r"from before",
    r"not reached here",
    r"this shared machine",
    r"goal is not met",
    r"`[^`\n]+` is gone|\b(?:key|option|field) is gone",
    r"\bretired\b",
    r"the old (?:cap|loop|key|name|rule|N-step|\d+-step)",
)), re.IGNORECASE | re.MULTILINE)


def history_lines(text: str) -> list[str]:
    return [f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in HISTORY.finditer(text)]


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda p: p.name)
def test_no_user_page_tells_history(page: Path):
    assert history_lines(page.read_text()) == []


@pytest.mark.parametrize("phrase", [
    "The check used to fail on S3.", "It no longer runs twice.", "Kept for the record.", "`ablation.steps` is gone;",
    "It has not run on a GPU here.", "No GPU machine was available.", "Ray went from 2.4x to 1x.",
    "Earlier, smaller runs could not decide.", "The table is from before the cache.", "1.5x was not reached here",
    "on this shared machine", "the 12-minute goal is not met", "the old 8-step cap", "Those keys are retired.",
    "a warehouse written before this scheme",
])
def test_the_check_catches_each_phrasing(phrase: str):
    assert history_lines(phrase)


def test_the_changelog_holds_dated_keep_a_changelog_entries():
    text = (REPO / "CHANGELOG.md").read_text()
    entries = re.findall(r"^## \[[^\]]+\] - (\d{4}-\d{2}-\d{2})$", text, re.M)
    assert entries and entries == sorted(entries, reverse=True)
    assert re.search(r"^### (?:Added|Changed|Removed)$", text, re.M)
