"""Verifier registry: name -> class. Each verifier module registers its class (`@register`) when imported.

This module imports no verifier module, so a verifier that nests others (stack, tool_call's and tool_name's
text verifier) imports `build_verifier` from here at module level without an import cycle. The package
`__init__` imports every verifier module, and importing any module of the package runs it first, so the
registry is complete before anything can be built.
"""

from __future__ import annotations

from typing import TypeVar

from .base import Verifier

# The package __init__ swaps this table for user_verifiers.VerifierTable, a dict that also resolves `module:Class`
# and entry-point names: the lookup lives there because the code of this file is in every built-in verifier's
# fingerprint (code_version.py), so a code change here re-scores every warehouse; comments are not hashed.
_CLASSES: dict[str, type[Verifier]] = {}
V = TypeVar("V", bound=type[Verifier])


def register(cls: V) -> V:
    """Class decorator: make a verifier buildable by its `name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no verifier name")
    known = _CLASSES.get(cls.name)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"verifier name {cls.name!r} registered by {known.__module__} and {cls.__module__}")
    _CLASSES[cls.name] = cls
    return cls


def verifier_names() -> list[str]:
    return sorted(_CLASSES)


def build_verifier(spec: dict | str) -> Verifier:
    """`{"name": "tool_call", **params}` (or just a name) -> Verifier; ValueError naming any bad part."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"verifier spec must be a mapping with a 'name', got {spec!r:.80}")
    name = spec["name"]
    if name not in _CLASSES:
        raise ValueError(f"unknown verifier {name!r} (known: {', '.join(verifier_names())})")
    params = {k: v for k, v in spec.items() if k != "name"}
    return _CLASSES[name](**params)
