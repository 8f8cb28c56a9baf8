"""Turn extraction: one row per assistant message of every trajectory (Dagster-free).

A turn is (state = every message before an assistant message, plus the trajectory's tools; action = that
assistant message as an action of core/shapes.py). The state is never copied per turn: `state_for_turn` (Python) and
the `turn_state` / `turn_state_of` DuckDB macros (sql/turn_macros.sql) rebuild it from
`trajectories.messages[:message_index]`, so storage grows linearly with trajectory length.

Rules (the same in both paths; the ingest-side rules are in ingest/formats/' docstrings):
  - every assistant message is a turn, including consecutive and trailing ones;
  - turn_index = number of assistant messages before it in the trajectory (0-based);
  - action: tool calls win over text (schema.action_from_message): 1 call -> tool_call, >1 -> tool_call_batch,
    none -> message with the content ("" when None); reasoning is never part of the action; a call's
    `acceptable` (BFCL's accepted values) is part of its function_call (the verifier's, never a model's input);
  - expert_action = schema.canonical_json(action) (sorted keys, no spaces, UTF-8 kept);
  - tool_names = the called tools' names in call order ([] for a message).

`extract_turns` is the plain-Python reference; `extract_turns_parquet` is the fast path: one streaming DuckDB
`COPY (SELECT ... unnest ...) TO parquet` whose memory is bounded by DuckDB's vector/row-group size, not by the
input. Tests check that both produce identical rows.
"""

from __future__ import annotations

import os
from pathlib import Path

from pivot_assets.core.catalog import SQL_DIR
from pivot_assets.core.ids import canonical_json, turn_id
from pivot_assets.core.shapes import action_from_message, action_tool_names, rebuild_state

state_for_turn = rebuild_state  # (messages, message_index) -> the messages before the turn's assistant message


def extract_turns(traj: dict) -> list[dict]:
    """The reference: one TURNS_SCHEMA row per assistant message of a canonical trajectory row."""
    rows = []
    turn_index = 0
    for message_index, message in enumerate(traj["messages"]):
        if message["role"] != "assistant":
            continue
        kind, action = action_from_message(message)
        rows.append(
            {
                "turn_id": turn_id(traj["trajectory_id"], message_index),
                "trajectory_id": traj["trajectory_id"],
                "domain": traj["domain"],
                "message_index": message_index,
                "turn_index": turn_index,
                "action_kind": kind,
                "expert_action": canonical_json(action),
                "tool_names": action_tool_names(action),
            }
        )
        turn_index += 1
    return rows


# DuckDB's to_json escapes strings exactly like Python's json.dumps(ensure_ascii=False) except for the hex case
# of \u00XX escapes (DuckDB writes \u001F, Python \u001f). Only 9 control characters have hex letters; a text
# holding one (rare) gets them lowercased: escaped backslash pairs are parked on chr(1) first (to_json output
# never holds a raw control character), so only real escapes are touched.
_UPPER_HEX_ESCAPES = ["\\u000B", "\\u000E", "\\u000F"] + [f"\\u001{c}" for c in "ABCDEF"]


def _lowercase_escapes_sql(column: str) -> str:
    expr = f"replace({column}, '\\\\', chr(1))"
    for esc in _UPPER_HEX_ESCAPES:
        expr = f"replace({expr}, '{esc}', '{esc.lower()}')"
    expr = f"replace({expr}, chr(1), '\\\\')"
    return f"CASE WHEN contains({column}, '\\u00') THEN {expr} ELSE {column} END"


def _call_json_sql(call: str) -> str:
    """A canonical call's function_call action as compact JSON with sorted keys: to_json of the struct, with the
    call's `acceptable` (already canonical JSON text) spliced in first when it has one ("acceptable" sorts first)."""
    plain = (f"CAST(to_json({{'arguments': {call}.arguments, 'name': {call}.name, 'type': 'function_call'}}) "
             "AS VARCHAR)")
    return (f"CASE WHEN {call}.acceptable IS NULL THEN {plain} "
            f"""ELSE '{{"acceptable":' || {call}.acceptable || ',' || substr({plain}, 2) END""")


