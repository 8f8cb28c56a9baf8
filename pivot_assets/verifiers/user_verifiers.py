"""Verifiers from the user's own code: `module:Class` names and the `pivot_curation.verifiers` entry points.

A verifier name that is not a built-in one is looked up here, wherever a spec is built (`verifier:`, a stack's
steps, a text verifier, `pivot verify --verifier`):
- `my_rewards:ShippingVerifier` imports `my_rewards` from sys.path, else from the working directory or the
  directory of the config in force ($PIVOT_CONFIG, else ./pivot.yaml), and takes its class `ShippingVerifier`;
- any other name is an entry point of the group `pivot_curation.verifiers` of an installed package
  (`[project.entry-points."pivot_curation.verifiers"] shipping = "my_pkg.rewards:ShippingVerifier"`).
What is wrong with such a name (no module, no such class, not a verifier) is one ValueError line.

A user verifier's fingerprint covers its code: the instance built gets the version its class declares plus a
hash of the code of its class's module (comments aside, as code_version.py hashes the package) and of every
built-in verifier module it subclasses; base.Verifier.fingerprint hashes that version with name and config. A
module edited since this process imported it is reloaded, so the code that scores is the code hashed.

Why a table swapped into registry.py rather than code added there: registry.py and base.py are part of every
built-in verifier's fingerprint (code_version.py hashes the package modules a verifier imports), so a code
change in either would re-score every warehouse and retrain every GRPO run keyed by a verifier fingerprint.
No verifier imports this module, so it is in no fingerprint.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pivot_assets.core.config import resolve_config_path
from pivot_assets.core.ids import canonical_json, short_hash

from . import registry
from .base import Verifier
from .code_version import PACKAGE, _code_tokens, code_hash

ENTRY_POINT_GROUP = "pivot_curation.verifiers"
CONTRACT = ("a verifier is a subclass of pivot_assets.verifiers.Verifier with a `name` that implements "
            "score_parsed(expected, candidate, tools, state) -> Score")
_IMPORTED_CODE: dict[str, str] = {}  # module name -> code hash of the source this process imported it from


class VerifierTable(dict):
    """registry.py's name -> class table: the registered built-ins, then user names resolved on lookup.

    build_verifier asks `name in table`, then calls `table[name](**params)`: `in` resolves a user name or raises
    the one-line ValueError that says what is wrong with it, the lookup returns a builder of the user's verifier.
    """

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or (isinstance(name, str) and bool(user_verifier_class(name)))

    def __missing__(self, name: str):
        return functools.partial(build_user_verifier, user_verifier_class(name))


def look_up_user_verifiers() -> None:
    """Make registry.build_verifier resolve user names too (the package __init__ calls this once)."""
    if not isinstance(registry._CLASSES, VerifierTable):
        registry._CLASSES = VerifierTable(registry._CLASSES)


def user_verifier_class(name: str) -> type[Verifier]:
    """The class a `module:Class` name or an entry-point name stands for; ValueError: what is wrong with it."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        if not module_name or not attr:
            raise ValueError(f"verifier {name!r}: write a class in a module as module:Class (my_rewards:ShippingVerifier)")
        return _verifier_class(name, _import_current(name, module_name), attr)
    found = {ep.value: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name)}
    if not found:
        installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        raise ValueError(f"unknown verifier {name!r} (known: {', '.join(registry.verifier_names())}; entry points: "
                         f"{', '.join(installed) or 'none installed'}; or a class of yours as module:Class)")
    if len(found) > 1:
        raise ValueError(f"verifier {name!r}: several {ENTRY_POINT_GROUP} entry points: {', '.join(sorted(found))}")
    ep = next(iter(found.values()))
    if not ep.attr:
        raise ValueError(f"verifier {name!r}: entry point {ep.value!r} names a module, not a class: {CONTRACT}")
    return _verifier_class(name, _import_current(name, ep.module), ep.attr)


# quoted in docs/troubleshooting.md (generated from here)
NO_MODULE = "verifier {name!r}: no module named {top!r} on sys.path or in {where}"


