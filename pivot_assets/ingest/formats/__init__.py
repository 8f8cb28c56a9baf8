"""Trajectory ingestion: readers, format adapters and the quarantine rules (Dagster-free).

This module is the reference: `iter_ingest` adapts one record at a time. The pipeline (`inputs.write_ingest`)
streams the same rules through `streaming.py` in bounded units and worker processes, where JSONL lines first go
through `chat_sql.py`, the openai adapter as one DuckDB query, which takes only what it can prove gives the same
row and hands every other line back to the adapters below; tests check that both give identical tables.

Every input record becomes exactly one of:
  ("trajectory", row)  a canonical trajectory (TRAJECTORY_SCHEMA),
  ("quarantine", row)  a record we could not use, with a one-line reason "category: detail" and the raw text
                       capped at RAW_CAP characters (QUARANTINE_SCHEMA),
  ("duplicate", row)   a record whose canonical content (messages + tools) was already ingested
                       ({trajectory_id, source, record}).
so read = ingested + quarantined + duplicates. A tau2-bench results file counts one record per simulation.

Readers (chosen by file name, files.py: `.gz` / `.zst` compressed JSON and JSON Lines are read decompressed; in a
directory every other file is skipped, and each skipped file is reported with its reason, see `scan_paths`):
  .json      a top-level list (one record per element), an object (one record), or a tau2 results object
             ({"simulations": [...]}: one record per simulation, `record` = the simulation index);
             a file that does not parse is one quarantined record (record 0) whose reason names the line and
             column that broke. A .json file that holds JSON Lines (BFCL's convention; files.json_layout) is read
             as .jsonl.
  .jsonl     one record per non-blank line; `record` = 0-based line number (line = record + 1); a bad line
             is quarantined and the rest of the file continues.
  .parquet   pyarrow, in row batches; columns holding JSON text (messages, tools, ...) are parsed.
  a directory with dataset_info.json / state.json / dataset_dict.json: a Hugging Face `datasets` dataset
             saved with save_to_disk (every split, in order).
Text records larger than MAX_RECORD_BYTES are quarantined ("oversized") without being parsed.

Formats (format=auto detects per record; a forced format that does not fit is "format_mismatch"):
  openai     messages under `messages`, `traj` or `conversation`; assistant `tool_calls`
             [{id, type, function: {name, arguments}}] (arguments a JSON string or an object; the flat
             {id, name, arguments} form and the legacy `function_call` are accepted too); `role: tool` results
             with `tool_call_id`; reasoning from `reasoning` / `reasoning_content` / `thinking`; optional `tools`;
             outcome reward from `reward`, `success` or `score` (a bool becomes 1.0 / 0.0). Our own trajectories
             Parquet (TRAJECTORY_SCHEMA) reads back as this format with the same trajectory_ids.
  responses  OpenAI Responses / NeMo-Gym rollouts: `responses_create_params.instructions` (a system message),
             `responses_create_params.input` (a string = one user message, or items) then `response.output`
             items: message, function_call, function_call_output, reasoning; `reward`. Tools are flat
             {type, name, description, parameters} and become chat tool schemas.
             Merge rule: consecutive assistant-side items (reasoning, assistant message, function_call) with no
             tool output or user/system item between them are ONE assistant message (one model call); the
             start of `response.output` also starts a new model call.
             Pivot rows (NeMo-Gym's single-step format: `expected_action`): the input is the state and the
             expected action is appended as the final assistant message, so the row is one trajectory whose
             last turn is the pivot. A `response` on such a row is a policy sample scored against the expected
             action (example_rollouts.jsonl), not expert data: it is ignored and outcome_reward is null (its
             reward scores the sample, not the trajectory). The same pivot row in example.jsonl and
             example_rollouts.jsonl is therefore one trajectory plus one duplicate.
             Task rows with no assistant output (workplace_assistant/example.jsonl: input + `ground_truth`, a
             list of required calls that a rollout spreads over several model calls) have no expert turn:
             they are quarantined as "no_assistant_turn". (An input-only row whose input already holds
             assistant turns is ingested as that input.)
  tau2       tau2-bench results: `simulations[].messages`; tool calls {id, name, arguments(object)}; tool
             results are `role: tool` with `id` = the call id; reward from `reward_info.reward`; domain from
             `info.environment_info.domain_name`; the policy text (simulation `policy` or
             info.environment_info.policy) becomes the leading system message (tau2's agent wraps it in its
             own instruction template; we keep the policy verbatim). tau2 results store no tool schemas
             (`environment_info.tool_defs` is null in the shared run), so tools are "[]" unless
             `environment_info.tool_defs` / `tools` holds a list.
  sharegpt   `conversations` [{from, value}]: system, human/user, gpt/assistant, function_call (an assistant
             tool call: JSON {name, arguments} or a list of them), observation/tool/function_response (tool
             results, matched in order to the pending calls); optional top-level `system` and `tools`.
  bfcl       BFCL single-turn items {id, question, function} (simple_python, multiple, parallel,
             parallel_multiple, the live_* categories, ...): the question's messages, then one assistant message
             with the expected call(s) from the possible answer (ingest/bfcl.py: the first accepted value of each
             argument as its arguments, every accepted value in the call's `acceptable`); tools from `function`.
  bfcl_multi_turn  BFCL multi-turn items {id, question, initial_config, involved_classes, ...} (base, miss_func,
             miss_param, long_context): every ground-truth call executed by BFCL's own simulated APIs
             (ingest/bfcl_exec.py), one assistant message per call followed by its result (rules in bfcl.py).
             For both BFCL formats the possible answer comes from `possible_answer/<the data file's name>` beside
             the data file, or from the input's `answers:` (a file, or a folder of files by data file name); an
             item without one is quarantined ("bfcl_no_answer"). conversation_id: the item id (single-turn), the id
             without its category (multi-turn: `multi_turn_7` for base_7, miss_func_7, miss_param_7 and
             long_context_7); domain: `bfcl_<category>` (e.g. bfcl_simple_python, bfcl_multi_turn_base).

Canonical message: all five keys always present (see schema.py): role, content (str|None), reasoning
(str|None), tool_calls ([{id, name, arguments, acceptable?}]|None, arguments = schema.canonical_json of the parsed
object; `acceptable` = canonical JSON of {argument: [accepted values]}, present only on calls whose source gives it:
BFCL answers, an `acceptable` on a chat tool call or on a NeMo-Gym expected_action), tool_call_id (str|None).
Missing call ids get deterministic ids `call_<message index>_<k>`.

Turn rules (turn_extraction.py cuts one turn per assistant message):
  - reasoning content stays in the message's `reasoning`, visible in later states, never part of an action;
  - an assistant message with both text and tool calls is a tool-call action (the text stays in the message);
  - consecutive assistant messages (chat formats) are separate turns; the later one's state contains the
    earlier one (in the Responses format consecutive assistant-side items are merged, see above);
  - a trailing assistant message is a turn like any other (usually a final "message" action);
  - an assistant message with no text (empty or whitespace) and no tool calls would be an empty target action:
    the record is quarantined ("empty_assistant_message"). The shared data has none (tau2: 0 of 593 assistant
    messages; NeMo-Gym: every merged group holds a message or a function call).
Domain: the input's `domain` when given, else the record's (`domain`, `metadata.domain`, `domain_name`,
tau2's environment domain), else "default".

conversation_id (the source-conversation group key a held-out split groups by; every format fills it):
  1. the record's own `conversation_id` when it is a non-empty string, verbatim (so our own trajectories
     Parquet reads back with the same key);
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

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pivot_assets.core.catalog import MESSAGE_TYPE, QUARANTINE_SCHEMA, TRAJECTORY_SCHEMA
from pivot_assets.core.config import FORMATS
from pivot_assets.core.ids import canonical_json, short_hash, trajectory_id
from pivot_assets.core.shapes import ROLES

from . import bfcl_records, files
from .bfcl import BFCLError

CONVERSATION_ID_FIELDS = ("session_id", "task_id", "_ng_task_index")
MAX_RECORD_BYTES = 8 * 1024 * 1024  # a text record larger than this is quarantined unparsed
RAW_CAP = 4096  # characters of raw text kept on a quarantine row
PARQUET_BATCH_ROWS = 512


class RecordError(ValueError):
    """A record that cannot be ingested; str() is the one-line quarantine reason "category: detail"."""

    def __init__(self, category: str, detail: str):
        one_line = " ".join(str(detail).split())
        super().__init__(f"{category}: {one_line}"[:500])
        self.category = category


@dataclass
class Input:
    """One configured input (the config's `inputs` items have the same fields)."""

    path: str
    format: str = "auto"
    domain: str | None = None
    tools: str | None = None  # a tools file for records without tools (load_tools_file)
    answers: str | None = None  # BFCL possible answers: a file or a folder (bfcl.answers_path)


@dataclass
class RawRecord:
    """What a reader yields: a parsed record, or the error that stopped it, plus its raw text when known."""

    source: str
    record: int
    value: Any = None
    error: RecordError | None = None
    raw: str | None = None
    context: dict | None = None  # file-level data a tau2 simulation needs (info, tasks)


# ---------------------------------------------------------------------------------------------- ingest


def iter_ingest(inputs: Iterable[Any]) -> Iterator[tuple[str, dict]]:
    """Ingest every record of every input: yields ("trajectory"|"quarantine"|"duplicate", row).

    `inputs` items are objects or dicts with `path` (file, directory or glob), `format` and optional `domain`.
    Identical trajectories (same trajectory_id) are kept once across all inputs. Streams: one file's
    records plus the set of seen ids are held at a time.
    """
    seen: set[str] = set()
    for item in inputs:
        spec = _as_input(item)
        default_tools = load_tools_file(spec.tools) if spec.tools else None
        for raw in iter_raw_records(spec.path):
            kind, row = ingest_record(raw, spec.format, spec.domain, spec.answers)
            if kind == "trajectory":
                row = fill_default_tools(row, default_tools)
                if row["trajectory_id"] in seen:
                    kind = "duplicate"
                    row = {"trajectory_id": row["trajectory_id"], "source": row["source"], "record": row["record"]}
                else:
                    seen.add(row["trajectory_id"])
            yield kind, row


def ingest_record(raw: RawRecord, fmt: str = "auto", domain: str | None = None,
                  answers: str | None = None) -> tuple[str, dict]:
    """One raw record -> ("trajectory", row) or ("quarantine", row); no dedup here. `answers`: the input's
    BFCL possible answers (None: beside the record's file)."""
    if raw.error is not None:
        return "quarantine", _quarantine_row(raw, raw.error)
    try:
        source_format, adapted = adapt_record(raw.value, fmt, raw.context, source=raw.source, answers=answers)
        messages = validate_messages(adapted["messages"])
        tools = normalize_tools(adapted.get("tools"))
        reward = parse_reward(adapted.get("reward"))
        _check_encodable(messages, tools)
    except RecordError as err:
        return "quarantine", _quarantine_row(raw, err)
    tid = trajectory_id(messages, tools)
    row = {
        "trajectory_id": tid,
        "source": raw.source,
        "record": raw.record,
        "source_format": source_format,
        "domain": domain or adapted.get("domain") or "default",
        "messages": messages,
        "tools": canonical_json(tools),
        "outcome_reward": reward,
        "conversation_id": adapted.get("conversation_id") or conversation_id(raw.value, messages, tid),
        "environment": _environment(adapted.get("environment")),
    }
    return "trajectory", row


def _environment(value: Any) -> str | None:
    """An executable environment as canonical JSON text (environments/base.py), None when the record has none."""
    if value is None:
        return None
    if isinstance(value, str):
        value = _parse_json_text(value)
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise RecordError("wrong_type", "environment must be an object with a string 'kind'")
    return canonical_json(value)


def conversation_id(value: Any, messages: list[dict], trajectory_id_: str) -> str:
    """The source-conversation group key of a record (rule in the module docstring)."""
    value = value if isinstance(value, dict) else {}
    explicit = value.get("conversation_id")
    if isinstance(explicit, str) and explicit:
        return explicit
    ids = [[key, str(v)] for key in CONVERSATION_ID_FIELDS
           if isinstance(v := value.get(key), str) or (isinstance(v, int) and not isinstance(v, bool))]
    first_assistant = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    opening = messages[:first_assistant]
    if not ids and not any(m["role"] == "user" for m in opening):
        return trajectory_id_
    return short_hash(canonical_json({"ids": ids, "opening": opening}))


def _as_input(item: Any) -> Input:
    get = item.get if isinstance(item, dict) else (lambda k, d=None: getattr(item, k, d))
    fmt = get("format", "auto") or "auto"
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r} (one of {', '.join(FORMATS)})")
    return Input(path=str(get("path")), format=fmt, domain=get("domain", None), tools=get("tools", None),
                 answers=get("answers", None))


