"""Pivot-set exports (Dagster-free): a Hugging Face dataset for TRL and NeMo-Gym pivot JSONL for NeMo-RL.

Both rebuild each pivot's state from `trajectories.messages[:message_index]` (schema.rebuild_state) and
carry the trajectory's tools, the expert action and the profile stats.

HF (`to_hf_dataset`), one row per pivot:
  prompt         the state as chat messages in the Hugging Face / OpenAI shape the chat templates read:
                 {role, content (str, "" when none), tool_calls: [{type: "function", function: {name,
                 arguments: dict}}] | None, tool_call_id: str | None}; reasoning is dropped, as when the
                 profiling prompts were rendered (core.shapes.to_template_messages).
                 Stored with features.Json for `arguments`, so heterogeneous argument objects do not get
                 merged into one Arrow struct (which would add every other call's keys as nulls).
  tools          JSON text of the trajectory's chat tool schemas. TRL's SFT/DPO trainers json.loads a str
                 `tools`; GRPOTrainer 1.16 never renders a per-row `tools` column into the prompt (it renders
                 conversational prompts with its trainer-wide `tools=` callables) and only passes extra
                 columns to reward functions, so a trainer that must show each pivot's tools renders the
                 prompt itself (pivot_assets/grpo.py does).
  expert_action  JSON text of the action (DESIGN.md shape).
  turn_id, trajectory_id, domain, message_index, action_kind, pivot_set, selection_rank and the profile
  stats (policy_fp, verifier_fp, k, reward_mean, reward_var, reward_std, n_pass, n_distinct_actions).

NeMo-Gym (`to_nemo_gym_rows`), the single_step_tool_use_with_argument_comparison row shape:
  {"responses_create_params": {"input": [Responses items], "tools": [flat tool schemas],
                               "tool_choice": "auto", "parallel_tool_calls": bool},
   "expected_action": {...}, "agent_ref": {"type": "responses_api_agents", "name": agent_name},
   "metadata": {turn_id, trajectory_id, domain, pivot_set, selection_rank, profile stats}}
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

from pivot_assets.core.shapes import to_template_messages
from pivot_assets.core.ids import canonical_json
from pivot_assets.core.shapes import rebuild_state

DEFAULT_AGENT_NAME = "single_step_tool_use_with_argument_comparison_agent"
PROFILE_STATS = ("policy_fp", "verifier_fp", "k", "reward_mean", "reward_var", "reward_std", "n_pass", "n_distinct_actions")
PIVOT_COLUMNS = ("turn_id", "trajectory_id", "domain", "message_index", "action_kind", "expert_action", "selection_rank", "pivot_set")
TRAJECTORY_COLUMNS = ("trajectory_id", "messages", "tools")


def iter_pivot_states(pivots: pl.DataFrame, trajectories: pl.DataFrame) -> Iterator[tuple[dict, list[dict], list[dict]]]:
    """(pivot row, state messages, chat tool schemas) per pivot, in selection order.

    Raises ValueError naming the first pivot whose trajectory is missing or whose message_index does
    not point at an assistant message (a pivot is never exported with a wrong state).
    """
    _require(pivots, PIVOT_COLUMNS, "pivots")
    _require(trajectories, TRAJECTORY_COLUMNS, "trajectories")
    wanted = pivots["trajectory_id"].unique()
    subset = trajectories.filter(pl.col("trajectory_id").is_in(wanted.implode())).select(TRAJECTORY_COLUMNS)
    by_id = {r["trajectory_id"]: r for r in subset.iter_rows(named=True)}
    for pivot in pivots.iter_rows(named=True):
        trajectory = by_id.get(pivot["trajectory_id"])
        if trajectory is None:
            raise ValueError(f"pivot {pivot['turn_id']}: trajectory {pivot['trajectory_id']} not in trajectories")
        messages, index = trajectory["messages"], pivot["message_index"]
        if not 0 <= index < len(messages) or messages[index]["role"] != "assistant":
            raise ValueError(f"pivot {pivot['turn_id']}: message_index {index} is not an assistant message of its trajectory")
        yield pivot, rebuild_state(messages, index), _parse_tools(trajectory["tools"])


def to_hf_dataset(pivots: pl.DataFrame, trajectories: pl.DataFrame):
    """The pivot set as a `datasets.Dataset` with TRL-ready columns (see the module docstring)."""
    from datasets import Dataset

    columns: dict[str, list] = {name: [] for name in _hf_features()}
    for pivot, state, tools in iter_pivot_states(pivots, trajectories):
        columns["prompt"].append(_hf_messages(state))
        columns["tools"].append(canonical_json(tools))
        for name in (*PIVOT_COLUMNS, *PROFILE_STATS):
            columns[name].append(pivot.get(name))
    return Dataset.from_dict(columns, features=_hf_features())


def save_hf(dataset, out_dir: str | Path) -> Path:
    """save_to_disk into out_dir (created); load it back with datasets.load_from_disk(out_dir)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dataset.save_to_disk(str(out))
    return out


def to_nemo_gym_rows(pivots: pl.DataFrame, trajectories: pl.DataFrame, agent_name: str = DEFAULT_AGENT_NAME) -> Iterator[dict]:
    """NeMo-Gym pivot rows (single_step_tool_use_with_argument_comparison shape), one per pivot."""
    for pivot, state, tools in iter_pivot_states(pivots, trajectories):
        expected = json.loads(pivot["expert_action"])
        yield {
            "responses_create_params": {
                "input": responses_items(state),
                "tools": [flat_tool(t) for t in tools],
                "tool_choice": "auto",
                "parallel_tool_calls": expected.get("type") == "function_call_batch",
            },
            "expected_action": expected,
            "agent_ref": {"type": "responses_api_agents", "name": agent_name},
            "metadata": {name: pivot.get(name) for name in ("turn_id", "trajectory_id", "domain", "pivot_set", "selection_rank", *PROFILE_STATS)},
        }


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
    """Chat-template messages with every key present (Arrow needs one struct shape per column)."""
    out = []
    for m in to_template_messages(state):
        out.append({
            "role": m["role"],
            "content": m["content"],
            "tool_calls": m.get("tool_calls"),
            "tool_call_id": m.get("tool_call_id"),
        })
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
