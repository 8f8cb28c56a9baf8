"""The OpenAI-chat adapter as DuckDB SQL over a chunk of JSONL lines (Dagster-free).

ingest/formats/ is the reference: every record goes through its Python adapters one at a time. This module is the
same adapter for the common case, vectorized: DuckDB parses the lines (from_json, C++), SQL applies the
openai-format rules of ingest/formats/ with list lambdas (three statements per chunk, each reading the previous
one's Arrow result), and a few Python functions run on whole columns (argument and tool canonicalization,
sha256). It must give byte-identical rows, so it only *accepts* what it can prove plain:

  - the line is valid JSON for DuckDB and holds nothing on which DuckDB's parser and Python's json differ
    (trailing commas, nan/inf spellings, a NUL escape, a key written with an escape, a number in arguments,
    tools or ids that DuckDB may have rounded) and is at most MAX_RECORD_BYTES;
  - the record would be detected as `openai`: a `messages` list, no `responses_create_params`, `reward_info` or
    `conversations` key anywhere in the line (a substring test, so a record that merely mentions one is
    handed back too), and no `acceptable` key (a tool call's accepted values: the Python adapter keeps them);
  - every message is an object with a known chat role; content and reasoning are strings or null;
    assistant tool_calls are null or a list of {id: string|null, function: {name, arguments} | name, arguments}
    with a non-empty string name and arguments that canonicalize; no legacy function_call; non-assistant
    messages carry no tool_calls; every tool message has a string tool_call_id issued by an earlier call;
  - at least one assistant message and none empty (no calls, whitespace-only text by str.isspace);
  - the reward (first of reward / success / score / outcome_reward) is null, a bool or a number, and no
    earlier reward key is present with null (then Python's "first present key" and SQL's coalesce differ).

Everything else is *handed back* (its line number) to the Python adapters, which produce the trajectory or
the quarantine row with its reason. A known difference that is not detected: a JSON object with duplicate
member names (RFC 8259 leaves its meaning open): DuckDB reads the first, Python the last.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

import duckdb
import pyarrow as pa
from duckdb.sqltypes import BIGINT, VARCHAR

from pivot_assets.core.catalog import MESSAGE_TYPE, TOOL_CALL_TYPE
from pivot_assets.core.ids import canonical_json

from .formats import (
    CHAT_ROLES,
    CONVERSATION_ID_FIELDS,
    MAX_RECORD_BYTES,
    RecordError,
    _arguments,
    normalize_tools,
)
from .turn_extraction import _lowercase_escapes_sql

# Only the fields the openai adapter reads. Text fields are VARCHAR (parsed straight to text: 4x cheaper than JSON,
# which DuckDB re-serializes); that a text field holds a string or null is checked on the raw line (TEXT_FIELDS).
TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "thinking", "tool_call_id")
RECORD_SCHEMA = json.dumps({
    "messages": [{"role": "VARCHAR", **{f: "VARCHAR" for f in TEXT_FIELDS}, "tool_calls": "JSON", "function_call": "JSON"}],
    "tools": "JSON", "reward": "JSON", "success": "JSON", "score": "JSON", "outcome_reward": "JSON",
    "domain": "JSON", "metadata": "JSON", "domain_name": "JSON", "conversation_id": "JSON",
    **{key: "JSON" for key in CONVERSATION_ID_FIELDS},
})
# arguments as text: a JSON string's content or an object's JSON, both of which formats._arguments parses to the
# same dict (anything else fails there too and is handed back)
# `function` as a struct: any non-object reads as a struct of nulls, and a call without a function name is handed
# back, so the struct never stands in for something Python reads differently.
CALLS_SCHEMA = json.dumps([{"id": "JSON", "function": {"name": "JSON", "arguments": "VARCHAR"}, "name": "JSON",
                            "arguments": "VARCHAR"}])

# A key whose mere presence changes format detection (formats.detect_format), or that only the Python adapter reads
# (a tool call's `acceptable`).
HANDED_BACK_KEYS = ("responses_create_params", "reward_info", "conversations", "acceptable")
# Lines the SQL adapter must hand back, found on the raw text. Each pattern starts with one literal, which keeps
# RE2 fast (an alternation of several costs 6x). Keys are matched unescaped, so a key written with a \u escape
# makes its line ineligible first.
INELIGIBLE_PATTERNS = (
    r",\s*[\]}]",                                     # trailing comma: DuckDB accepts it, Python does not
    r":\s*[-+]?(?i:nan|inf)", r",\s*[-+]?(?i:nan|inf)", r"\[\s*[-+]?(?i:nan|inf)",  # nan/inf spellings Python rejects
    # a text field that is not a string or null, or a key of another format (one pass: both start with a quote)
    r'"(?:(?:' + "|".join(TEXT_FIELDS) + r')"\s*:\s*[^"\sn]|(?:' + "|".join(HANDED_BACK_KEYS) + r')")',
    r'\\u(?:0000|[0-9a-fA-F]{4}(?:[^"\\]|\\.)*"\s*:)',  # a NUL escape, or an escape inside a key
)
REWARD_KEYS = ("reward", "success", "score", "outcome_reward")


# Every code point Python's str.isspace() accepts (what `.strip()` removes), listed: scanning all 1.1M code points
# took a second of each ingest (tests/ingest checks the list against that scan).
ISSPACE_CODE_POINTS = (0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                       0x2028, 0x2029, 0x202F, 0x205F, 0x3000)


def _isspace_class() -> str:
    """A regex class of every character Python's str.isspace() accepts."""
    return "".join(f"\\x{{{c:x}}}" for c in ISSPACE_CODE_POINTS)


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _json_string_value(col: str) -> str:
    """A JSON-typed value that is a string -> its text (no parse when it holds no escape)."""
    return f"CASE WHEN contains({col}, '\\') THEN json_extract_string({col}, '$') ELSE {col}[2:-2] END"


