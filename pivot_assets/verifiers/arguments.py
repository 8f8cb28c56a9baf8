"""What an argument value is, read from the tool's schema, the argument's name and the value itself.

- `declared_type_error`: the JSON type the schema declares for an argument, checked on the value as sent, so
  `"[0.8, 0.7]"` for a declared array is a type error before anything is compared.
- `is_free_text`: whether a string argument is free text (a message body, a search query, a description:
  compared by its facts and word overlap) or a value that names one thing (a museum, a city, a title: compared
  as a string, where one changed word names another thing). Decided, in order, by:
  1. the schema: an `enum`, `const`, `pattern` or `format` makes it a value;
  2. the value's shape: fewer than the minimum words, or mostly capitalized words (`Metropolitan Museum of
     Art`, `New York, NY`), make it a value;
  3. the last word of the argument's name (`message`, `comment_content`, `search_query`: free text;
     `museum_name`, `title`, `location`, `user_id`: a value);
  4. the first words of the property's description ("The text of the email", "Name of the city");
  5. otherwise the value's length: prose of at least `PROSE_MIN_WORDS` words is free text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from pivot_assets.core.ids import canonical_json

PROSE_MIN_WORDS = 8  # an argument that nothing names as free text is prose only from this many words

# Last word of an argument name (or an early word of its description) that makes it free text ...
FREE_TEXT_WORDS = frozenset("""
    message messages msg body text content contents description desc comment comments note notes summary query
    question prompt instruction instructions reason explanation feedback review reply response answer details
    memo remark remarks resolution bio caption post tweet story essay paragraph sentence transcript
    """.split())
# ... or a value that names one thing.
VALUE_WORDS = frozenset("""
    name names title id ids key code city country state province region location address destination origin
    place venue company organization brand product model author artist team user username email url uri path
    file filename pattern regex type kind category genre language unit currency symbol ticker date time
    format mode status label tag tags
    """.split())
# Left out when counting capitals: words that stay lower-case inside a name ("Museum of Art"), and calendar
# words, capitalized in any text ("on May 17").
_NOT_COUNTED = frozenset("""
    of the and in at on for a an to by with from or de du des la le da di van von
    january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec
    monday tuesday wednesday thursday friday saturday sunday
    """.split())

_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_ALPHA_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_DESCRIPTION_WORDS = 6  # how far into a description a hint word counts ("The text of ...", "Name of ...")
_VALUE_KEYWORDS = ("enum", "const", "pattern", "format")


# -------------------------------------------------------------------------------------------------
# declared types

_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def json_type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def declared_type_error(prop: Any, value: Any, path: str) -> str | None:
    """Why the value is not of the JSON type its property schema declares ("x: expected array, got string
    '[0.8, 0.7]'"); None when it is, or when the schema declares no type that can be checked."""
    if not isinstance(prop, dict):
        return None
    declared = prop.get("type")
    types = (declared,) if isinstance(declared, str) else tuple(declared) if isinstance(declared, list) else ()
    if not types or not all(isinstance(t, str) and t in _TYPE_CHECKS for t in types):
        return None
    if any(_TYPE_CHECKS[t](value) for t in types):
        return None
    text = value if isinstance(value, str) else canonical_json(value)
    shown = repr(text if len(text) <= 60 else text[:60] + "...")
    return f"{path}: expected {' or '.join(types)}, got {json_type_name(value)} {shown}"


# -------------------------------------------------------------------------------------------------
# free text or a value


@lru_cache(maxsize=4096)
def name_kind(argument: str) -> str | None:
    """"free" or "value" from the last word of an argument name (snake_case or camelCase); None: no hint."""
    words = [w.lower() for w in _NAME_SPLIT.split(argument) if w]
    if not words:
        return None
    return "free" if words[-1] in FREE_TEXT_WORDS else "value" if words[-1] in VALUE_WORDS else None


@lru_cache(maxsize=4096)
def description_kind(description: str) -> str | None:
    """"free" or "value" from the first words of a property description; a value word wins over a free one."""
    words = [w.lower() for w in _ALPHA_WORD.findall(description)[:_DESCRIPTION_WORDS]]
    if any(w in VALUE_WORDS for w in words):
        return "value"
    return "free" if any(w in FREE_TEXT_WORDS for w in words) else None


@lru_cache(maxsize=65536)
def looks_like_a_name(value: str) -> bool:
    """At least 3 in 5 words capitalized: `Metropolitan Museum of Art`, `New York, NY`, `Project Update`.

    Particles and calendar words are not counted, nor all-caps words and words with digits (codes and ids,
    which free text holds too: "refund USD 40 for HAT045").
    """
    words = [w for w in _ALPHA_WORD.findall(value)
             if w.lower() not in _NOT_COUNTED and not w.isupper() and not any(c.isdigit() for c in w)]
    return bool(words) and sum(w[0].isupper() for w in words) * 5 >= len(words) * 3


def is_free_text(argument: str, prop: Any, value: str, n_words: int, min_words: int) -> bool:
    """Is this string argument free text (see the module docstring)? `n_words`: the value's word count."""
    if n_words < min_words:
        return False
    if isinstance(prop, dict) and any(k in prop for k in _VALUE_KEYWORDS):
        return False
    if looks_like_a_name(value):
        return False
    kind = name_kind(argument) if argument else None
    if kind is None and isinstance(prop, dict) and isinstance(prop.get("description"), str):
        kind = description_kind(prop["description"])
    if kind is not None:
        return kind == "free"
    return n_words >= PROSE_MIN_WORDS
