"""The prompt guard: a turn whose rendered prompt does not fit the model's context with room for its completion is
not profiled; it is counted and listed with its reason in `skipped_turns` (shown in the pivot funnel).

The limit is `policy.max_prompt_tokens`, by default the model's context (config.json's max_position_embeddings)
minus `policy.max_new_tokens`. Prompts are rendered with the same template every engine renders with
(policies/models.render_prompt); a prompt whose UTF-8 size is within the limit fits without tokenizing (a
tokenizer's token never covers less than one byte), the rest are tokenized. A served model (backend: openai)
has no local tokenizer: its server rejects what does not fit, so the guard is off there.
"""

from __future__ import annotations

import json

import pyarrow as pa

from pivot_assets.core.catalog import SKIPPED_TURNS, SKIPPED_TURNS_SCHEMA
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.policies.factory import capabilities

PROMPT_TOO_LONG = "prompt_too_long"


def prompt_limit(policy, model: str) -> int | None:
    """The configured limit, else the model's context minus max_new_tokens; None where no local model says it."""
    if policy.max_prompt_tokens is not None:
        return policy.max_prompt_tokens
    if not capabilities(policy.backend).local_model:
        return None
    from pivot_assets.policies.models import context_length

    context = context_length(model)
    return None if context is None else max(context - policy.max_new_tokens, 1)


def too_long(requests: list, tokenizer, limit: int) -> list[dict]:
    """The skipped_turns rows of the requests whose rendered prompt has more than `limit` tokens."""
    from pivot_assets.policies.models import render_prompt

    rows = []
    for r in requests:
        text = render_prompt(tokenizer, r.messages, r.tools)
        if len(text.encode("utf-8")) <= limit:
            continue
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n > limit:
            rows.append({"turn_id": r.turn_id, "trajectory_id": r.trajectory_id, "reason": PROMPT_TOO_LONG,
                         "n_prompt_tokens": n, "max_prompt_tokens": limit})
    return rows


def write_skipped(wh: Warehouse, rows: list[dict], shard: int | None) -> None:
    """The whole table unsharded (a rerun replaces it), one part per shard."""
    table = pa.Table.from_pylist(rows, schema=SKIPPED_TURNS_SCHEMA)
    if shard is None:
        wh.write_table(SKIPPED_TURNS, table)
    else:
        wh.append_part(SKIPPED_TURNS, table, shard=shard, key="skipped")


def skipped_line(rows: list[dict], limit: int | None) -> str:
    shown = json.dumps([(r["turn_id"], r["n_prompt_tokens"]) for r in rows[:5]])
    return (f"{len(rows)} turns not profiled: prompt longer than max_prompt_tokens={limit} "
            f"(turn, tokens: {shown}{' ...' if len(rows) > 5 else ''}; all in {SKIPPED_TURNS}, `pivot sql not_profiled`)")
