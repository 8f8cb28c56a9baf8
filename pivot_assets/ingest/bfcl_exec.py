"""BFCL multi-turn ground-truth calls, executed by BFCL's own simulated APIs (Dagster-free).

BFCL keeps a multi-turn answer as call strings ("cd(folder='document')", "sort('final_report.pdf')"). A call is
parsed with `ast` (only literal arguments; nothing is ever evaluated), its positional arguments are named from the
method's signature, and it runs on the instance of the involved class that has the method, as BFCL's
multi_turn_utils.execute_multi_turn_func_call does: one instance per involved class, made fresh for each
conversation, loaded with `_load_scenario(deepcopy(initial_config[class]), long_context=...)` unless the class is
stateless; a method name two classes share goes to the later class. The result text is BFCL's: a str as it is,
a dict as json.dumps (str() when that fails), anything else as str().

A call BFCL itself would report as an error (it raises, or returns a dict with an "error" key) is a BFCLError
"bfcl_call_failed" here: the record is quarantined, never ingested with a failed call as the expert's.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from typing import Any

from .bfcl import BFCLError


def backend():
    """bfcl-eval's executable-backend constants (class -> module, stateless classes, function doc files)."""
    try:
        from bfcl_eval.constants import executable_backend_config
    except ImportError as exc:
        raise BFCLError(f"bfcl_unavailable: the bfcl-eval package is not installed ({exc}); `make setup` installs it")
    return executable_backend_config


def parse_call(text: str) -> tuple[str, list, dict]:
    """`name(arg, key=value)` -> (name, positional values, keyword values); literals only."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise BFCLError(f"bfcl_call: {text!r} is not a call ({exc.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise BFCLError(f"bfcl_call: {text!r} is not a call of a function by name")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise BFCLError(f"bfcl_call: {text!r} unpacks arguments")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
        raise BFCLError(f"bfcl_call: {text!r} has an argument that is not a literal") from None
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


class Session:
    """Fresh instances of a conversation's involved classes, ready to run its ground-truth calls in order."""

    def __init__(self, involved_classes: list[str], initial_config: dict, long_context: bool = False):
        backend_ = backend()
        self.methods: dict[str, Any] = {}
        for class_name in involved_classes:
            module_name = backend_.CLASS_FILE_PATH_MAPPING.get(class_name)
            if module_name is None:
                raise BFCLError(f"bfcl_item: unknown involved class {class_name!r}")
            try:
                instance = getattr(importlib.import_module(module_name), class_name)()
            except ImportError as exc:
                raise BFCLError(f"bfcl_unavailable: BFCL's {class_name} cannot be imported ({exc})") from None
            if class_name not in backend_.STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=long_context)
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def call(self, text: str) -> tuple[str, dict, str]:
        """Run one call string: (function name, named arguments, result text)."""
        name, args, kwargs = parse_call(text)
        method = self.methods.get(name)
        if method is None:
            raise BFCLError(f"bfcl_call: {name!r} is no method of the involved classes")
        try:
            bound = inspect.signature(method).bind(*args, **kwargs)
        except TypeError as exc:
            raise BFCLError(f"bfcl_call_failed: {text!r}: TypeError: {exc}") from None
        try:
            value = method(*args, **kwargs)
        except Exception as exc:  # BFCL's own executor catches everything a simulated API raises
            raise BFCLError(f"bfcl_call_failed: {text!r}: {type(exc).__name__}: {exc}") from None
        if isinstance(value, dict) and "error" in value:
            raise BFCLError(f"bfcl_call_failed: {text!r} returned an error: {str(value['error'])[:200]}")
        return name, dict(bound.arguments), result_text(value)