def _quarantine_row(raw: RawRecord, err: RecordError) -> dict:
    text = raw.raw
    if text is None:
        try:
            text = json.dumps(raw.value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(raw.value)
    return {"source": raw.source, "record": raw.record, "reason": _writable(str(err)), "raw": _writable(text[:RAW_CAP])}


def _writable(text: str) -> str:
    # A lone surrogate (a record quarantined as non_utf8 holds one) cannot be written as UTF-8: keep it as its
    # \uXXXX escape, so the row can be stored and still shows what was there.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_encodable(messages: list[dict], tools: list) -> None:
    # A lone surrogate ("\ud800" in JSON) decodes into Python but cannot be written as UTF-8 (Parquet, DuckDB).
    try:
        canonical_json([messages, tools]).encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError("non_utf8", f"text holds an unpaired surrogate at offset {e.start}") from None


# ---------------------------------------------------------------------------------------------- readers


def expand_paths(path: str) -> list[Path]:
    """A file, a directory (recursively: data files and HF dataset dirs) or a glob -> sorted data paths."""
    return files.scan(path)[0]


def scan_paths(path: str) -> tuple[list[Path], list[tuple[str, str]]]:
    """(data paths, [(skipped file, reason)]) of an input path (files.scan: a directory's other files and BFCL's
    companion folders are skipped, each with its reason)."""
    return files.scan(path)


def iter_raw_records(path: str) -> Iterator[RawRecord]:
    """Every record under `path`, file by file, as RawRecord (parsed or carrying its error)."""
    for p in expand_paths(path):
        if p.is_dir():
            yield from read_hf_dataset(p)
            continue
        kind = files.data_kind(p)
        if kind == "jsonl":
            yield from read_jsonl(p)
        elif kind == "parquet":
            yield from read_parquet(p)
        else:  # .json, and any file named explicitly: try JSON
            yield from read_json(p)


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError("non_utf8", f"invalid UTF-8 byte 0x{data[e.start]:02x} at byte {e.start}") from None


def _parse_json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        truncated = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated")
        category = "truncated_json" if truncated else "invalid_json"
        raise RecordError(category, f"{e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise RecordError("invalid_json", "nesting too deep") from None


def _parse_bytes(data: bytes) -> Any:
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError("oversized", f"{len(data)} bytes > cap {MAX_RECORD_BYTES}")
    return _parse_json_text(_decode(data))


def _raw_text(data: bytes) -> str:
    return data[: RAW_CAP * 4].decode("utf-8", errors="replace")[:RAW_CAP]


def read_jsonl(p: Path) -> Iterator[RawRecord]:
    """One record per non-blank line; record = 0-based line number; a bad line does not stop the file."""
    for lineno, line in enumerate(files.iter_lines(p)):
        if line.strip():
            yield jsonl_record(str(p), lineno, line)


def jsonl_record(source: str, lineno: int, line: bytes) -> RawRecord:
    """One non-blank JSONL line (with its newline, as read) -> RawRecord, parsed or carrying its error."""
    try:
        value = _parse_bytes(line)
    except RecordError as err:
        return RawRecord(source, lineno, error=_with_line(err, lineno), raw=_raw_text(line))
    return RawRecord(source, lineno, value=value, raw=None)


def _with_line(err: RecordError, lineno: int) -> RecordError:
    category, _, detail = str(err).partition(": ")
    return RecordError(category, f"{detail} (file line {lineno + 1})")


def read_json(p: Path) -> Iterator[RawRecord]:
    """A top-level list, one object, or a tau2 results object (one record per simulation); JSON Lines in a .json
    file are read as .jsonl."""
    if files.json_layout(p) == "lines":
        yield from read_jsonl(p)
        return
    data = files.read_bytes(p)
    try:
        text = _decode(data)
        value = _parse_json_text(text)
    except RecordError as err:
        yield RawRecord(str(p), 0, error=err, raw=_raw_text(data))
        return
    if isinstance(value, dict) and isinstance(value.get("simulations"), list):
        context = {k: v for k, v in value.items() if k != "simulations"}
        for i, sim in enumerate(value["simulations"]):
            yield _sized(RawRecord(str(p), i, value=sim, context=context))
    elif isinstance(value, list):
        for i, element in enumerate(value):
            yield _sized(RawRecord(str(p), i, value=element))
    else:
        yield _sized(RawRecord(str(p), 0, value=value))


def _sized(raw: RawRecord) -> RawRecord:
    # Elements of a JSON file were parsed with the file; the cap still applies to each record's own size.
    if len(data := json.dumps(raw.value, ensure_ascii=False)) > MAX_RECORD_BYTES:
        raw.error = RecordError("oversized", f"{len(data)} characters > cap {MAX_RECORD_BYTES}")
        raw.raw = data[:RAW_CAP]
    return raw


def read_parquet(p: Path) -> Iterator[RawRecord]:
    """Rows of a Parquet file, read in batches of PARQUET_BATCH_ROWS."""
    import pyarrow.parquet as pq

    index = 0
    for batch in pq.ParquetFile(p).iter_batches(batch_size=PARQUET_BATCH_ROWS):
        for row in batch.to_pylist():
            yield RawRecord(str(p), index, value=row)
            index += 1


def read_hf_dataset(p: Path) -> Iterator[RawRecord]:
    """A `datasets` dataset saved to disk; a DatasetDict yields its splits in order, records numbered on."""
    import datasets

    loaded = datasets.load_from_disk(str(p))
    splits = [loaded[name] for name in loaded] if isinstance(loaded, datasets.DatasetDict) else [loaded]
    index = 0
    for split in splits:
        for row in split:
            yield RawRecord(str(p), index, value=row)
            index += 1


# ---------------------------------------------------------------------------------------------- adapters

JSON_TEXT_FIELDS = ("messages", "traj", "conversation", "conversations", "tools", "responses_create_params",
                    "response", "expected_action", "reward_info")


def adapt_record(value: Any, fmt: str, context: dict | None, source: str | None = None,
                 answers: str | None = None) -> tuple[str, dict]:
    """A parsed record -> (source_format, {messages (unvalidated canonical), tools, reward, domain} and, where the
    format names one, conversation_id). `source` is the record's file and `answers` the input's BFCL answers
    (the BFCL formats read the answer beside the file)."""
    if not isinstance(value, dict):
        raise RecordError("wrong_type", f"record is {type(value).__name__}, expected an object")
    value = _parse_json_columns(value)
    detected = detect_format(value, context)
    if fmt == "auto":
        if detected is None:
            raise RecordError("unknown_format", f"no known format fits keys {sorted(value)[:12]}")
        fmt = detected
    elif detected != fmt and not _fits(value, fmt):
        raise RecordError("format_mismatch", f"input format is {fmt} but the record looks like {detected}")
    if fmt in BFCL_FORMATS:
        return fmt, adapt_bfcl(value, fmt, source or "", answers)
    adapter = {"openai": adapt_openai, "responses": adapt_responses, "tau2": adapt_tau2,
               "sharegpt": adapt_sharegpt}[fmt]
    return fmt, adapter(value, context or {})


def _parse_json_columns(value: dict) -> dict:
    # Parquet / HF datasets often store nested fields as JSON text.
    out = dict(value)
    for key in JSON_TEXT_FIELDS:
        v = out.get(key)
        if isinstance(v, str) and v[:1] in "[{":
            out[key] = _parse_json_text(v)
    return out


def detect_format(value: dict, context: dict | None = None) -> str | None:
    """The format of one record, or None."""
    if "responses_create_params" in value:
        return "responses"
    if "reward_info" in value or (context and "simulations" not in value and "messages" in value
                                  and ("info" in context or "tasks" in context)):
        return "tau2"
    conv = value.get("conversations")
    if isinstance(conv, list) and conv and isinstance(conv[0], dict) and "from" in conv[0]:
        return "sharegpt"
    if isinstance(value.get("question"), list) and "id" in value:
        if "involved_classes" in value:
            return "bfcl_multi_turn"
        if "function" in value:
            return "bfcl"
    if any(isinstance(value.get(k), list) for k in ("messages", "traj", "conversation", "conversations")):
        return "openai"
    return None


def _fits(value: dict, fmt: str) -> bool:
    keys = {"openai": ("messages", "traj", "conversation", "conversations"), "responses": ("responses_create_params",),
            "tau2": ("messages",), "sharegpt": ("conversations",), "bfcl": ("function",),
            "bfcl_multi_turn": ("involved_classes",)}[fmt]
    return any(k in value for k in keys)


def _message(role: str, content: str | None = None, reasoning: str | None = None,
             tool_calls: list | None = None, tool_call_id: str | None = None) -> dict:
    return {"role": role, "content": content, "reasoning": reasoning, "tool_calls": tool_calls or None,
            "tool_call_id": tool_call_id}


def _text(content: Any, where: str) -> str | None:
    """Message content -> text: a string, None, or a list of text parts (joined)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text", part.get("refusal")), str):
                texts.append(part.get("text", part.get("refusal")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RecordError("wrong_type", f"{where}: unsupported content part {kind!r}")
        return "".join(texts)
    raise RecordError("wrong_type", f"{where}: content is {type(content).__name__}")


def _arguments(args: Any, where: str) -> str:
    """Tool-call arguments (JSON text or an object) -> canonical JSON text of an object."""
    if args is None or (isinstance(args, str) and not args.strip()):
        return "{}"
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise RecordError("bad_arguments", f"{where}: arguments are not JSON ({e.msg})") from None
    if not isinstance(args, dict):
        raise RecordError("bad_arguments", f"{where}: arguments are a JSON {type(args).__name__}, not an object")
    return canonical_json(args)


def _call(name: Any, args: Any, call_id: Any, where: str, acceptable: Any = None) -> dict:
    if not isinstance(name, str) or not name:
        raise RecordError("wrong_type", f"{where}: tool call name is {type(name).__name__}")
    if call_id is not None and not isinstance(call_id, str):
        raise RecordError("wrong_type", f"{where}: tool call id is {type(call_id).__name__}")
    call = {"id": call_id, "name": name, "arguments": _arguments(args, where)}
    if acceptable is not None:  # the key exists only when the source gives it (the trajectory_id rule)
        call["acceptable"] = _acceptable(acceptable, where)
    return call


def _acceptable(value: Any, where: str) -> str:
    """A call's accepted values {argument: [values]} (JSON text or an object) -> canonical JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RecordError("bad_acceptable", f"{where}: acceptable is not JSON ({e.msg})") from None
    if not isinstance(value, dict) or not all(isinstance(v, list) and v for v in value.values()):
        raise RecordError("bad_acceptable", f"{where}: acceptable is not a mapping of argument -> accepted values")
    return canonical_json(value)


def _chat_tool_calls(raw_calls: Any, where: str) -> list[dict]:
    if raw_calls is None:
        return []
    if not isinstance(raw_calls, list):
        raise RecordError("wrong_type", f"{where}: tool_calls is {type(raw_calls).__name__}")
    calls = []
    for k, c in enumerate(raw_calls):
        if not isinstance(c, dict):
            raise RecordError("wrong_type", f"{where}: tool call {k} is {type(c).__name__}")
        fn = c.get("function") if isinstance(c.get("function"), dict) else c
        calls.append(_call(fn.get("name"), fn.get("arguments"), c.get("id"), f"{where} call {k}",
                           c.get("acceptable", fn.get("acceptable"))))
    return calls


CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "human": "user",
              "assistant": "assistant", "tool": "tool", "function": "tool", "ipython": "tool"}


def chat_messages(raw_messages: Any) -> list[dict]:
    """OpenAI-chat-like messages (also tau2's) -> canonical messages (ids not yet filled)."""
    if not isinstance(raw_messages, list):
        raise RecordError("wrong_type", f"messages is {type(raw_messages).__name__}, expected a list")
    out = []
    for i, m in enumerate(raw_messages):
        where = f"message {i}"
        if not isinstance(m, dict):
            raise RecordError("wrong_type", f"{where} is {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise RecordError("unknown_role", f"{where} has role {role!r}")
        role = CHAT_ROLES[role]
        reasoning = next((m[k] for k in ("reasoning", "reasoning_content", "thinking") if m.get(k) is not None), None)
        msg = _message(role, _text(m.get("content"), where), _text(reasoning, where + " reasoning"))
        if role == "assistant":
            calls = _chat_tool_calls(m.get("tool_calls"), where)
            if isinstance(m.get("function_call"), dict):  # legacy single function call
                fc = m["function_call"]
                calls.append(_call(fc.get("name"), fc.get("arguments"), None, where))
            msg["tool_calls"] = calls or None
        elif m.get("tool_calls"):
            raise RecordError("wrong_type", f"{where}: a {role} message carries tool_calls")
        if role == "tool":
            tcid = m.get("tool_call_id", m.get("id"))
            if tcid is not None and not isinstance(tcid, str):
                raise RecordError("wrong_type", f"{where}: tool_call_id is {type(tcid).__name__}")
            msg["tool_call_id"] = tcid
        out.append(msg)
    return out


def _record_reward(value: dict) -> Any:
    # outcome_reward: our own trajectories table, re-ingested from Parquet
    return next((value[k] for k in ("reward", "success", "score", "outcome_reward") if k in value), None)


def _record_domain(value: dict) -> str | None:
    meta = value.get("metadata") if isinstance(value.get("metadata"), dict) else {}
    for d in (value.get("domain"), meta.get("domain"), value.get("domain_name")):
        if isinstance(d, str) and d:
            return d
    return None


def adapt_openai(value: dict, context: dict) -> dict:
    """OpenAI chat completions record."""
    key = next((k for k in ("messages", "traj", "conversation", "conversations") if k in value), "messages")
    return {"messages": chat_messages(value.get(key)), "tools": value.get("tools"),
            "reward": _record_reward(value), "domain": _record_domain(value), "environment": value.get("environment")}


def adapt_tau2(value: dict, context: dict) -> dict:
    """One tau2-bench simulation; `context` is the results file minus its simulations."""
    env = ((context.get("info") or {}).get("environment_info") or {}) if isinstance(context.get("info"), dict) else {}
    messages = chat_messages(value.get("messages"))
    policy = value.get("policy") or env.get("policy")
    if isinstance(policy, str) and policy and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, _message("system", policy))
    tools = next((t for t in (env.get("tool_defs"), env.get("tools"), value.get("tools")) if isinstance(t, list)), None)
    reward_info = value.get("reward_info")
    if reward_info is not None and not isinstance(reward_info, dict):
        raise RecordError("wrong_type", f"reward_info is {type(reward_info).__name__}")
    reward = (reward_info or {}).get("reward", value.get("reward"))
    domain = env.get("domain_name") or _record_domain(value)
    return {"messages": messages, "tools": tools, "reward": reward, "domain": domain}


BFCL_FORMATS = ("bfcl", "bfcl_multi_turn")


def adapt_bfcl(value: dict, fmt: str, source: str, answers: str | None) -> dict:
    """A BFCL item (single- or multi-turn) with its answer from beside `source` (bfcl_records.py)."""
    build = bfcl_records.single_turn_chat if fmt == "bfcl" else bfcl_records.multi_turn_chat
    try:
        chat = build(value, source, answers)
    except BFCLError as err:
        raise RecordError(err.category, err.detail) from None
    return {"messages": chat_messages(chat["messages"]), "tools": chat["tools"], "reward": None,
            "domain": chat["domain"], "conversation_id": chat["conversation_id"], "environment": chat.get("environment")}


SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "function_call": "call", "tool_call": "call",
                  "observation": "tool", "tool": "tool", "function_response": "tool", "ipython": "tool"}


