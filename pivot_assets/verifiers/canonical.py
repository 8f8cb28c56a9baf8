"""Argument canonicalization: key order, number formatting, JSON-in-a-string, string normalization.

Two levels:
- `loads_canonical` / `canonical_key`: cheap structural canonical form (sorted keys, 1.0 -> 1). Equal keys mean
  equal arguments, so the verifiers short-circuit on them before any slower comparison.
- `canonicalize`: the full form used by the slow path; it also decodes strings that hold a JSON object or
  array (models often send `"items": "[1, 2]"` where the expert sent `[1, 2]`). Idempotent.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import lru_cache
from typing import Any

# Integral floats beyond 2**53 lose precision as ints; leave them as floats so 1e300 stays 1e300.
_MAX_EXACT_INT = 2**53


def canon_float(text: str) -> int | float:
    """JSON float literal -> int when integral (so 1, 1.0 and 1e0 compare equal), float otherwise."""
    f = float(text)
    if f.is_integer() and abs(f) <= _MAX_EXACT_INT:
        return int(f)
    return f


def canon_number(value: float) -> int | float:
    if value.is_integer() and abs(value) <= _MAX_EXACT_INT:
        return int(value)
    return value


# Built once: json.loads(parse_float=...) / json.dumps(sort_keys=...) construct a new coder on every call.
_DECODER = json.JSONDecoder(parse_float=canon_float)
# Same output as pivot_assets.core.ids.canonical_json (sorted keys, no whitespace, UTF-8 kept).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_PLAIN_ENCODER = json.JSONEncoder()
# Whitespace that may precede a JSON container inside a string value (strip set of _looks_like_json_container).
_JSON_WS = " \t\n\r"


def _may_hold_json_string(key: str) -> bool:
    r"""Could a string value in this canonical JSON text hold a JSON container (see _looks_like_json_container)?

    In encoded JSON such a string starts `"{`, `"[`, `" ` (leading spaces) or `"\` (escaped \n \r \t). Plain
    substring tests run at memchr speed; a false positive only costs the full canonicalize walk.
    """
    return '"{' in key or '"[' in key or '" ' in key or '"\\' in key



def loads_canonical(text: str) -> Any:
    """json.loads with integral floats turned into ints (numbers canonical at parse time, in C speed)."""
    return _DECODER.decode(text)


def reload_canonical(value: Any) -> Any:
    """Any JSON-able Python value -> the same value as loads_canonical would build it (C-speed round trip)."""
    return _DECODER.decode(_PLAIN_ENCODER.encode(value))


def canonical_key(value: Any) -> str:
    """Canonical JSON text of an already-canonical value: the equality key."""
    return _ENCODER.encode(value)


def canonical_args(raw: Any) -> tuple[Any, str, str]:
    """(canonical value, its key, key of the value as sent) of a value built by loads_canonical.

    The two keys differ only when a string held JSON (decoded in the canonical value); the walk is skipped when
    no string may hold JSON.
    """
    raw_key = _ENCODER.encode(raw)
    if not _may_hold_json_string(raw_key):
        return raw, raw_key, raw_key
    value = canonicalize(raw)
    return value, _ENCODER.encode(value), raw_key


def _looks_like_json_container(s: str) -> bool:
    t = s.strip(_JSON_WS)
    return len(t) >= 2 and ((t[0] == "{" and t[-1] == "}") or (t[0] == "[" and t[-1] == "]"))


def canonicalize(value: Any) -> Any:
    """Full canonical form: sorted-key-independent dicts, integral floats as ints, JSON-in-string decoded.

    Idempotent: canonicalize(canonicalize(x)) == canonicalize(x).
    """
    if isinstance(value, dict):
        return {str(k): canonicalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonicalize(v) for v in value]
    if isinstance(value, float):
        return canon_number(value)
    if isinstance(value, str) and _looks_like_json_container(value):
        try:
            decoded = _DECODER.decode(value)
        except (ValueError, RecursionError):
            return value
        if isinstance(decoded, (dict, list)):
            return canonicalize(decoded)
        return value
    return value


_PUNCT_RE = re.compile(r"[^\w\s]", re.UNICODE)
_WS_RE = re.compile(r"\s+")
_WORD_RE = re.compile(r"\w+", re.UNICODE)
# Typographic quotes models emit in place of ASCII ones.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"'})


STRING_RULES = ("exact", "casefold", "bfcl")
# BFCL's standardize_string (bfcl_eval/eval_checker/ast_eval/ast_checker.py): these characters are dropped.
_BFCL_DROPPED = re.compile(r"[ ,./\-_*^]")


@lru_cache(maxsize=65536)
def normalize_string(s: str, rule: str) -> str:
    """A string argument value under a string rule; equal results = equal values.

    exact: typographic quotes as ASCII, runs of whitespace as one space, trimmed (how the value is typed, not
    which value it is). casefold: the same, case-folded. bfcl: BFCL's standardize_string, exactly: lower-cased,
    spaces and `,./-_*^` removed, `'` as `"`.
    """
    if rule == "bfcl":
        return _BFCL_DROPPED.sub("", s).lower().replace("'", '"')
    s = _WS_RE.sub(" ", s.translate(_QUOTES)).strip()
    return s.casefold() if rule == "casefold" else s


@lru_cache(maxsize=65536)
def normalize_text(s: str, ignore_case: bool = False, collapse_whitespace: bool = True,
                   strip_punctuation: bool = False) -> str:
    """Configurable string normalization applied before comparing two string values."""
    s = s.translate(_QUOTES)
    if ignore_case:
        s = s.casefold()
    if strip_punctuation:
        s = _PUNCT_RE.sub("", s)
    if collapse_whitespace:
        s = _WS_RE.sub(" ", s).strip()
    return s


@lru_cache(maxsize=65536)
def word_counts(s: str) -> Counter:
    """Lower-cased word multiset (punctuation dropped): the unit of the free-text overlap measure."""
    return Counter(_WORD_RE.findall(s.casefold()))


def word_overlap(a: str, b: str) -> float:
    """Dice coefficient of the two word multisets: 2|A&B| / (|A|+|B|), in [0, 1].

    NeMo-Gym's argument comparison uses |A&B| / (|A|+|B|) (at most 0.5); this is the same measure doubled
    so thresholds read as fractions of words shared.
    """
    ca, cb = word_counts(a), word_counts(b)
    total = sum(ca.values()) + sum(cb.values())
    if total == 0:
        return 1.0
    return 2 * sum((ca & cb).values()) / total


def n_words(s: str) -> int:
    return sum(word_counts(s).values())