def build_user_verifier(cls: type[Verifier], **params: Any) -> Verifier:
    verifier = cls(**params)
    # base.py's fingerprint hashes name, version and config (and only the package's code): the code enters here
    verifier.version = f"{cls.version}+code.{user_code_hash(cls)}"
    return verifier


def user_code_hash(cls: type[Verifier]) -> str:
    """Hash of the code of every module that defines a verifier class `cls` inherits from (itself included)."""
    hashes = {k.__module__: _module_code_hash(k.__module__) for k in cls.__mro__
              if isinstance(k, type) and issubclass(k, Verifier)}
    return short_hash(canonical_json(hashes))


def _module_code_hash(module_name: str) -> str:
    if module_name.startswith(PACKAGE + "."):
        return code_hash(module_name)  # a built-in verifier subclassed: its code and its helpers' code
    return _IMPORTED_CODE.get(module_name) or _source_code_hash(sys.modules[module_name])


def _verifier_class(name: str, module: ModuleType, attr: str) -> type[Verifier]:
    try:
        obj = functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise ValueError(f"verifier {name!r}: module {module.__name__} ({module.__file__}) has no {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Verifier)):
        raise ValueError(f"verifier {name!r}: {module.__name__}.{attr} is not a verifier: {CONTRACT}")
    if obj.score_parsed is Verifier.score_parsed and obj.score is Verifier.score:
        raise ValueError(f"verifier {name!r}: {module.__name__}.{attr} implements no score_parsed: {CONTRACT}")
    if not obj.name:
        raise ValueError(f"verifier {name!r}: {module.__name__}.{attr} sets no `name`: {CONTRACT}")
    return obj


def _import_current(name: str, module_name: str) -> ModuleType:
    """The module, imported (from the search dirs when sys.path lacks it) and reloaded if edited since."""
    module = _import(name, module_name)
    source = _source_code_hash(module)
    if _IMPORTED_CODE.setdefault(module_name, source) != source:
        if getattr(module, "__cached__", None):  # bytecode of the same second and size would pass as current
            Path(module.__cached__).unlink(missing_ok=True)
        module = _imported(name, module_name, importlib.reload, module)
        _IMPORTED_CODE[module_name] = source
    return module


def _import(name: str, module_name: str) -> ModuleType:
    importlib.invalidate_caches()  # a module written a moment ago (a test, an editor) is seen
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        directory = next((d for d in _search_dirs() if (d / f"{top}.py").is_file() or (d / top).is_dir()), None)
        if directory is None:
            where = ", ".join(str(d) for d in _search_dirs())
            raise ValueError(NO_MODULE.format(name=name, top=top, where=where))
        # kept on sys.path, last (it shadows nothing installed): lazy imports and spawned workers need it too
        sys.path.append(str(directory))
    return _imported(name, module_name, importlib.import_module, module_name)


def _imported(name: str, module_name: str, load, arg) -> ModuleType:
    """load(arg) with any failure of the user's module (a syntax error, a missing dependency) as one line."""
    try:
        return load(arg)
    except Exception as e:  # whatever the user's module raises while it runs
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"verifier {name!r}: importing {module_name} failed: {type(e).__name__}: {first_line}") from None


_CONFIG_DIRS: list[Path] = []  # the directories of the configs this process built verifier sets for


def search_config_dir(base_dir: str | Path) -> None:
    """Look for user modules in a config's directory too (`pivot run --config other/pivot.yaml` from elsewhere)."""
    path = Path(base_dir).resolve()
    if path not in _CONFIG_DIRS:
        _CONFIG_DIRS.append(path)


def _search_dirs() -> list[Path]:
    """Where a module that is not on sys.path is looked for: the working directory, the config's directory."""
    config = resolve_config_path()
    dirs = [Path.cwd().resolve()] + ([config.parent] if config is not None else []) + _CONFIG_DIRS
    return list(dict.fromkeys(dirs))


def _source_code_hash(module: ModuleType) -> str:
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        raise ValueError(f"verifier module {module.__name__} has no .py source to fingerprint (its file: {path})")
    return short_hash(_code_tokens(Path(path).read_text(encoding="utf-8")))