def _is_json_string(col: str) -> str:
    return f"starts_with({col}, '\"')"


def _fixed_json(expr: str) -> str:
    """to_json text exactly as core.ids.canonical_json writes it (only the hex case of \\u00XX differs)."""
    return _lowercase_escapes_sql(expr)


_ROLE_CASE = "CASE m.role " + " ".join(f"WHEN {_sql_str(k)} THEN {_sql_str(v)}" for k, v in CHAT_ROLES.items()) + " END"


def _opt_str(col: str) -> str:
    """A JSON-typed value -> its text when it is a JSON string, else NULL."""
    return f"CASE WHEN {_is_json_string(col)} THEN {_json_string_value(col)} END"


def _record_fields() -> str:
    """Record-level values from the parsed struct `r`: reward, tools, domain, conversation keys."""
    reward_json = f"coalesce({', '.join('r.' + k for k in REWARD_KEYS)})"
    # an earlier reward key present with null while a later one has a value: Python takes the null, coalesce would not
    ambiguous = " OR ".join(
        f"CASE WHEN r.{k} IS NULL AND coalesce({', '.join('r.' + k2 for k2 in REWARD_KEYS[i + 1:])}) IS NOT NULL "
        f"THEN contains(line, {_sql_str(chr(34) + k + chr(34))}) ELSE false END"  # the line is searched only then
        for i, k in enumerate(REWARD_KEYS[:-1]))
    ids = ", ".join(
        f"CASE WHEN {_is_json_string('r.' + k)} THEN [{_sql_str(k)}, {_json_string_value('r.' + k)}] "
        f"WHEN json_type(r.{k}) IN ('BIGINT', 'UBIGINT') THEN [{_sql_str(k)}, CAST(r.{k} AS VARCHAR)] END"
        for k in CONVERSATION_ID_FIELDS)
    metadata_domain = "CASE WHEN starts_with(r.metadata, '{') THEN json_extract(r.metadata, '$.domain') END"
    domains = ", ".join(f"CASE WHEN {c} <> '\"\"' THEN {_opt_str(c)} END"
                        for c in ("r.domain", metadata_domain, "r.domain_name"))
    doubles = " OR ".join(f"coalesce(json_type(r.{k}) = 'DOUBLE', false)" for k in CONVERSATION_ID_FIELDS)
    return f"""{reward_json} AS reward_json, ({ambiguous} OR {doubles}) AS hand_back, r.tools AS tools_json,
           coalesce({domains}) AS record_domain,
           CASE WHEN r.conversation_id <> '""' THEN {_opt_str('r.conversation_id')} END AS explicit_conversation,
           list_filter([{ids}], x -> x IS NOT NULL) AS ids"""


