"""The scoring loop of `pivot verify` (pivot_jobs/cli.py): JSONL pairs in, one verdict line per pair out.

Input lines:  {"expected_action": action, "candidate": raw text or action, "tools": [...]?, "state": [...]?,
               "domain": str?, "environment": {...}?, "earlier_calls": [[call, ...], ...]?}
An executable case (scored by `executed_state`) adds `environment`, the trajectory's world: for BFCL multi-turn
{"kind": "bfcl_multi_turn", "involved_classes": [...], "initial_config": {...}, "long_context": false}; and the
expert's calls before the step either as `state` messages (assistant tool calls; a user message starts a BFCL
turn) or as `earlier_calls`: BFCL turns, each a list of calls, a call being BFCL's call text
("cd(folder='docs')", positional arguments named from the tool's signature) or {"name", "arguments"}.
Output lines, one per input line, in order: {"reward": float, "reason": str, "detail": str}, or
{"error": "..."} for a line that cannot be scored (bad JSON, missing keys, malformed expert action).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Iterable, TextIO

from pivot_assets.environments import CallFailed, TurnState, parse_environment

from .domains import DomainVerifiers
from .llm_judge import judge_stats
from .parsing import prepare_expected
from .registry import build_verifier

_CHUNK = 1024  # lines scored per batch: bounded memory, and a judge still sees batches


def _check_line(line: str) -> tuple[dict | None, str | None]:
    """A parsed input row, or (None, error) explaining why this line cannot be scored."""
    if not line.strip():
        return None, "empty line"
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as e:
        return None, f"invalid JSON: {str(e)[:120]}"
    if not isinstance(row, dict):
        return None, "line must be a JSON object"
    for key in ("expected_action", "candidate"):
        if key not in row:
            return None, f"missing key {key!r}"
    if row.get("domain") is not None and not isinstance(row["domain"], str):
        return None, "'domain' must be a string"
    if row.get("state") is not None and not isinstance(row["state"], list):
        return None, "'state' must be a list of messages"
    if row.get("tools") is not None and not isinstance(row["tools"], (list, str)):
        return None, "'tools' must be a list or its JSON text"
    if row.get("environment") is not None:
        try:
            row["state"] = _executable_state(row)
        except ValueError as e:
            return None, str(e)
    expected, err = prepare_expected(row["expected_action"])
    if expected is None:
        return None, err
    return row, None


def _executable_state(row: dict) -> TurnState:
    """The case's state with its environment; `earlier_calls` (BFCL turns of calls) become the messages."""
    environment = row["environment"]
    env, context = parse_environment(environment)  # ValueError names what is wrong
    turns = row.get("earlier_calls")
    if turns is None:
        return TurnState(row.get("state") or [], environment)
    if not isinstance(turns, list) or not all(isinstance(t, list) for t in turns):
        raise ValueError("'earlier_calls' must be a list of turns, each a list of calls")
    world, messages = None, []
    for turn in turns:
        messages.append({"role": "user", "content": ""})
        for call in turn:
            if isinstance(call, str):
                try:
                    name, args, kwargs = env.parse_call(call)
                    world = world if world is not None else env.fresh(context)
                    arguments = env.bind(world, name, args, kwargs)
                except CallFailed as e:
                    raise ValueError(f"earlier call {call!r}: {e}") from None
            elif isinstance(call, dict) and isinstance(call.get("name"), str):
                name, arguments = call["name"], call.get("arguments") or {}
            else:
                raise ValueError(f"earlier call must be call text or {{name, arguments}}, got {call!r:.80}")
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": arguments}}]})
    return TurnState(messages, environment)


def verify_jsonl(in_lines: Iterable[str], out: TextIO, verifiers: DomainVerifiers,
                 verifier_name: str | None = None) -> dict:
    """Score every input line and write one output line per input line; returns counts.

    verifier_name: a registered verifier (default parameters) used for every line, overriding the domains.
    """
    override = build_verifier({"name": verifier_name}) if verifier_name else None
    counts: Counter = Counter()
    reasons: Counter = Counter()
    reward_sum = 0.0

    def flush(chunk: list[tuple[dict | None, str | None]]) -> None:
        nonlocal reward_sum
        rows = [row for row, _ in chunk if row is not None]
        scores = override.score_many(rows) if override else verifiers.score_rows(rows)
        it = iter(scores)
        for row, err in chunk:
            if row is None:
                counts["errors"] += 1
                out.write(json.dumps({"error": err}) + "\n")
                continue
            s = next(it)
            counts["scored"] += 1
            reasons[s.reason] += 1
            reward_sum += s.reward
            out.write(json.dumps({"reward": s.reward, "reason": s.reason, "detail": s.detail}) + "\n")

    chunk: list[tuple[dict | None, str | None]] = []
    for line in in_lines:
        counts["lines"] += 1
        chunk.append(_check_line(line))
        if len(chunk) >= _CHUNK:
            flush(chunk)
            chunk = []
    if chunk:
        flush(chunk)
    judges = Counter()
    for v in [override] if override else [verifiers.default, *verifiers.domains.values()]:
        judges.update(judge_stats(v))
    return {
        "lines": counts["lines"], "scored": counts["scored"], "errors": counts["errors"],
        "mean_reward": reward_sum / counts["scored"] if counts["scored"] else None,
        "reasons": dict(reasons), "judge": dict(judges),
    }
