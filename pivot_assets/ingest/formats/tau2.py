"""tau2: tau2-bench results files, one record per simulation.

`simulations[].messages`; tool calls {id, name, arguments(object)}; tool results are `role: tool` with `id` = the
call id; reward from `reward_info.reward`; domain from `info.environment_info.domain_name`; the policy text
(simulation `policy` or info.environment_info.policy) becomes the leading system message (tau2's agent wraps it in
its own instruction template; we keep the policy verbatim). tau2 results store no tool schemas
(`environment_info.tool_defs` is null in the shared run), so tools are "[]" unless `environment_info.tool_defs` /
`tools` holds a list. A simulation is detected by its `reward_info`, or by sitting in a results file (`info` /
`tasks` beside `simulations`). A simulation of an executable domain (airline, retail: environments/tau2.py) keeps
its environment, {"kind": "tau2", "domain", "task_id", "initial_state"} with the initial state of its task in the
results file's `tasks`, so the `executed_state` verifier judges its turns by the databases they change.
"""

from __future__ import annotations


from pivot_assets.environments.tau2 import context as environment_context

from .messages import chat_messages, message, record_domain
from .records import Origin, RecordError
from .registry import Format, register


def adapt_tau2(value: dict, origin: Origin) -> dict:
    """One tau2-bench simulation; `origin.file` is the results file minus its simulations."""
    context = origin.file
    env = ((context.get("info") or {}).get("environment_info") or {}) if isinstance(context.get("info"), dict) else {}
    messages = chat_messages(value.get("messages"))
    policy = value.get("policy") or env.get("policy")
    if isinstance(policy, str) and policy and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, message("system", policy))
    tools = next((t for t in (env.get("tool_defs"), env.get("tools"), value.get("tools")) if isinstance(t, list)), None)
    reward_info = value.get("reward_info")
    if reward_info is not None and not isinstance(reward_info, dict):
        raise RecordError("wrong_type", f"reward_info is {type(reward_info).__name__}")
    reward = (reward_info or {}).get("reward", value.get("reward"))
    domain = env.get("domain_name") or record_domain(value)
    task_id = value.get("task_id")
    environment = environment_context(domain, task_id, _task(context, task_id).get("initial_state"))
    return {"messages": messages, "tools": tools, "reward": reward, "domain": domain, "environment": environment}


def _task(file: dict, task_id) -> dict:
    """The results file's task of a simulation ({} when the file has none of that id)."""
    if task_id is None:
        return {}
    tasks = file.get("tasks") if isinstance(file, dict) else None
    return next((t for t in tasks or () if isinstance(t, dict) and str(t.get("id")) == str(task_id)), {})


def is_simulation(value: dict, file: dict | None) -> bool:
    in_results_file = bool(file) and "simulations" not in value and "messages" in value and (
        "info" in file or "tasks" in file)
    return "reward_info" in value or in_results_file


register(Format(
    name="tau2", description="tau2-bench results, `simulations[].messages` with `reward_info` and the policy",
    keys=("messages",), adapt=adapt_tau2, detect=is_simulation, json_keys=("messages", "reward_info")))