# Re-serialized JSON that may have lost a big integer (DuckDB reads integers past 2^64 as doubles, Python exactly).
MAYBE_ROUNDED = _sql_str(r"[:\[,]\s*-?[0-9.]+[eE]|[0-9]{16}")


def _call_field(field: str) -> str:
    # a call's name / arguments: under `function` when it has one (null or missing: the flat form on the call)
    return f"CASE WHEN c.function IS NOT NULL THEN c.function.{field} ELSE c.{field} END"


def _canonical_arguments(text: str) -> str:
    """formats._arguments on the arguments' text (a Python column function: 7 us a call, cheaper than parsing
    into a MAP and sorting in SQL). Null when it fails, or when DuckDB may have rounded a number (MAYBE_ROUNDED):
    the record is then handed back."""
    return f"CASE WHEN NOT regexp_matches(coalesce({text}, ''), {MAYBE_ROUNDED}) THEN pivot_canonical_arguments({text}) END"


def _sorted_message(m: str) -> str:
    """The canonical message struct with its keys in sorted order, as canonical_json writes them."""
    return (f"{{'content': {m}.content, 'reasoning': {m}.reasoning, 'role': {m}.role, 'tool_call_id': {m}.tool_call_id, "
            f"'tool_calls': CASE WHEN len({m}.calls) > 0 THEN list_transform({m}.calls, c -> "
            "{'arguments': c.arguments, 'id': c.id, 'name': c.name}) END}")


# 1. Parse: one from_json per eligible line, keeping the messages and slim record-level values.
PARSE_SQL = f"""
WITH raw AS (
    SELECT line_no, line, from_json(line, {_sql_str(RECORD_SCHEMA)}) AS r
    FROM chunk WHERE eligible {{valid}}
)
SELECT line_no, r.messages AS raw_messages, {_record_fields()}
FROM raw
"""  # (no filter on `r` here: DuckDB would push it below the projection and parse every line twice)


# 2. Messages: typed, checked and their calls canonicalized in one pass of list lambdas (each record's list stays
#    in place: no unnest and regroup).
MESSAGES_SQL = f"""
SELECT * EXCLUDE (raw_messages),
       list_transform(raw_messages, (m, i) -> {{
           'i': i - 1,
           'role': {_ROLE_CASE},
           'content': m.content,
           'reasoning': coalesce(m.reasoning, m.reasoning_content, m.thinking),
           'tool_call_id': CASE WHEN m.role IN ('tool', 'function', 'ipython') THEN m.tool_call_id END,
           'shape_ok': CASE WHEN m.role = 'assistant'
                            THEN (m.tool_calls IS NULL OR starts_with(m.tool_calls, '[')) AND m.function_call IS NULL
                            ELSE m.tool_calls IS NULL OR m.tool_calls = '[]' END,
           'calls': CASE WHEN m.role = 'assistant' AND starts_with(m.tool_calls, '[') THEN
               list_transform(from_json(m.tool_calls, {_sql_str(CALLS_SCHEMA)}), (c, k) -> {{
                   'id': CASE WHEN c.id IS NULL OR c.id = '""' THEN 'call_' || (i - 1) || '_' || (k - 1)
                              ELSE {_opt_str('c.id')} END,
                   'name': CASE WHEN ({_call_field('name')}) <> '""' THEN {_opt_str(_call_field('name'))} END,
                   'arguments': {_canonical_arguments(_call_field('arguments'))}}}) END}}) AS ms
FROM parsed
"""