def adapt_sharegpt(value: dict, context: dict) -> dict:
    """ShareGPT `conversations` [{from, value}]; tool results answer the pending calls in order."""
    conv = value.get("conversations")
    if not isinstance(conv, list):
        raise RecordError("wrong_type", f"conversations is {type(conv).__name__}")
    messages = []
    if isinstance(value.get("system"), str) and value["system"]:
        messages.append(_message("system", value["system"]))
    for i, turn in enumerate(conv):
        where = f"conversation turn {i}"
        if not isinstance(turn, dict):
            raise RecordError("wrong_type", f"{where} is {type(turn).__name__}")
        role = SHAREGPT_ROLES.get(turn.get("from")) if isinstance(turn.get("from"), str) else None
        if role is None:
            raise RecordError("unknown_role", f"{where} has from={turn.get('from')!r}")
        text = _text(turn.get("value"), where)
        if role == "call":
            messages.append(_message("assistant", tool_calls=_sharegpt_calls(text, where)))
        else:
            messages.append(_message(role, text))
    return {"messages": messages, "tools": value.get("tools"), "reward": _record_reward(value),
            "domain": _record_domain(value)}


def _sharegpt_calls(text: str | None, where: str) -> list[dict]:
    try:
        parsed = json.loads(text or "")
    except json.JSONDecodeError as e:
        raise RecordError("bad_arguments", f"{where}: function_call value is not JSON ({e.msg})") from None
    items = parsed if isinstance(parsed, list) else [parsed]
    if not all(isinstance(c, dict) for c in items):
        raise RecordError("wrong_type", f"{where}: function_call value is not an object")
    return [_call(c.get("name"), c.get("arguments", c.get("parameters")), c.get("id"), where) for c in items]


