"""BFCL multi-turn as an environment: BFCL's own simulated APIs, run as its checker runs them.

Context (trajectories.environment minus its kind): {"involved_classes": [...], "initial_config": {class: config},
"long_context": bool}. A world is one instance per involved class, made fresh and loaded with
`_load_scenario(deepcopy(initial_config[class]), long_context=...)` unless the class is stateless, as
bfcl-eval's multi_turn_utils.execute_multi_turn_func_call does; a method name two classes share goes to the later
class. Calls are made by name with literal arguments (nothing is evaluated); a result's text is BFCL's: a str as
it is, a dict as json.dumps (str() when that fails), anything else as str(). The observable state is BFCL's
multi_turn_checker.state_checker's: every attribute not starting with `_`, compared with `==`.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from functools import lru_cache
from typing import Any, Sequence

from .base import CallFailed, Environment, Outcome, bind_method, register

KIND = "bfcl_multi_turn"


def backend():
    """bfcl-eval's executable-backend constants (class -> module, stateless classes, function doc files)."""
    try:
        from bfcl_eval.constants import executable_backend_config
    except ImportError as exc:
        raise CallFailed("bfcl_unavailable", f"the bfcl-eval package is not installed ({exc}); "
                                             "`make setup` installs it") from None
    return executable_backend_config


def context(involved_classes: list[str], initial_config: dict, long_context: bool) -> dict:
    """The environment JSON object of a BFCL multi-turn item (what ingest writes)."""
    return {"kind": KIND, "involved_classes": list(involved_classes), "initial_config": initial_config,
            "long_context": bool(long_context)}


def parse_call(text: str) -> tuple[str, list, dict]:
    """`name(arg, key=value)` -> (name, positional values, keyword values); literals only (CallFailed not_a_call)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise CallFailed("not_a_call", f"{text!r} is not a call ({exc.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise CallFailed("not_a_call", f"{text!r} is not a call of a function by name")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise CallFailed("not_a_call", f"{text!r} unpacks arguments")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
        raise CallFailed("not_a_call", f"{text!r} has an argument that is not a literal") from None
    return node.func.id, args, kwargs


def result_text(value: Any) -> str:
    """What BFCL's executor hands the model as a call's result."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class World:
    """The instances of one BFCL conversation, by class name, and which instance owns each method."""

    __slots__ = ("instances", "owner")

    def __init__(self, instances: dict[str, Any], owner: dict[str, str]) -> None:
        self.instances, self.owner = instances, owner


@lru_cache(maxsize=64)
def _public_methods(cls: type) -> tuple[str, ...]:
    return tuple(n for n, m in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_"))


@register
class BFCLMultiTurn(Environment):
    """BFCL's simulated APIs (module docstring)."""

    kind = KIND

    def fresh(self, context: dict) -> World:
        classes, config = context.get("involved_classes"), context.get("initial_config") or {}
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ValueError("bfcl_multi_turn environment: involved_classes is not a list of class names")
        if not isinstance(config, dict):
            raise ValueError("bfcl_multi_turn environment: initial_config is not a mapping")
        backend_ = backend()
        instances, owner = {}, {}
        for class_name in classes:
            module_name = backend_.CLASS_FILE_PATH_MAPPING.get(class_name)
            if module_name is None:
                raise ValueError(f"bfcl_multi_turn environment: unknown involved class {class_name!r}")
            try:
                instance = getattr(importlib.import_module(module_name), class_name)()
            except ImportError as exc:
                raise CallFailed("bfcl_unavailable", f"BFCL's {class_name} cannot be imported ({exc})") from None
            if class_name not in backend_.STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(config.get(class_name, {})),
                                        long_context=bool(context.get("long_context")))
            instances[class_name] = instance
            for name in _public_methods(type(instance)):
                owner[name] = class_name
        return World(instances, owner)

    def copy(self, world: World) -> World:
        return World(copy.deepcopy(world.instances), world.owner)  # owner is read-only, shared

    def bind(self, world: World, name: str, args: Sequence = (), kwargs: dict | None = None) -> dict:
        class_name = world.owner.get(name)
        if class_name is None:
            raise CallFailed("unknown_tool", f"{name!r} is no method of the involved classes")
        return bind_method(type(world.instances[class_name]), name, args, kwargs)

    def execute(self, world: World, name: str, arguments: dict) -> Outcome:
        named = self.bind(world, name, (), arguments)
        method = getattr(world.instances[world.owner[name]], name)
        try:
            # a copy: the simulated APIs keep argument lists in their state (a tweet's mentions) and mutate them
            # later, which must change neither the caller's values nor a recorded call
            value = method(**copy.deepcopy(named))
        except Exception as exc:  # BFCL's own executor catches everything a simulated API raises
            raise CallFailed("raised", f"{name}: {type(exc).__name__}: {str(exc)[:200]}") from None
        error = str(value["error"])[:200] if isinstance(value, dict) and "error" in value else None
        return Outcome(result_text(value), error)

    def differences(self, world: World, reference: World, working_state: bool = True) -> str | None:
        """BFCL's state_checker (public attributes); with `working_state`, also the private state later calls read
        (WORKING_STATE: the file system's current directory, by path; the car's brake forces and slope)."""
        for class_name, expected in reference.instances.items():
            got = world.instances.get(class_name)
            if got is None:
                return f"{class_name}: no instance"
            for attr, value in vars(expected).items():
                if attr.startswith("_"):
                    continue
                if getattr(got, attr, _MISSING) != value:
                    return f"{class_name}.{attr} differs"
            if working_state:
                for attr in WORKING_STATE.get(class_name, ()):
                    mine, theirs = _working(getattr(got, attr, _MISSING)), _working(getattr(expected, attr, _MISSING))
                    if mine != theirs:
                        return f"{class_name}.{attr} differs ({str(mine)[:60]} vs {str(theirs)[:60]})"
        return None

    def parse_call(self, text: str) -> tuple[str, list, dict]:
        return parse_call(text)

    def code_version(self) -> str:
        try:
            from importlib.metadata import version

            return f"bfcl-eval=={version('bfcl-eval')}"
        except Exception:  # not installed: verdicts are CallFailed bfcl_unavailable, whatever the version
            return "bfcl-eval absent"


_MISSING = object()
# Private attributes BFCL's state check skips (it checks at a turn's end) that the next calls of the turn depend on:
# where `cd` left the file system, what the brake and slope are. A step that changes them is not the expert's step.
WORKING_STATE = {"GorillaFileSystem": ("_current_dir",),
                 "VehicleControlAPI": ("_parkingBrakeForce", "_slopeAngle", "_brakePedalForce")}


def _working(value: Any) -> Any:
    """A working-state value as compared: a directory by its path from the root, anything else as it is."""
    if type(value).__name__ == "Directory":
        path = []
        while value is not None:
            path.append(value.name)
            value = value.parent
        return "/".join(reversed(path))
    return value
