"""tau2-bench results rewritten as OpenAI chat records: a second format for the same real conversations, which the
ingest tests and bench/bench_ingest.py feed through the openai adapter (and its SQL twin) to compare with the tau2
adapter's reading."""

from __future__ import annotations

import json


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
