"""Code hash of a verifier: its module and every module of this package it imports, transitively.

Part of `Verifier.fingerprint` (the scoring stage's code version): editing a verifier's code, or a helper it
uses (facts.py for tool_call, say), makes the rewards it stored stale, while editing an unrelated verifier
does not. Comments and blank lines are not hashed (they cannot change a verdict); everything else is,
docstrings included. Sources are read once per process.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from functools import lru_cache
from pathlib import Path

PACKAGE = __name__.rsplit(".", 1)[0]  # "pivot_assets.verifiers"
_DIR = Path(__file__).resolve().parent
_SKIPPED_TOKENS = {tokenize.COMMENT, tokenize.NL}


def read_module_source(module: str) -> str:
    """Source text of a module of this package ("tool_call" -> tool_call.py); tests monkeypatch this."""
    return (_DIR / f"{module}.py").read_text(encoding="utf-8")


def _is_package_module(name: str) -> bool:
    return bool(name) and (_DIR / f"{name}.py").is_file()


def _imported_modules(source: str) -> set[str]:
    """Modules of this package imported by `source` (relative or absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = node.module or ""
            elif node.level == 0 and (node.module or "").startswith(PACKAGE + "."):
                base = node.module[len(PACKAGE) + 1:]
            else:
                continue
            head = base.split(".")[0]
            found.update([head] if head else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name[len(PACKAGE) + 1:].split(".")[0] for a in node.names if a.name.startswith(PACKAGE + "."))
    return {m for m in found if _is_package_module(m)}


@lru_cache(maxsize=None)
def module_closure(module: str) -> tuple[str, ...]:
    """`module` and the package modules it imports, transitively, sorted."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(_imported_modules(read_module_source(m)) - seen)
    return tuple(sorted(seen))


def _code_tokens(source: str) -> str:
    """The source's tokens without comments and blank lines, one per line."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return "\n".join(f"{t.type}:{t.string}" for t in tokens if t.type not in _SKIPPED_TOKENS)


@lru_cache(maxsize=None)
def code_hash(module: str) -> str:
    """sha256 (16 hex chars) over the code tokens of `module`'s closure; a module outside the package -> base."""
    module = module.rsplit(".", 1)[-1] if module.startswith(PACKAGE + ".") else "base"
    digest = hashlib.sha256()
    for m in module_closure(module):
        digest.update(f"{m}\n{_code_tokens(read_module_source(m))}\n".encode("utf-8"))
    return digest.hexdigest()[:16]


def clear_cache() -> None:
    """Forget hashed sources (after read_module_source is swapped, or a source edited in a live process)."""
    module_closure.cache_clear()
    code_hash.cache_clear()
