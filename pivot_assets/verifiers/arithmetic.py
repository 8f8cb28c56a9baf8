"""Arithmetic expressions (`calculate`-style arguments) parsed safely and compared by structure.

"175 + 200" and "(175+200)" are the same expression; "175 + 300" and "175 - 200" are not. Word overlap or an
edit ratio cannot tell those apart, so strings that look like arithmetic are parsed with Python's `ast` and
only a whitelist of nodes is accepted: numbers, + - * / // % ** (^ read as **, × and ÷ as * and /), unary
signs and parentheses. Nothing is ever evaluated (no `eval`, no huge power computed); anything else (names,
calls, attributes, comparisons) is "not an expression" and falls back to string comparison.

Canonical form (exact algebra, no arithmetic done): parentheses and spacing vanish with the parse; a chain of
+ and - is a multiset of signed terms and a chain of * and / a multiset of factors and divisors, so
(350 - 122) + (499 - 127) == 350 - 122 + 499 - 127 and 2 * 3 == 3 * 2; // % ** keep their operands in order;
integral floats read as ints (175.0 == 175). The numbers are kept in source order, so a detail can name the
changed one.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from functools import lru_cache
from typing import NamedTuple

_MAX_CHARS = 400  # calculator input is short; bounds the parse depth too
_LOOKS_ARITHMETIC = re.compile(r"[\d\s.+\-*/%()^×÷]+")
_HAS_OPERATOR = re.compile(r"[\d.)]\s*(?:\*\*|//|[+\-*/%^×÷])\s*[\d.(+\-]")
_TRANSLATE = str.maketrans({"×": "*", "÷": "/"})

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**"}
_UNARY = {ast.USub: "-", ast.UAdd: "+"}


class Expression(NamedTuple):
    canonical: str  # equal canonical forms = the same expression
    numbers: tuple[str, ...]  # the numbers as canonical text, in source order


class _NotArithmetic(Exception):
    pass


def _number(node: ast.AST) -> str:
    value = node.value  # type: ignore[attr-defined]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _NotArithmetic
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return repr(value)


_SUM = {ast.Add: "+", ast.Sub: "-"}
_PRODUCT = {ast.Mult: "*", ast.Div: "/"}


def _chain(node: ast.AST, ops: dict, inverse: str, sign: bool, out: list[tuple[bool, ast.AST]]) -> None:
    """Operands of a +/- (or * and /) chain with their sign, left to right: a - (b - c) -> +a, -b, +c."""
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        _chain(node.left, ops, inverse, sign, out)
        _chain(node.right, ops, inverse, sign != (ops[type(node.op)] == inverse), out)
    elif inverse == "-" and isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _chain(node.operand, ops, inverse, sign != isinstance(node.op, ast.USub), out)
    else:
        out.append((sign, node))


def _canonical_chain(node: ast.AST, ops: dict, inverse: str, numbers: list[str]) -> str:
    terms: list[tuple[bool, ast.AST]] = []
    _chain(node, ops, inverse, True, terms)
    forward = next(s for s in ops.values() if s != inverse)
    parts = sorted((forward if positive else inverse) + _canonical(t, numbers) for positive, t in terms)
    if len(parts) == 1 and parts[0][0] == forward:
        return parts[0][1:]
    return "(" + " ".join(parts) + ")"


def _canonical(node: ast.AST, numbers: list[str]) -> str:
    if isinstance(node, ast.Constant):
        text = _number(node)
        numbers.append(text)
        return text
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _canonical_chain(node, _SUM, "-", numbers)
    if isinstance(node, ast.BinOp) and type(node.op) in _SUM:
        return _canonical_chain(node, _SUM, "-", numbers)
    if isinstance(node, ast.BinOp) and type(node.op) in _PRODUCT:
        return _canonical_chain(node, _PRODUCT, "/", numbers)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return f"({_canonical(node.left, numbers)} {_BINARY[type(node.op)]} {_canonical(node.right, numbers)})"
    raise _NotArithmetic


def looks_arithmetic(text: str) -> bool:
    """Only digits, operators, parentheses and spaces, with at least one binary operator."""
    return (len(text) <= _MAX_CHARS and _LOOKS_ARITHMETIC.fullmatch(text) is not None
            and _HAS_OPERATOR.search(text) is not None)


def parse_expression(text: str) -> Expression | None:
    """The canonical expression of an arithmetic string, or None when the string is not one."""
    return _parse(text) if looks_arithmetic(text) else None  # long strings are never cached


@lru_cache(maxsize=16384)
def _parse(text: str) -> Expression | None:
    source = text.translate(_TRANSLATE).replace("^", "**").strip()
    try:
        tree = ast.parse(source, mode="eval")
        numbers: list[str] = []
        return Expression(_canonical(tree.body, numbers), tuple(numbers))
    except (SyntaxError, ValueError, RecursionError, MemoryError, _NotArithmetic):
        return None


def expression_difference(expected: Expression, candidate: Expression) -> tuple[bool, str] | None:
    """None when equal; else (a number changed?, detail naming the first changed number or the operators)."""
    if expected.canonical == candidate.canonical:
        return None
    missing = Counter(expected.numbers) - Counter(candidate.numbers)
    extra = Counter(candidate.numbers) - Counter(expected.numbers)
    if missing or extra:
        exp = next((n for n in expected.numbers if n in missing), "none")
        got = next((n for n in candidate.numbers if n in extra), "none")
        return True, f"expected {exp}, got {got}"
    return False, f"operators differ: expected {expected.canonical}, got {candidate.canonical}"
