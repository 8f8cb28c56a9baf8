"""Trajectory ingestion: readers, input formats and the quarantine rules (Dagster-free).

`ingest.ingest_record` adapts one record (tests/ingest/reference.py loops over inputs with it, one record at a
time: the reference). The pipeline (`inputs.write_ingest`)
streams the same rules through `streaming.py` in bounded units and worker processes, where JSONL lines first go
through `chat_sql.py`, the openai adapter as one DuckDB query, which takes only what it can prove gives the same
row and hands every other line back to the adapters here; tests check that both give identical tables.

Every input record becomes exactly one of:
  ("trajectory", row)  a canonical trajectory (TRAJECTORY_SCHEMA),
  ("quarantine", row)  a record we could not use, with a one-line reason "category: detail" and the raw text
                       capped at RAW_CAP characters (QUARANTINE_SCHEMA),
  ("duplicate", row)   a record whose canonical content (messages + tools) was already ingested
                       ({trajectory_id, source, record}).
so read = ingested + quarantined + duplicates. A tau2-bench results file counts one record per simulation.

Modules:
  records.py     RawRecord, RecordError, Input, Origin and the caps (MAX_RECORD_BYTES, RAW_CAP);
  readers.py     the JSON / JSONL / Parquet / Hugging Face readers (the file rules are in its docstring);
  registry.py    the input formats by name: `Format` (detection, keys, adapter, a one-line description);
  openai.py, responses.py, tau2.py, sharegpt.py, bfcl.py: one module per format, each registering its Format
                 (the format's rules are in its docstring);
  messages.py    canonical messages (what the chat-like adapters share);
  validation.py  the record-level rules after the adapter; quarantine.py the quarantine row;
  default_tools.py  an input's `tools:` file; ingest.py the reference ingest.

Formats: format=auto asks each registered format in registration order (the generic openai, whose `messages` other
formats hold too, last) and takes the first that detects the record; a forced format that does not fit
(Format.keys) is "format_mismatch". Adding a format is one module that registers it plus its name on the import
line below (docs/real-data.md, "Add a format").

Turn rules (turn_extraction.py cuts one turn per assistant message):
  - reasoning content stays in the message's `reasoning`, visible in later states, never part of an action;
  - an assistant message with both text and tool calls is a tool-call action (the text stays in the message);
  - consecutive assistant messages (chat formats) are separate turns; the later one's state contains the
    earlier one (in the Responses format consecutive assistant-side items are merged, see responses.py);
  - a trailing assistant message is a turn like any other (usually a final "message" action);
  - an assistant message with no text and no tool calls is quarantined ("empty_assistant_message", validation.py).
Domain: the input's `domain` when given, else the record's (`domain`, `metadata.domain`, `domain_name`,
tau2's environment domain), else "default".

conversation_id (the source-conversation group key a held-out split groups by; every format fills it):
  1. the record's own `conversation_id` when it is a non-empty string, verbatim (so our own trajectories
     Parquet reads back with the same key); the BFCL formats name their own (bfcl.py);
  2. else short_hash(canonical_json({"ids": ids, "opening": opening})), where
       opening = the canonical messages before the first assistant message (system, user, tool), and
       ids     = [[key, value]] for key in CONVERSATION_ID_FIELDS ("session_id", "task_id", "_ng_task_index":
                 tau2's simulation task, NeMo-Gym's task index), in that order, where the record's value is
                 a string or an integer (as a string); other values are ignored;
     so the NeMo-Gym pivot rows cut from one conversation (same instructions, same first user message) share
     it, and so do several rollouts or trials of one task (the split must not put one task on both sides);
  3. else, when there are no ids and the opening holds no user message (nothing says which conversation this
     is: e.g. a trajectory that starts with the assistant), the trajectory_id.
"""

from __future__ import annotations

from pivot_assets.core.catalog import MESSAGE_TYPE, QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA

# The built-in formats: each module registers its Format(s) on import, in this order (the config lists them in
# this order; detection asks them in it, the generic openai last). A new format: its module's name on this line.
from . import openai, responses, tau2, sharegpt, bfcl  # noqa: F401, I001  (the order is the registration order)
from .default_tools import fill_default_tools, load_tools_file, with_default_tools
from .ingest import CONVERSATION_ID_FIELDS, adapt_record, as_input, conversation_id, ingest_record
from .messages import CHAT_ROLES, chat_messages
from .messages import canonical_arguments as _arguments  # chat_sql.py's name for it
from .readers import (expand_paths, iter_raw_records, jsonl_record, read_hf_dataset, read_json, read_jsonl,
                      read_parquet, scan_paths)
from .records import MAX_RECORD_BYTES, PARQUET_BATCH_ROWS, RAW_CAP, Input, Origin, RawRecord, RecordError
from .registry import Format, register
from .registry import detect as detect_format
from .registry import names as format_names
from .validation import normalize_tools, parse_reward, validate_messages


__all__ = [
    "MESSAGE_TYPE", "TRAJECTORY_SCHEMA", "QUARANTINE_SCHEMA", "MAX_RECORD_BYTES", "RAW_CAP", "PARQUET_BATCH_ROWS",
    "CONVERSATION_ID_FIELDS", "CHAT_ROLES", "RecordError", "Input", "Origin", "RawRecord", "Format", "register",
    "format_names", "detect_format", "ingest_record", "adapt_record", "as_input", "conversation_id",
    "iter_raw_records", "expand_paths", "scan_paths", "read_json", "read_jsonl", "read_parquet",
    "read_hf_dataset", "jsonl_record", "chat_messages", "validate_messages", "normalize_tools", "parse_reward",
    "load_tools_file", "with_default_tools", "fill_default_tools", "_arguments",
]