# Assistant messages and their positions are filtered per trajectory and unnested side by side (zipped), so no
# row carries the whole message list; generate_subscripts gives the 0-based turn_index without a window (a window
# would block and hold the input). The action is to_json of a struct whose keys are written in sorted order,
# which is compact JSON like schema.canonical_json (then _lowercase_escapes_sql for the hex case); a batch is its
# calls' JSON joined, as to_json of the list would write it.
TURNS_SQL = f"""
WITH assistant_turns AS (
    SELECT trajectory_id, domain,
           list_filter(list_transform(messages, lambda m, i: CASE WHEN m.role = 'assistant' THEN i - 1 END),
                       lambda x: x IS NOT NULL) AS positions,
           list_filter(messages, lambda m: m.role = 'assistant') AS assistants
    FROM read_parquet(?)
),
turn_messages AS (
    SELECT trajectory_id, domain,
           unnest(positions) AS message_index,
           unnest(assistants) AS m,
           generate_subscripts(positions, 1) - 1 AS turn_index
    FROM assistant_turns
),
turn_actions AS (
    SELECT trajectory_id, domain, message_index, turn_index, m.tool_calls AS calls,
           coalesce(len(m.tool_calls), 0) AS n_calls,
           CASE coalesce(len(m.tool_calls), 0)
               WHEN 0 THEN CAST(to_json({{'content': coalesce(m.content, ''), 'type': 'message'}}) AS VARCHAR)
               WHEN 1 THEN {_call_json_sql("m.tool_calls[1]")}
               ELSE '{{"calls":[' || array_to_string(list_transform(m.tool_calls, lambda c: {_call_json_sql("c")}), ',')
                    || '],"type":"function_call_batch"}}'
           END AS action_json
    FROM turn_messages
)
SELECT substr(md5(trajectory_id || ':' || CAST(message_index AS VARCHAR)), 1, 16) AS turn_id,
       trajectory_id, domain,
       CAST(message_index AS BIGINT) AS message_index,
       CAST(turn_index AS BIGINT) AS turn_index,
       CASE n_calls WHEN 0 THEN 'message' WHEN 1 THEN 'tool_call' ELSE 'tool_call_batch' END AS action_kind,
       {_lowercase_escapes_sql("action_json")} AS expert_action,
       CAST(list_transform(coalesce(calls, []), lambda c: c.name) AS VARCHAR[]) AS tool_names
FROM turn_actions
"""


def extract_turns_parquet(
    trajectories_path: str | os.PathLike | list,
    out_path: str | os.PathLike,
    *,
    memory_limit: str = "1GB",
    threads: int | None = None,
    row_group_size: int = 100_000,
) -> int:
    """Fast path: trajectories Parquet (formats.TRAJECTORY_SCHEMA) -> turns Parquet (TURNS_SCHEMA); returns rows.

    `trajectories_path` is a file, a glob or a list of files. One streaming DuckDB COPY: memory follows DuckDB's
    vectors and row groups, not the input size. The output is written to a temp file and renamed, so a crash
    leaves no partial file at `out_path`. Row order follows the input (trajectory order, then message order).
    """
    from pivot_assets.core.warehouse import connect_for

    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    con = connect_for(trajectories_path, memory_limit=memory_limit, **({"threads": threads} if threads else {}))
    try:
        con.execute("SET enable_progress_bar = false")  # a library call prints nothing to the terminal
        copy = f"COPY ({TURNS_SQL}) TO '{_sql_str(tmp)}' (FORMAT parquet, ROW_GROUP_SIZE {int(row_group_size)})"
        source = [str(p) for p in trajectories_path] if isinstance(trajectories_path, list) else str(trajectories_path)
        n = con.execute(copy, [source]).fetchone()[0]
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        con.close()
    os.replace(tmp, out_path)
    return int(n)


def _sql_str(path: Path) -> str:
    return str(path).replace("'", "''")


def turn_macros_sql() -> str:
    """The text of sql/turn_macros.sql (turn_state, turn_state_of, turn_tools_of, turn_state_messages)."""
    return (SQL_DIR / "turn_macros.sql").read_text()