def records_sql() -> str:
    """3. The record-level rules (validate_messages, parse_reward, normalize_tools) and the canonical messages as
    sorted-key structs: one row per accepted line."""
    not_space = f"[^{_isspace_class()}]"
    # NULL-safe throughout: list_bool_and skips NULL elements, so an unknown verdict must read as false
    message_ok = f"""coalesce(m.role IS NOT NULL AND m.shape_ok
              AND coalesce(list_bool_and(list_transform(m.calls, c -> c.id IS NOT NULL AND c.name IS NOT NULL
                                                                      AND c.arguments IS NOT NULL)), true)
              AND (m.role <> 'assistant' OR coalesce(len(m.calls), 0) > 0
                   OR regexp_matches(coalesce(m.content, ''), {_sql_str(not_space)}))
              AND (m.role <> 'tool' OR coalesce(list_bool_or(list_transform(issued, c -> c.id = m.tool_call_id AND c.i < m.i)), false)),
              false)"""
    return f"""
WITH checked AS (
    SELECT *,
           flatten(list_transform(ms, m -> list_transform(coalesce(m.calls, []), c -> {{'i': m.i, 'id': c.id}}))) AS issued,
           list_position(list_transform(ms, m -> m.role), 'assistant') AS first_assistant
    FROM typed
    WHERE NOT hand_back
      AND (reward_json IS NULL OR json_type(reward_json) IN ('BOOLEAN', 'BIGINT', 'UBIGINT', 'DOUBLE'))
),
accepted AS (
    SELECT line_no, record_domain, explicit_conversation, ids,
           CASE json_type(reward_json) WHEN 'BOOLEAN' THEN CASE WHEN reward_json = 'true' THEN 1.0 ELSE 0.0 END
                ELSE CAST(reward_json AS DOUBLE) END AS outcome_reward,
           CASE WHEN tools_json IS NULL OR starts_with(tools_json, '"') OR NOT regexp_matches(tools_json, {MAYBE_ROUNDED})
                THEN pivot_canonical_tools(tools_json) END AS tools,
           list_transform(ms, m -> {_sorted_message('m')}) AS messages_sorted,
           first_assistant
    FROM checked
    WHERE first_assistant > 0 AND list_bool_and(list_transform(ms, m -> {message_ok}))
)
SELECT * FROM accepted
"""


# 4. Canonical JSON and both hashes, one row per accepted line with tools in TRAJECTORY_SCHEMA's terms
#    (`record_domain` before the input's override), in step 3's row order. A separate statement: the message lists
#    are built once, in step 3; they are not passed through here (a round trip through Arrow costs as much as to_json),
#    accepted_records takes them from step 3's result.
HASH_SQL = f"""
WITH serialized AS (
    SELECT *, {_fixed_json('CAST(to_json(messages_sorted) AS VARCHAR)')} AS messages_json,
           {_fixed_json('CAST(to_json(ids) AS VARCHAR)')} AS ids_json,
           list_bool_or(list_transform(list_slice(messages_sorted, 1, first_assistant - 1), m -> m.role = 'user')) AS opening_has_user
    FROM accepted
    WHERE tools IS NOT NULL
),
hashed AS (
    SELECT *, pivot_hashes(messages_json, tools, ids_json, first_assistant - 1) AS hashes
    FROM serialized
)
SELECT line_no, split_part(hashes, ' ', 1) AS trajectory_id, 'openai' AS source_format, record_domain, tools,
       outcome_reward,
       CASE WHEN explicit_conversation IS NOT NULL THEN explicit_conversation
            WHEN len(ids) = 0 AND NOT coalesce(opening_has_user, false) THEN split_part(hashes, ' ', 1)
            ELSE split_part(hashes, ' ', 2) END AS conversation_id
FROM hashed
"""