RESPONSES_ASSISTANT_ITEMS = ("reasoning", "function_call")


def adapt_responses(value: dict, context: dict) -> dict:
    """OpenAI Responses / NeMo-Gym rollout or pivot row (see the module docstring for the merge rule)."""
    rcp = value.get("responses_create_params")
    if not isinstance(rcp, dict):
        raise RecordError("wrong_type", f"responses_create_params is {type(rcp).__name__}")
    messages: list[dict] = []
    if isinstance(rcp.get("instructions"), str) and rcp["instructions"]:
        messages.append(_message("system", rcp["instructions"]))
    items = rcp.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    _append_items(messages, items, "input")
    reward = value.get("reward")
    if "expected_action" in value:
        messages.append(_expected_action_message(value["expected_action"]))
        reward = None  # the row's reward (if any) scores a policy sample, not this trajectory
    elif value.get("response") is not None:
        response = value["response"]
        if not isinstance(response, dict):
            raise RecordError("wrong_type", f"response is {type(response).__name__}")
        _append_items(messages, response.get("output"), "output")
    elif not any(m["role"] == "assistant" for m in messages):
        extra = " (it has ground_truth: a task, not a demonstration)" if "ground_truth" in value else ""
        raise RecordError("no_assistant_turn", f"input-only row: no response and no expected_action{extra}")
    return {"messages": messages, "tools": rcp.get("tools"), "reward": reward, "domain": _record_domain(value)}


