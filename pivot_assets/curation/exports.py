"""Pivot-set exports (Dagster-free): a Hugging Face dataset for TRL and NeMo-Gym pivot JSONL for NeMo-RL.

Both rebuild each pivot's state from `trajectories.messages[:message_index]` (schema.rebuild_state) and
carry the trajectory's tools, the expert action and the profile stats.

HF (`to_hf_dataset`), one row per pivot:
  prompt         the state as chat messages in the Hugging Face / OpenAI shape the chat templates read:
                 {role, content (str, "" when none), tool_calls: [{type: "function", function: {name,
                 arguments: dict}}] ([] when none), tool_call_id: str | None}; reasoning is dropped, as when the
                 profiling prompts were rendered (core.shapes.to_template_messages).
                 Stored with features.Json for `arguments`, so heterogeneous argument objects do not get
                 merged into one Arrow struct (which would add every other call's keys as nulls).
  tools          JSON text of the trajectory's chat tool schemas. TRL's SFT/DPO trainers json.loads a str
                 `tools`; GRPOTrainer 1.16 never renders a per-row `tools` column into the prompt (it renders
                 conversational prompts with its trainer-wide `tools=` callables) and only passes extra
                 columns to reward functions, so a trainer that must show each pivot's tools renders the
                 prompt itself (pivot_assets/grpo.py does).
  expert_action  JSON text of the action (core/shapes.py).
  turn_id, trajectory_id, domain, message_index, action_kind, pivot_set, selection_rank and the profile
  stats (policy_fp, verifier_fp, k, reward_mean, reward_var, reward_std, n_pass, n_distinct_actions, pass_threshold).

  conversation_id  the trajectory's source-conversation key (ingest/formats/), for splits grouped by conversation.
  environment    the trajectory's executable environment (JSON text, null when it has none): what a verifier that
                 executes (executed_state) rebuilds the pivot's world from, e.g. as GRPO's reward.
  The dataset is built as Arrow, not from Python objects: `arguments` is written as JSON text into the Json
  column's storage, so a batch in which no prompt has a tool call still has a type (datasets' own builder fails
  there: "MakeBuilder: cannot construct builder for type extension<arrow.json>").

Warehouse exports (`export_hf`, `export_nemo_gym`) stream: DuckDB joins each pivot to its trajectory's state
(messages[:message_index], sliced in SQL) in selection order, EXPORT_BATCH pivots at a time, and the rows are
appended to an Arrow file (HF) or a JSONL file (NeMo-Gym); nothing holds the whole set or the trajectories.

NeMo-Gym (`to_nemo_gym_rows`), the single_step_tool_use_with_argument_comparison row shape:
  {"responses_create_params": {"input": [Responses items], "tools": [flat tool schemas],
                               "tool_choice": "auto", "parallel_tool_calls": bool},
   "expected_action": {...}, "agent_ref": {"type": "responses_api_agents", "name": agent_name},
   "metadata": {turn_id, trajectory_id, conversation_id, domain, pivot_set, selection_rank, profile stats}}
plus the profile as NVIDIA's published pivot rows (nvidia/Nemotron-RL-Agentic-Conversational-Tool-Use-Pivot-v1)
carry it, top-level: `trajectory_id`; `<profile_key>`: {rewards: the profile's per-sample rewards in sample order
(null when the warehouse holds no rollout_rewards for it), reward_mean, reward_std, reward_var}, the key
`qwen_235b_info` unless named (the field NeMo-RL's examples/nemo_gym/prepare_conversational_tool_use_pivot_data.py
filters on); `pass_rate` (n_pass / k), `pass_rate_total` (k) and `pass_rate_passed` (n_pass: the samples that
pass, reward at least the verifier's pass_threshold: 1 for 0/1 rewards). Both come from the one reference profile
the pivot was selected by. With a continuous reward the profile object's reward_mean is the mean reward and
pass_rate the share of passing samples: they differ.
Items: system/user messages {type: message, role, content: str}; an assistant message becomes a reasoning
item (if any), an assistant message item with output_text content (if any text) and one function_call
item per call {type, call_id, name, arguments: JSON text}; tool results {type: function_call_output,
call_id, output}. Limitation: two consecutive assistant messages (possible in chat sources) read back
as one merged assistant message, since Responses items have no model-call boundary between them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from pivot_assets.core.ids import canonical_json
from pivot_assets.core.shapes import arguments_dict, rebuild_state

DEFAULT_AGENT_NAME = "single_step_tool_use_with_argument_comparison_agent"
DEFAULT_PROFILE_KEY = "qwen_235b_info"  # the profile object NeMo-RL's pivot data script reads reward_mean from
# the keys a row has besides the profile object, which therefore cannot name it
NEMO_GYM_ROW_KEYS = ("trajectory_id", "responses_create_params", "expected_action", "agent_ref", "pass_rate",
                     "pass_rate_total", "pass_rate_passed", "metadata")
PROFILE_STATS = ("policy_fp", "verifier_fp", "k", "reward_mean", "reward_var", "reward_std", "n_pass", "n_distinct_actions",
                 "pass_threshold")
REWARD_STATS = ("reward_mean", "reward_std", "reward_var")  # the profile object's stats, in NVIDIA's rows' order
# trajectory columns a warehouse ingested before they existed lacks (exported as null)
OPTIONAL_TRAJECTORY_COLUMNS = ("conversation_id", "environment")
PIVOT_COLUMNS = ("turn_id", "trajectory_id", "domain", "message_index", "action_kind", "expert_action", "selection_rank", "pivot_set")
TRAJECTORY_COLUMNS = ("trajectory_id", "messages", "tools")
EXPORT_BATCH = 1000  # pivots per streamed batch
EXPORT_MEMORY = "1GB"  # DuckDB's budget for the selection-order sort (it spills past it)


def iter_pivot_states(pivots: pl.DataFrame, trajectories: pl.DataFrame) -> Iterator[tuple[dict, list[dict], list[dict]]]:
    """(pivot row, state messages, chat tool schemas) per pivot, in selection order.

    Raises ValueError naming the first pivot whose trajectory is missing or whose message_index does
    not point at an assistant message (a pivot is never exported with a wrong state).
    """
    _require(pivots, PIVOT_COLUMNS, "pivots")
    _require(trajectories, TRAJECTORY_COLUMNS, "trajectories")
    wanted = pivots["trajectory_id"].unique()
    columns = [*TRAJECTORY_COLUMNS, *(c for c in OPTIONAL_TRAJECTORY_COLUMNS if c in trajectories.columns)]
    subset = trajectories.filter(pl.col("trajectory_id").is_in(wanted.implode())).select(columns)
    by_id = {r["trajectory_id"]: r for r in subset.iter_rows(named=True)}
    for pivot in pivots.iter_rows(named=True):
        trajectory = by_id.get(pivot["trajectory_id"])
        if trajectory is None:
            raise ValueError(f"pivot {pivot['turn_id']}: trajectory {pivot['trajectory_id']} not in trajectories")
        messages, index = trajectory["messages"], pivot["message_index"]
        if not 0 <= index < len(messages) or messages[index]["role"] != "assistant":
            raise ValueError(f"pivot {pivot['turn_id']}: message_index {index} is not an assistant message of its trajectory")
        pivot = {**pivot, **{c: trajectory.get(c) for c in OPTIONAL_TRAJECTORY_COLUMNS}}
        yield pivot, rebuild_state(messages, index), _parse_tools(trajectory["tools"])


def stream_pivot_states(pivots_path: str, trajectories_path: str, batch_size: int = EXPORT_BATCH,
                        rewards_path: str | None = None) -> Iterator[tuple[dict, list[dict], list[dict]]]:
    """iter_pivot_states over Parquet files, streamed: (pivot row, state, tools) in selection order.

    DuckDB slices each state out of its trajectory (messages[:message_index]) and sorts by selection_rank within
    its memory budget; Python sees one batch of pivots at a time. With `rewards_path` (rollout_rewards) each
    pivot row also gets `rewards`: its profile's per-sample rewards (pivot_rewards). Same errors as
    iter_pivot_states."""
    from pivot_assets.core.warehouse import connect_for

    con = connect_for([p for p in (pivots_path, trajectories_path, rewards_path) if p], memory_limit=EXPORT_MEMORY)
    try:
        con.execute("SET enable_progress_bar = false")
        columns = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{pivots_path}')").fetchall()}
        missing = [c for c in PIVOT_COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"pivots lack columns {missing}")
        present = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{trajectories_path}')").fetchall()}
        optional = ", ".join(f"{'t.' + c if c in present else 'NULL'} AS {c}" for c in OPTIONAL_TRAJECTORY_COLUMNS)
        rewards = _rewards_sql(rewards_path, columns) if rewards_path else "NULL"
        pivot = "p.*"
        if "rewards" in columns:  # an imported profile's own per-sample rewards (ingest/imported_profiles.py)
            pivot, rewards = "p.* EXCLUDE (rewards)", "p.rewards"
        reader = con.execute(f"""
            SELECT {pivot}, {rewards} AS rewards, t.trajectory_id IS NOT NULL AS _found, len(t.messages) AS _n_messages,
                   t.messages[p.message_index + 1].role AS _target_role, t.tools AS _tools, {optional},
                   list_slice(t.messages, 1, p.message_index) AS _state
            FROM read_parquet('{pivots_path}') p
            LEFT JOIN read_parquet('{trajectories_path}') t USING (trajectory_id)
            ORDER BY p.selection_rank, p.turn_id""").fetch_record_batch(batch_size)
        for batch in reader:
            for row in batch.to_pylist():
                yield _checked_pivot(row)
    finally:
        con.close()


def _rewards_sql(rewards_path: str, pivot_columns: set[str]) -> str:
    """A correlated subquery: the pivot's per-sample rewards in sample order, those of its profile's key below its
    k (what turn_profiles averaged: profiling/profiler.profiles_sql; a larger budget's samples share the key)."""
    key = [c for c in ("turn_id", "policy_fp", "sampling_fp", "verifier_fp") if c in pivot_columns]
    on = " AND ".join(f"r.{c} IS NOT DISTINCT FROM p.{c}" for c in key)  # as the turn_profiles contract joins
    return (f"(SELECT list(r.reward ORDER BY r.sample_index) FROM read_parquet('{rewards_path}') r "
            f"WHERE {on} AND r.sample_index < p.k)")


def pivot_rewards(pivots: pl.DataFrame, rewards: pl.DataFrame) -> pl.DataFrame:
    """The pivots with `rewards` (as stream_pivot_states adds it), for the in-memory exports."""
    key = [c for c in ("turn_id", "policy_fp", "sampling_fp", "verifier_fp") if c in pivots.columns]
    lists = (pivots.select(*key, "k").join(rewards, on=key, nulls_equal=True).filter(pl.col("sample_index") < pl.col("k"))
             .sort("sample_index").group_by(key, maintain_order=True).agg(pl.col("reward").alias("rewards")))
    return pivots.join(lists, on=key, how="left", nulls_equal=True, maintain_order="left")


def _checked_pivot(row: dict) -> tuple[dict, list[dict], list[dict]]:
    if not row.pop("_found"):
        raise ValueError(f"pivot {row['turn_id']}: trajectory {row['trajectory_id']} not in trajectories")
    index, n = row["message_index"], row.pop("_n_messages")
    if not 0 <= index < n or row.pop("_target_role") != "assistant":
        raise ValueError(f"pivot {row['turn_id']}: message_index {index} is not an assistant message of its trajectory")
    state, tools = row.pop("_state"), row.pop("_tools")
    return row, state, _parse_tools(tools)


def to_hf_dataset(pivots: pl.DataFrame, trajectories: pl.DataFrame):
    """The pivot set as a `datasets.Dataset` with TRL-ready columns (see the module docstring)."""
    from datasets import Dataset

    return Dataset(hf_table(iter_pivot_states(pivots, trajectories)))


def hf_table(pivot_states: Iterable[tuple[dict, list[dict], list[dict]]]) -> pa.Table:
    """HF rows as an Arrow table in the dataset's schema (Json `arguments` written as text into its storage)."""
    rows = [hf_row(pivot, state, tools) for pivot, state, tools in pivot_states]
    return pa.Table.from_batches([_hf_batch(rows)])  # one batch even when empty: `datasets` needs a chunk


def _hf_batch(rows: list[dict]) -> pa.RecordBatch:
    target = _hf_features().arrow_schema
    return pa.RecordBatch.from_pylist(rows, schema=_storage_schema(target)).cast(target)


def hf_row(pivot: dict, state: list[dict], tools: list[dict]) -> dict:
    return {"prompt": _hf_messages(state), "tools": canonical_json(tools),
            **{name: pivot.get(name) for name in (*PIVOT_COLUMNS, *PROFILE_STATS, *OPTIONAL_TRAJECTORY_COLUMNS)}}


def export_hf(pivot_states: Iterable[tuple[dict, list[dict], list[dict]]], out_dir: str | Path,
              batch_size: int = EXPORT_BATCH) -> int:
    """Write a pivot set as a Hugging Face dataset dir (save_to_disk layout) in batches; returns the row count.

    Batches are appended to one Arrow stream file in a temp dir beside `out_dir`, which `datasets` then memory-maps
    and saves: no step holds the whole set."""
    import shutil
    import tempfile

    from datasets import Dataset

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".tmp-hf-") as tmp:
        arrow_file = Path(tmp) / "pivots.arrow"
        with pa.OSFile(str(arrow_file), "wb") as sink, pa.ipc.new_stream(sink, _hf_features().arrow_schema) as writer:
            for batch in _batched(pivot_states, batch_size):
                writer.write_batch(_hf_batch([hf_row(pivot, state, tools) for pivot, state, tools in batch]))
                n += len(batch)
            if n == 0:
                writer.write_batch(_hf_batch([]))  # an empty set is still one (empty) batch: `datasets` needs one
        dataset = Dataset.from_file(str(arrow_file))
        staged = Path(tmp) / "dataset"
        # datasets 5.x writes an empty dataset as zero shards, which load_from_disk cannot read back
        dataset.save_to_disk(str(staged), num_shards=1 if n == 0 else None)
        del dataset
        if out.exists():
            shutil.rmtree(out)
        staged.replace(out)
    return n