# -- the Python pieces, run on whole columns --------------------------------------------------------
# DuckDB reads a Python function's Arrow result without keeping it alive (strings then point at freed memory):
# every result is held here until the chunk's rows have been copied out (accepted_records clears it).
_UDF_RESULTS: list[pa.Array] = []


def _held(array: pa.Array) -> pa.Array:
    _UDF_RESULTS.append(array)
    return array


def canonical_arguments_column(values: pa.Array) -> pa.Array:
    """Each call's `arguments` as text (a JSON string's content or an object's JSON) -> formats._arguments'
    canonical JSON, null when it fails."""
    out = []
    for text in values.to_pylist():
        try:
            out.append(_arguments(text, ""))
        except (RecordError, ValueError, RecursionError):
            out.append(None)
    return _held(pa.array(out, pa.string()))


@lru_cache(maxsize=256)
def _canonical_tools(text: str | None) -> str | None:
    # tool lists repeat across a dataset: cached by their JSON text
    try:
        return canonical_json(normalize_tools(None if text is None else json.loads(text)))
    except (RecordError, ValueError, RecursionError):
        return None


def canonical_tools_column(values: pa.Array) -> pa.Array:
    return _held(pa.array([_canonical_tools(t) for t in values.to_pylist()], pa.string()))


MESSAGE_START = b'},{"content":'  # between two canonical messages (sorted keys: content first); inside a string
# every quote is escaped, so this cannot occur there


def hashes_column(messages_json: pa.Array, tools: pa.Array, ids_json: pa.Array, n_opening: pa.Array) -> pa.Array:
    """"<trajectory_id> <conversation hash>" per row, both core.ids.short_hash (sha256, 16 hex digits):
    of {"messages": ..., "tools": ...}, and of {"ids": ..., "opening": ...} where the opening (the messages before
    the first assistant one) is a prefix of the messages' JSON, cut at a message boundary: no second
    serialization. Bytes are hashed as they are, never decoded."""
    out = []
    for messages, tool_text, ids, n in zip(messages_json.cast(pa.binary()).to_pylist(), tools.cast(pa.binary()).to_pylist(),
                                           ids_json.cast(pa.binary()).to_pylist(), n_opening.to_pylist()):
        trajectory = hashlib.sha256(b'{"messages":' + messages + b',"tools":' + tool_text + b"}").hexdigest()[:16]
        conversation = hashlib.sha256(b'{"ids":' + ids + b',"opening":' + _opening(messages, n) + b"}").hexdigest()[:16]
        out.append(f"{trajectory} {conversation}")
    return _held(pa.array(out, pa.string()))


def _opening(messages: bytes, n: int) -> bytes:
    """The JSON of the first n messages, cut out of the JSON of all of them."""
    if n == 0:
        return b"[]"
    end = -1
    for _ in range(n):
        end = messages.find(MESSAGE_START, end + 1)
    return messages[: end + 1] + b"]"