def _append_items(messages: list[dict], items: Any, where: str) -> None:
    if items is None:
        return
    if not isinstance(items, list):
        raise RecordError("wrong_type", f"{where} is {type(items).__name__}, expected a list")
    open_call: dict | None = None  # the assistant message being assembled (one model call)
    for i, item in enumerate(items):
        w = f"{where} item {i}"
        if not isinstance(item, dict):
            raise RecordError("wrong_type", f"{w} is {type(item).__name__}")
        kind = item.get("type") or ("message" if "role" in item else None)
        role = item.get("role")
        if kind in RESPONSES_ASSISTANT_ITEMS or (kind == "message" and role == "assistant"):
            if open_call is None:
                open_call = _message("assistant")
                messages.append(open_call)
            _merge_assistant_item(open_call, kind, item, w)
            continue
        open_call = None
        if kind == "message":
            if not isinstance(role, str) or CHAT_ROLES.get(role) not in ("system", "user"):
                raise RecordError("unknown_role", f"{w} has role {role!r}")
            messages.append(_message(CHAT_ROLES[role], _text(item.get("content"), w)))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else (
                _text(output, w) if isinstance(output, list) else canonical_json(output))
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise RecordError("wrong_type", f"{w}: call_id is {type(call_id).__name__}")
            messages.append(_message("tool", text, tool_call_id=call_id))
        else:
            raise RecordError("unknown_item_type", f"{w} has type {kind!r}")