def export_nemo_gym(pivot_states: Iterable[tuple[dict, list[dict], list[dict]]], path: str | Path,
                    agent_name: str = DEFAULT_AGENT_NAME, profile_key: str = DEFAULT_PROFILE_KEY) -> int:
    """Write a pivot set as NeMo-Gym pivot JSONL, row by row (atomically); returns the row count."""
    return write_jsonl(nemo_gym_rows(pivot_states, agent_name, profile_key), path)


def _batched(items: Iterable, size: int) -> Iterator[list]:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _storage_schema(schema: pa.Schema) -> pa.Schema:
    """The schema with every extension type (Json) replaced by its storage type (text)."""
    def storage(t: pa.DataType) -> pa.DataType:
        if isinstance(t, pa.BaseExtensionType):
            return t.storage_type
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(storage(t.value_type))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, storage(f.type)) for f in t])
        return t

    return pa.schema([pa.field(f.name, storage(f.type)) for f in schema])


def save_hf(dataset, out_dir: str | Path) -> Path:
    """save_to_disk into out_dir (created); load it back with datasets.load_from_disk(out_dir)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dataset.save_to_disk(str(out), num_shards=1 if len(dataset) == 0 else None)  # see export_hf
    return out


def to_nemo_gym_rows(pivots: pl.DataFrame, trajectories: pl.DataFrame, agent_name: str = DEFAULT_AGENT_NAME,
                     profile_key: str = DEFAULT_PROFILE_KEY, rewards: pl.DataFrame | None = None) -> Iterator[dict]:
    """NeMo-Gym pivot rows (single_step_tool_use_with_argument_comparison shape), one per pivot; `rewards`
    (rollout_rewards) fills the profile's per-sample rewards."""
    if rewards is not None:
        pivots = pivot_rewards(pivots, rewards)
    return nemo_gym_rows(iter_pivot_states(pivots, trajectories), agent_name, profile_key)