def connect(threads: int = 1, memory_limit: str = "1GB") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the three column functions the chunk statements call."""
    # a low flush threshold: a long-lived worker's connection gives each chunk's memory back (with DuckDB's
    # default 128 MiB it grows by ~10 MB a chunk)
    con = duckdb.connect(config={"threads": threads, "memory_limit": memory_limit, "allocator_flush_threshold": "16MB",
                                 "allocator_bulk_deallocation_flush_threshold": "16MB"})
    con.execute("SET enable_progress_bar = false")
    for name, fn, types in (("pivot_canonical_arguments", canonical_arguments_column, [VARCHAR]),
                            ("pivot_canonical_tools", canonical_tools_column, [VARCHAR]),
                            ("pivot_hashes", hashes_column, [VARCHAR, VARCHAR, VARCHAR, BIGINT])):
        con.create_function(name, fn, types, VARCHAR, type="arrow", null_handling="special", side_effects=False)
    return con


def eligible_mask(lines: pa.Array, max_record_bytes: int = MAX_RECORD_BYTES) -> pa.Array:
    """Lines the SQL adapter may try: not oversized and matching none of INELIGIBLE_PATTERNS."""
    import pyarrow.compute as pc

    ineligible = pc.greater(pc.binary_length(lines), max_record_bytes)
    for pattern in INELIGIBLE_PATTERNS:
        ineligible = pc.or_(ineligible, pc.match_substring_regex(lines, pattern))
    return pc.invert(ineligible)


def accepted_records(con: duckdb.DuckDBPyConnection, chunk: pa.Table) -> pa.Table:
    """Rows the SQL adapter accepts from `chunk(line_no, line)`: line_no + the trajectory columns it computes.

    Optimistic parse: most chunks are valid JSON throughout, so json_valid runs only after a parse error."""
    chunk = chunk.append_column("eligible", eligible_mask(chunk.column("line")))
    steps = [("typed", _RECORDS_SQL), ("accepted", HASH_SQL)]
    try:
        con.register("chunk", chunk)
        try:
            table = con.execute(_TYPED_SQL.replace("{valid}", "")).to_arrow_table()
        except duckdb.Error:  # some line is not JSON: parse only the valid ones
            table = con.execute(_TYPED_SQL.replace("{valid}", "AND json_valid(line)")).to_arrow_table()
        kept = [table]
        for name, sql in steps:  # each step reads the previous one's Arrow result: computed once, no copy
            con.register(name, table)
            table = con.execute(sql).to_arrow_table()
            kept.append(table)
        table = _with_messages(table, kept[1])
        # DuckDB's Arrow results may point into the Arrow tables it scanned (strings passed through): one copy
        # into fresh buffers makes the result independent of the intermediates, which are freed on return.
        return _owned(_in_message_order(table))
    finally:
        for name in ("chunk", *(name for name, _ in steps)):
            con.unregister(name)
        _UDF_RESULTS.clear()


def _with_messages(hashed: pa.Table, accepted: pa.Table) -> pa.Table:
    """Step 4's rows with their messages_sorted from step 3 (the rows step 4 kept: those with tools, in order)."""
    import pyarrow.compute as pc

    kept = accepted.filter(pc.is_valid(accepted.column("tools")))
    if not kept.column("line_no").equals(hashed.column("line_no")):
        raise RuntimeError("chat_sql: the hash step changed the order of the accepted rows")
    return hashed.add_column(4, "messages_sorted", kept.column("messages_sorted"))


def _owned(table: pa.Table) -> pa.Table:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return pa.ipc.open_stream(sink.getvalue()).read_all()


def _in_message_order(table: pa.Table) -> pa.Table:
    """The sorted-key message structs (built once, for the hash) as MESSAGE_TYPE: struct fields reordered without a copy."""
    messages = table.column("messages_sorted").combine_chunks()
    structs = messages.values
    calls = structs.field("tool_calls")
    fields = [calls.values.field(k) for k in ("id", "name", "arguments")]
    no_acceptable = pa.nulls(len(calls.values), pa.string())  # lines with one were handed back
    calls_in_order = pa.ListArray.from_arrays(
        calls.offsets, pa.StructArray.from_arrays([*fields, no_acceptable], fields=list(TOOL_CALL_TYPE)),
        mask=calls.is_null())
    reordered = pa.StructArray.from_arrays(
        [structs.field("role"), structs.field("content"), structs.field("reasoning"), calls_in_order,
         structs.field("tool_call_id")], fields=list(MESSAGE_TYPE), mask=structs.is_null())
    in_order = pa.ListArray.from_arrays(messages.offsets, reordered, type=pa.list_(MESSAGE_TYPE), mask=messages.is_null())
    index = table.schema.get_field_index("messages_sorted")
    return table.set_column(index, "messages", in_order)


_RECORDS_SQL = records_sql()
# steps 1 and 2 in one statement: the parsed lines never leave DuckDB
_TYPED_SQL = "WITH parsed AS (" + PARSE_SQL + ")\n" + MESSAGES_SQL
