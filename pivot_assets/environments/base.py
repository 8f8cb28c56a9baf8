"""The environment seam: one small interface between a verifier that executes and the world it executes in.

An environment kind rebuilds the world of a trajectory at a step (fresh from the trajectory's context, then the
expert's earlier calls executed), executes a call on a world, copies a world, and says how two worlds differ in
what is observable. Nothing here knows a benchmark; bfcl.py is the first kind. A world is whatever the kind
needs (BFCL: its simulated API instances); only the kind touches it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, ClassVar, NamedTuple


class CallFailed(ValueError):
    """A call the world cannot run: category (unknown_tool, missing_argument, extra_argument, bad_arguments,
    raised, not_a_call) and a detail; str() is "category: detail", as a quarantine reason is."""

    def __init__(self, category: str, detail: str) -> None:
        super().__init__(f"{category}: {detail}")
        self.category, self.detail = category, detail


@lru_cache(maxsize=256)
def _signature(cls: type, name: str):
    import inspect

    return inspect.signature(getattr(cls, name))


def bind_method(cls: type, name: str, args: Sequence = (), kwargs: dict | None = None) -> dict:
    """A call's arguments by name, bound to method `name` of `cls` as Python would bind them (self left out), or
    CallFailed missing_argument / extra_argument / bad_arguments."""
    signature = _signature(cls, name)
    try:
        bound = signature.bind(None, *args, **(kwargs or {}))  # None stands for self
    except TypeError as exc:
        message = str(exc)
        category = ("missing_argument" if "missing" in message else
                    "extra_argument" if "unexpected" in message or "too many" in message else "bad_arguments")
        raise CallFailed(category, f"{name}: {message}") from None
    named = dict(bound.arguments)
    named.pop(next(iter(signature.parameters)), None)  # self
    return named


class Outcome(NamedTuple):
    """What one executed call gave: its result text (what the model is shown) and, when the call reported an
    error instead of raising (BFCL: a dict with an "error" key), that error."""

    text: str
    error: str | None = None


class Environment(ABC):
    """One kind of executable environment (module docstring)."""

    kind: ClassVar[str] = ""

    @abstractmethod
    def fresh(self, context: dict) -> Any:
        """A new world from a trajectory's context (the environment JSON minus its kind); ValueError when bad."""

    @abstractmethod
    def copy(self, world: Any) -> Any:
        """An independent copy: executing on it never changes `world`."""

    @abstractmethod
    def bind(self, world: Any, name: str, args: Sequence = (), kwargs: dict | None = None) -> dict:
        """The call's arguments by name (positional ones named from the tool's signature); CallFailed when the
        world has no such tool or the arguments do not fit it."""

    @abstractmethod
    def execute(self, world: Any, name: str, arguments: dict) -> Outcome:
        """Run one call (arguments by name) on `world`, changing it; CallFailed when it cannot run or raises."""

    @abstractmethod
    def differences(self, world: Any, reference: Any, working_state: bool = True) -> str | None:
        """None when the observable state of `world` equals `reference`'s, else the first difference, short;
        working_state: also the hidden state the next calls read (a working directory), where the kind has one."""

    def parse_call(self, text: str) -> tuple[str, list, dict]:
        """A call written as text in the kind's own notation -> (name, positional values, keyword values)."""
        raise CallFailed("not_a_call", f"{self.kind} takes calls as {{name, arguments}}, not as text")

    def code_version(self) -> str:
        """What verdicts depend on beyond this package's code (e.g. the installed simulator's version)."""
        return ""

    def rebuild(self, context: dict, earlier_calls: Sequence[tuple[str, dict]]) -> tuple[Any, list[Outcome]]:
        """The world at a step: fresh from the context, the expert's earlier calls executed in order; with what
        each of them gave."""
        world = self.fresh(context)
        return world, [self.execute(world, name, arguments) for name, arguments in earlier_calls]


_KINDS: dict[str, type[Environment]] = {}


def register(cls: type[Environment]) -> type[Environment]:
    """Class decorator: make an environment kind known by its `kind`."""
    _KINDS[cls.kind] = cls
    return cls


@contextmanager
def kind_replaced(cls: type[Environment]) -> Iterator[None]:
    """Within the block, `cls` is the environment of its kind (a bench times another implementation of a kind
    through the same verifier); the registered one is back after it."""
    previous = _KINDS.get(cls.kind)
    _KINDS[cls.kind] = cls
    environment_for.cache_clear()
    try:
        yield
    finally:
        if previous is None:
            _KINDS.pop(cls.kind, None)
        else:
            _KINDS[cls.kind] = previous
        environment_for.cache_clear()


def environment_kinds() -> list[str]:
    return sorted(_KINDS)


@lru_cache(maxsize=64)
def environment_for(kind: str) -> Environment:
    """The environment of a kind (one instance per process); ValueError naming the known kinds."""
    if kind not in _KINDS:
        raise ValueError(f"unknown environment kind {kind!r} (known: {', '.join(environment_kinds()) or 'none'})")
    return _KINDS[kind]()


@lru_cache(maxsize=1024)
def _parse_text(text: str) -> tuple[str, str]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"environment is not JSON text ({exc})") from None
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise ValueError("environment must be a JSON object with a string 'kind'")
    return value["kind"], text


def parse_environment(value: str | dict) -> tuple[Environment, dict]:
    """(the kind's environment, its context) of a trajectory's environment (JSON text or its object)."""
    if isinstance(value, str):
        kind, text = _parse_text(value)
        context = _context(text)
    elif isinstance(value, dict) and isinstance(value.get("kind"), str):
        kind, context = value["kind"], {k: v for k, v in value.items() if k != "kind"}
    else:
        raise ValueError("environment must be a JSON object with a string 'kind'")
    return environment_for(kind), context


@lru_cache(maxsize=1024)
def _context(text: str) -> dict:
    return {k: v for k, v in json.loads(text).items() if k != "kind"}


class TurnState(list):
    """A turn's state as verifiers receive it: the messages before the turn (it is that list) and the
    trajectory's `environment` (JSON text or object; None when the trajectory is not executable). Verifiers that
    read messages see a list as before; an executing verifier reads `.environment`."""

    __slots__ = ("environment",)

    def __init__(self, messages: Sequence = (), environment: str | dict | None = None) -> None:
        super().__init__(messages)
        self.environment = environment


def environment_versions() -> dict[str, str]:
    """{kind: code_version()} of every known kind (a verifier that executes puts this in its fingerprint)."""
    return {kind: environment_for(kind).code_version() for kind in environment_kinds()}


@lru_cache(maxsize=1)
def environments_code_hash() -> str:
    """sha256 (16 hex chars) of this package's sources: a verdict that executes depends on them."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\n" + path.read_bytes())
    return digest.hexdigest()[:16]