def check_profile_key(profile_key: str) -> str:
    """The profile object's name: a JSON key that is not one of the row's other keys."""
    if not profile_key or not profile_key.strip() or profile_key in NEMO_GYM_ROW_KEYS:
        raise ValueError(f"profile key {profile_key!r} must be a non-empty name other than {', '.join(NEMO_GYM_ROW_KEYS)}")
    return profile_key


def nemo_gym_rows(pivot_states: Iterable[tuple[dict, list[dict], list[dict]]],
                  agent_name: str = DEFAULT_AGENT_NAME, profile_key: str = DEFAULT_PROFILE_KEY) -> Iterator[dict]:
    check_profile_key(profile_key)
    for pivot, state, tools in pivot_states:
        expected = json.loads(pivot["expert_action"])
        k, n_pass = pivot.get("k"), pivot.get("n_pass")
        yield {
            "trajectory_id": pivot.get("trajectory_id"),
            "responses_create_params": {
                "input": responses_items(state),
                "tools": [flat_tool(t) for t in tools],
                "tool_choice": "auto",
                "parallel_tool_calls": expected.get("type") == "function_call_batch",
            },
            "expected_action": expected,
            profile_key: {"rewards": pivot.get("rewards"), **{name: pivot.get(name) for name in REWARD_STATS}},
            "agent_ref": {"type": "responses_api_agents", "name": agent_name},
            "pass_rate": pass_rate(k, n_pass),
            "pass_rate_total": k,
            "pass_rate_passed": n_pass,
            "metadata": {name: pivot.get(name) for name in ("turn_id", "trajectory_id", "conversation_id", "domain",
                                                            "pivot_set", "selection_rank", *PROFILE_STATS)},
        }


