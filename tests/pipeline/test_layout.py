"""The newcomer's map (docs/pipeline.md "Layout") matches the tree: every package folder and every module under
pivot_assets/ and pivot_jobs/ is named there, and nothing named there is missing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY = re.compile(r"^(\s*)([a-z_]+)/\s+(.*)$")


def _layout_block() -> list[str]:
    text = (ROOT / "docs" / "pipeline.md").read_text()
    section = text[text.index("## Layout\n"):]
    return section.split("```\n")[1].splitlines()


def _mapped() -> dict[Path, set[str]]:
    """{folder: the module names its entry lists}, parentheses (descriptions) left out."""
    mapped: dict[Path, str] = {}
    stack: list[tuple[int, Path]] = []
    current = None
    for line in _layout_block():
        entry = ENTRY.match(line)
        if entry and (not stack or len(entry.group(1)) <= stack[-1][0] + 2):
            indent, name, rest = len(entry.group(1)), entry.group(2), entry.group(3)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            current = (stack[-1][1] if stack else ROOT) / name
            stack.append((indent, current))
            mapped[current] = rest
        elif current is not None:
            mapped[current] += " " + line.strip()
    out = {}
    for folder, text in mapped.items():
        if folder.is_relative_to(ROOT / "pivot_assets") or folder.is_relative_to(ROOT / "pivot_jobs"):
            bare = re.sub(r"\([^()]*\)", "", re.sub(r"\([^()]*\)", "", text))  # descriptions, nested once
            out[folder] = [item.strip() for item in bare.split(",")]
    return out


def _tree() -> dict[Path, set[str]]:
    tree = {}
    for pkg in ("pivot_assets", "pivot_jobs"):
        for init in (ROOT / pkg).rglob("__init__.py"):
            folder = init.parent
            tree[folder] = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    return tree


def test_every_package_folder_of_the_tree_is_on_the_map_and_no_other():
    assert sorted(p.relative_to(ROOT) for p in _mapped()) == sorted(p.relative_to(ROOT) for p in _tree())


def test_every_module_is_named_on_the_map_and_every_name_is_a_module():
    mapped, tree = _mapped(), _tree()
    for folder, modules in tree.items():
        where = folder.relative_to(ROOT)
        assert sorted(mapped[folder]) == sorted(modules), (
            f"{where}: the map (docs/pipeline.md Layout) lists {sorted(set(mapped[folder]) - modules)} that are not "
            f"modules there and leaves out {sorted(modules - set(mapped[folder]))}")
