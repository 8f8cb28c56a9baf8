"""An input's `tools:` file: tool schemas given to every record of that input that carries none."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pivot_assets.core.ids import canonical_json, trajectory_id

from .records import RecordError
from .validation import normalize_tools


def load_tools_file(path: str | Path) -> list[dict]:
    """An input's `tools:` file: a JSON list of tool schemas (chat, flat or bare), normalized; ValueError otherwise."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"tools file {path}: cannot read it as JSON ({exc})") from None
    if isinstance(value, dict) and isinstance(value.get("tools"), list):  # {"source": ..., "tools": [...]}
        value = value["tools"]
    try:
        tools = normalize_tools(value)
    except RecordError as err:
        raise ValueError(f"tools file {path}: {str(err).removeprefix(err.category + ': ')}") from None
    if not tools:
        raise ValueError(f"tools file {path}: no tool schemas in it")
    return tools


def with_default_tools(table: pa.Table, tools_by_source: dict[str, list[dict]]) -> pa.Table:
    """Rows whose record had no tools get their input's `tools:` schemas, and the trajectory_id of the content
    they now have (the id is a hash of messages + tools: the same as if the record had carried the schemas)."""
    if not tools_by_source or table.num_rows == 0:
        return table
    if not any(source in tools_by_source for source in pc.unique(table.column("source")).to_pylist()):
        return table
    rows = [fill_default_tools(row, tools_by_source.get(row["source"])) for row in table.to_pylist()]
    return pa.Table.from_pylist(rows, schema=table.schema)


def fill_default_tools(row: dict, tools: list[dict] | None) -> dict:
    """A trajectory row with `tools` filled in (and its ids recomputed) when it has none and `tools` is given."""
    if not tools or row["tools"] not in (None, "", "[]"):
        return row
    old = row["trajectory_id"]
    row["tools"] = canonical_json(tools)
    row["trajectory_id"] = trajectory_id(row["messages"], tools)
    if row["conversation_id"] == old:  # the fallback group key is the trajectory id itself
        row["conversation_id"] = row["trajectory_id"]
    return row