def _merge_assistant_item(msg: dict, kind: str, item: dict, where: str) -> None:
    if kind == "reasoning":
        text = _reasoning_text(item, where)
        if text:
            msg["reasoning"] = text if msg["reasoning"] is None else msg["reasoning"] + "\n" + text
    elif kind == "function_call":
        call = _call(item.get("name"), item.get("arguments"), item.get("call_id") or item.get("id"), where)
        msg["tool_calls"] = (msg["tool_calls"] or []) + [call]
    else:
        text = _text(item.get("content"), where)
        if text is not None:
            msg["content"] = text if msg["content"] is None else msg["content"] + "\n" + text


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text: its raw `content` parts when present (open models), else its `summary` parts."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise RecordError("wrong_type", f"{where}: reasoning {key} is {type(parts).__name__}")
        texts = [p.get("text") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if texts:
            return "\n".join(texts)
    return ""


def _expected_action_message(action: Any) -> dict:
    """NeMo-Gym's expected_action (core/shapes.py's action shape) -> the final assistant message."""
    where = "expected_action"
    if not isinstance(action, dict):
        raise RecordError("wrong_type", f"{where} is {type(action).__name__}")
    kind = action.get("type")
    if kind == "message":
        return _message("assistant", _text(action.get("content"), where))
    if kind == "function_call":
        return _message("assistant", tool_calls=[_call(action.get("name"), action.get("arguments"), None, where,
                                                       action.get("acceptable"))])
    if kind == "function_call_batch" and isinstance(action.get("calls"), list):
        calls = [_call(c.get("name"), c.get("arguments"), None, f"{where} call {k}", c.get("acceptable"))
                 if isinstance(c, dict)
                 else _call(None, None, None, f"{where} call {k}") for k, c in enumerate(action["calls"])]
        return _message("assistant", tool_calls=calls)
    raise RecordError("wrong_type", f"{where} has type {kind!r}")


# ---------------------------------------------------------------------------------------------- validation


def validate_messages(messages: list[dict]) -> list[dict]:
    """Fill missing call ids, match tool results to calls, and apply the record-level rules.

    Raises RecordError: unknown_role, orphan_tool_result, empty_assistant_message, no_assistant_turn.
    """
    issued: set[str] = set()
    pending: list[str] = []  # calls not yet answered, in order: a tool result without an id answers the oldest
    n_assistant = 0
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            raise RecordError("unknown_role", f"message {i} has role {m['role']!r}")
        if m["role"] == "assistant":
            n_assistant += 1
            for k, call in enumerate(m["tool_calls"] or []):
                if not call["id"]:
                    call["id"] = f"call_{i}_{k}"
                issued.add(call["id"])
                pending.append(call["id"])
            if not m["tool_calls"] and not (m["content"] or "").strip():
                raise RecordError("empty_assistant_message", f"message {i} has no text and no tool calls")
        elif m["role"] == "tool":
            tcid = m["tool_call_id"]
            if tcid is None:
                if not pending:
                    raise RecordError("orphan_tool_result", f"message {i} is a tool result with no pending call")
                m["tool_call_id"] = tcid = pending[0]
            if tcid not in issued:
                raise RecordError("orphan_tool_result", f"message {i} answers call {tcid!r}, which no assistant made")
            if tcid in pending:
                pending.remove(tcid)
    if n_assistant == 0:
        raise RecordError("no_assistant_turn", "record has no assistant message")
    return messages


def normalize_tools(tools: Any) -> list[dict]:
    """Chat, flat (Responses) or bare function schemas -> [{"type": "function", "function": {...}}]."""
    if tools is None:
        return []
    if isinstance(tools, str):
        tools = _parse_json_text(tools) if tools.strip() else []
    if not isinstance(tools, list):
        raise RecordError("wrong_type", f"tools is {type(tools).__name__}, expected a list")
    out = []
    for k, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RecordError("wrong_type", f"tool {k} is not a function schema")
        params = fn.get("parameters")
        out.append({"type": "function", "function": {
            "name": fn["name"], "description": fn.get("description") or "",
            "parameters": params if isinstance(params, dict) else {"type": "object", "properties": {}}}})
    return out


def parse_reward(value: Any) -> float | None:
    """bool -> 1.0/0.0, number -> float, None -> None; anything else is a wrong type."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    raise RecordError("wrong_type", f"reward is {type(value).__name__}")


# ---------------------------------------------------------------------------------------------- tables


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


def ingest_to_tables(inputs: Iterable[Any]) -> tuple[pa.Table, pa.Table, dict]:
    """Convenience for small inputs and tests: (trajectories, quarantine, counts) held in memory."""
    rows: dict[str, list] = {"trajectory": [], "quarantine": [], "duplicate": []}
    for kind, row in iter_ingest(inputs):
        rows[kind].append(row)
    counts = {k: len(v) for k, v in rows.items()}
    counts["read"] = sum(counts.values())
    return (pa.Table.from_pylist(rows["trajectory"], schema=TRAJECTORY_SCHEMA),
            pa.Table.from_pylist(rows["quarantine"], schema=QUARANTINE_SCHEMA), counts)


__all__ = [
    "MESSAGE_TYPE", "TRAJECTORY_SCHEMA", "QUARANTINE_SCHEMA", "MAX_RECORD_BYTES", "RAW_CAP", "FORMATS",
    "RecordError", "Input", "iter_ingest", "ingest_record", "iter_raw_records", "expand_paths",
    "detect_format", "adapt_record", "validate_messages", "normalize_tools", "parse_reward", "ingest_to_tables",
]


def tau2_as_openai_chat(results: dict, tools: list | None = None, domain: str = "airline") -> list[dict]:
    """tau2-bench results (`{"simulations": [...]}`) as OpenAI chat records: the domain policy as the system
    message, tool calls with JSON-string arguments, tool results by call id; task id and reward kept, and
    `tools` on every record when given. The shape most trainers read (and the one bench_ingest replicates)."""
    records = []
    for sim in results["simulations"]:
        messages = [{"role": "system", "content": sim["policy"]}]
        for m in sim["messages"]:
            if m["role"] == "tool":
                messages.append({"role": "tool", "tool_call_id": m["id"], "content": m["content"]})
            elif m.get("tool_calls"):
                messages.append({"role": "assistant", "content": m.get("content"), "tool_calls": [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                    for c in m["tool_calls"]]})
            else:
                messages.append({"role": m["role"], "content": m["content"]})
        record = {"id": sim["id"], "task_id": sim["task_id"], "messages": messages}
        if tools is not None:
            record["tools"] = tools
        records.append({**record, "reward": sim["reward_info"]["reward"], "domain": domain})
    return records