def pass_rate(k: int | None, n_pass: int | None) -> float | None:
    """The share of a profile's samples that pass (n_pass counts them by the verifier's pass_threshold): never the
    mean reward, which a continuous reward makes another number. None without samples or a count."""
    return n_pass / k if k and n_pass is not None else None


def write_jsonl(rows: Iterable[dict], path: str | Path) -> int:
    """Write rows as JSON lines (atomically: temp file, then rename); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    return n


# -- shapes ---------------------------------------------------------------------------------------


def responses_items(messages: list[dict]) -> list[dict]:
    """Canonical messages -> OpenAI Responses input items (the NeMo-Gym `input` list)."""
    items: list[dict] = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role in ("system", "user"):
            items.append({"type": "message", "role": role, "content": m.get("content") or ""})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": m.get("content") or ""})
        elif role == "assistant":
            items.extend(_assistant_items(m, i))
        else:
            raise ValueError(f"message {i}: unknown role {role!r}")
    return items


def _assistant_items(message: dict, index: int) -> list[dict]:
    items: list[dict] = []
    if message.get("reasoning"):
        items.append({"type": "reasoning", "id": f"rs_{index}", "summary": [{"type": "summary_text", "text": message["reasoning"]}]})
    if message.get("content"):
        items.append({
            "type": "message", "role": "assistant", "id": f"msg_{index}", "status": "completed",
            "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
        })
    for call in message.get("tool_calls") or []:
        items.append({"type": "function_call", "call_id": call["id"], "name": call["name"], "arguments": call["arguments"]})
    return items


def flat_tool(tool: dict) -> dict:
    """Chat tool schema {type, function: {name, description, parameters}} -> Responses' flat schema."""
    fn = tool.get("function", tool)
    return {"type": "function", "name": fn["name"], "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}}}


def _hf_messages(state: list[dict]) -> list[dict]:
    """Chat-template messages with every key present (Arrow needs one struct shape per column); tool-call
    arguments as canonical JSON text of an object (the Json column's storage; it reads back as a dict), reasoning
    dropped and content None as "" (core.shapes.to_template_messages)."""
    out = []
    for m in state:
        calls = [{"type": "function", "function": {"name": c["name"],
                                                   "arguments": canonical_json(arguments_dict(c["name"], c.get("arguments")))}}
                 for c in m.get("tool_calls") or []]
        # [] rather than null for a message without calls: pyarrow cannot flatten a null list whose items hold
        # a Json extension column ("MakeBuilder: cannot construct builder for type extension<arrow.json>"), and
        # `datasets` flattens when it saves; chat templates read [] and null alike (falsy).
        out.append({"role": m["role"], "content": m.get("content") or "", "tool_calls": calls,
                    "tool_call_id": m.get("tool_call_id") or None})
    return out


def _hf_features():
    from datasets import Features, Json, List, Value

    tool_call = {"type": Value("string"), "function": {"name": Value("string"), "arguments": Json()}}
    message = {"role": Value("string"), "content": Value("string"), "tool_calls": List(tool_call), "tool_call_id": Value("string")}
    scalars = {
        "turn_id": "string", "trajectory_id": "string", "domain": "string", "message_index": "int64",
        "action_kind": "string", "expert_action": "string", "selection_rank": "int64", "pivot_set": "string",
        "policy_fp": "string", "verifier_fp": "string", "k": "int64", "reward_mean": "float64",
        "reward_var": "float64", "reward_std": "float64", "n_pass": "int64", "n_distinct_actions": "int64",
        "pass_threshold": "float64",
        "conversation_id": "string", "environment": "string",
    }
    return Features({"prompt": List(message), "tools": Value("string"), **{k: Value(v) for k, v in scalars.items()}})


def _parse_tools(tools: Any) -> list[dict]:
    if tools is None or tools == "":
        return []
    parsed = json.loads(tools) if isinstance(tools, str) else tools
    if not isinstance(parsed, list):
        raise ValueError(f"trajectory tools are a JSON {type(parsed).__name__}, expected a list")
    return parsed


def _require(frame: pl.DataFrame, columns: Iterable[str], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} lacks columns {missing}")
