"""Facts a reader would check in a reply or a free-text argument: extraction, normalization, comparison.

A reply that says "$45" where the expert said "$450" is wrong however similar the rest is, so fact-aware
verifiers compare the facts first (as multisets of normalized values) and only then the rest by similarity.

Kinds, tried in this order at each position of the text (markdown emphasis and list markers removed first):
  email     jane.doe@example.com                         -> case-folded
  url       https://example.com/a?b=1                    -> trailing punctuation and slash dropped
  quote     "..." '...' “...”                            -> the quoted text, whitespace collapsed, case-folded
  date      2024-05-17, 05/17/2024, May 17, 2024, 17th of May, May 17, May 2024 -> 2024-05-17 / --05-17 /
            2024-05 (python-dateutil parses the span; a date without a year only equals one without a year)
  time      10:30, 10:30 PM, 3pm, 3 p.m., the time of 2024-05-17T15:00:00 -> 24-hour 15:00
  money     $1,200.00, USD 45, 45 dollars, €12, $1.2k, $3 million -> USD 1200
  number    1,200.00 / 12.5% / 12.5 percent / 23 kg / 23kg / 17th / 2 million -> 1200 / 12.5 % / 23 kg / 17
            (units from a small table; other words after a number are not part of it)
  id        a token mixing letters and digits: 3FRNFB, HAT045, sophia_silva_7557, COVID-19 -> upper-cased
  code      an all-caps word of two or more letters: JFK, ORD (not OK, ID, AI and a few such words).
            Compared by how often the word occurs in each text, case-insensitively, so "YOU ARE BEING
            TRANSFERRED" and its lower-case copy agree while "JFK" against "LGA" does not.
Case never makes two facts differ (3frnfb = 3FRNFB, 'Yes' = 'yes'): it is surface for a reader.
Not facts: number words ("two"), weekday names, plain words. A number word changed is left to the similarity.

Cost: one precompiled regex pass per text, cached per string (lru_cache), so the K samples of a turn and the
expert reply are scanned once.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, NamedTuple

from dateutil import parser as date_parser

from .arithmetic import parse_expression
from .canonical import canonical_key as canonical_json
from .canonical import loads_canonical

FACT_MODES = ("exact", "subset", "ignore")

_MAX_SURFACE = 60  # characters of a fact quoted in a Score detail


class Fact(NamedTuple):
    kind: str  # email | url | quote | date | time | money | number | id | code | expression
    key: str  # normalized value: equal (kind, key) = the same fact
    surface: str  # as written, for the Score detail


class TextFacts(NamedTuple):
    facts: tuple[Fact, ...]  # in text order; codes are not here (compared pairwise, see fact_difference)
    counts: Counter  # (kind, key) -> occurrences: the multiset that is compared
    codes: dict  # case-folded all-caps word -> its first spelling
    words: str  # the text without its facts, case-folded: where code words are counted
    rest: str  # `words` without punctuation, spaces collapsed: what the similarity compares


def _text_facts(facts: list[Fact], codes: dict, words: str) -> TextFacts:
    rest = _SPACES.sub(" ", _PUNCT.sub("", words)).strip()
    return TextFacts(tuple(facts), Counter((f.kind, f.key) for f in facts), codes, words, rest)


# -------------------------------------------------------------------------------------------------
# markdown and typography: surface only, removed before anything is extracted

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00ab": '"', "\u00bb": '"',
                         "\u00a0": " ", "\u202f": " ", "\u2212": "-", "\u2013": "-", "\u2014": " - "})
_MD_LINE_MARKERS = re.compile(r"^[ \t]*(?:(?:#{1,6}|>|[-*+]|\d{1,3}[.)])[ \t]+)+", re.M)
_MD_EMPHASIS = re.compile(r"\*\*|__|~~|`+")
_MD_SINGLE = re.compile(r"(?<![\w*])[*_](?=\S)(.+?)(?<=\S)[*_](?![\w*])")
_MD_LINK = re.compile(r"\[([^\]\n]{1,300})\]\((\S{1,2000}?)\)")


def strip_markdown(text: str) -> str:
    """Text without markdown emphasis, code ticks, headers, list markers and link syntax (surface only)."""
    text = text.translate(_QUOTES)
    if "](" in text:
        text = _MD_LINK.sub(r"\1 \2", text)
    if _MID_LINE_NUMBER_HINT.search(text):
        text = _drop_inline_list_numbers(text)
    text = _MD_LINE_MARKERS.sub("", text)
    if "*" in text or "_" in text or "`" in text or "~" in text:  # most replies have none: skip two scans
        text = _MD_SINGLE.sub(r"\1", _MD_EMPHASIS.sub("", text))
    return text


# A numbered list flattened onto one line ("options: 1. Flight A ... 2. Flight B") keeps its list numbers
# mid-line, where the line-start rule above does not see them.
_LIST_NUMBER = re.compile(r"(?<!\S)(\d{1,3})[.)](?=[ \t]+\S)")
_MID_LINE_NUMBER_HINT = re.compile(r"\S[ \t]+\d{1,3}[.)][ \t]+\S")
_MONTH_BEFORE = re.compile(r"\b(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?[ \t]+$")


def _list_numbers(markers: list[re.Match], introduced: list[bool]) -> set[int]:
    """Indexes of the markers that number a list: runs 1, 2, 3... in text order, nested lists interleaved
    (a run is continued by its next number, an inner run closes when an outer one continues). A run of one
    is a list only when it is introduced as one (_introduced); otherwise a lone "1." is a number."""
    runs: list[list[int]] = []  # marker indexes of each run
    open_runs: list[int] = []  # innermost last
    for i, m in enumerate(markers):
        n = int(m.group(1))
        for depth in range(len(open_runs) - 1, -1, -1):
            run = runs[open_runs[depth]]
            if int(markers[run[-1]].group(1)) + 1 == n:
                del open_runs[depth + 1:]
                run.append(i)
                break
        else:
            if n == 1:
                runs.append([i])
                open_runs.append(len(runs) - 1)
    return {i for run in runs if len(run) > 1 or introduced[run[0]] for i in run}


def _introduced(text: str, marker: re.Match) -> bool:
    """A list item begins here: a colon or a bold heading before the number ("options: 1. ...", "**Flight 2** 1.
    ..."), or markup after it ("1. **A**", "1. `code`")."""
    before = text[max(0, marker.start() - 40):marker.start()].rstrip(" \t")
    return (before.endswith(("**", "__")) or before.rstrip("*_").endswith(":")
            or text[marker.end():].lstrip(" \t")[:1] in ("*", "_", "`"))


def _drop_inline_list_numbers(text: str) -> str:
    """Mid-line list numbers removed when they continue a run 1, 2, ... (line-start ones count in the run), so
    a flattened list reads like the list. Any other number stays a fact: a changed one breaks the run."""
    markers = [m for m in _LIST_NUMBER.finditer(text)
               if not _MONTH_BEFORE.search(text, max(0, m.start() - 16), m.start())]
    numbers = _list_numbers(markers, [_introduced(text, m) for m in markers])
    if not numbers:
        return text
    pieces, pos = [], 0
    for i in sorted(numbers):
        m = markers[i]
        line_start = text.rfind("\n", 0, m.start()) + 1
        if text[line_start:m.start()].strip():  # mid-line (line-start markers go with _MD_LINE_MARKERS)
            pieces.append(text[pos:m.start()])
            pos = m.end()
    return "".join(pieces) + text[pos:]


# -------------------------------------------------------------------------------------------------
# the scanner

_NUM = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_MONTH = (r"(?i:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
          r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?")
_ORD = r"(?:st|nd|rd|th)"
_CURRENCY_SYMBOLS = {"$": "USD", "US$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR", "C$": "CAD",
                     "A$": "AUD"}
_CURRENCY_CODES = ("USD", "EUR", "GBP", "JPY", "INR", "CAD", "AUD", "CHF", "CNY")
_CURRENCY_WORDS = {"dollar": "USD", "dollars": "USD", "bucks": "USD", "euro": "EUR", "euros": "EUR"}
_MULTIPLIERS = {"k": 3, "thousand": 3, "m": 6, "mn": 6, "million": 6, "b": 9, "bn": 9, "billion": 9}
_UNITS = {
    "%": "%", "percent": "%", "per cent": "%", "pct": "%",
    "kg": "kg", "kgs": "kg", "kilo": "kg", "kilos": "kg", "kilogram": "kg", "kilograms": "kg",
    "g": "g", "gram": "g", "grams": "g", "lb": "lb", "lbs": "lb", "pound": "lb", "pounds": "lb",
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
    "mi": "mi", "mile": "mi", "miles": "mi", "meter": "m", "meters": "m", "metre": "m", "metres": "m",
    "cm": "cm", "mm": "mm", "ft": "ft", "foot": "ft", "feet": "ft", "inch": "in", "inches": "in",
    "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h", "min": "min", "mins": "min", "minute": "min",
    "minutes": "min", "sec": "s", "secs": "s", "second": "s", "seconds": "s", "day": "day", "days": "day",
    "week": "week", "weeks": "week", "month": "month", "months": "month", "year": "year", "years": "year",
    "yr": "year", "yrs": "year", "night": "night", "nights": "night",
    "kb": "KB", "mb": "MB", "gb": "GB", "tb": "TB", "°c": "°C", "°f": "°F", "degrees": "°",
}
_UNIT_RE = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
# All-caps words that are words, not values: "your user ID" names no particular id.
_CODE_STOPWORDS = frozenset({"ok", "id", "ids", "ai", "am", "pm", "faq", "asap", "fyi", "ps"})

_SCANNER = re.compile(rf"""
  (?P<gap>[\s,;:!?()\[\]{{}}<>/\\|*=&%^~`+]+)
| (?P<plain>(?<!\w)[A-Za-z][a-z]*(?![\w@.+:-]|\s+\d))
| (?P<email>(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+)
| (?P<url>\b(?:https?://|www\.)[^\s<>"'()\[\]]+)
| "(?P<dq>(?:[^"\n]|\n(?![ \t]*\n)){{1,300}}?)"
| (?<![\w'])'(?P<sq>(?:[^'\n]|\n(?![ \t]*\n)){{1,300}}?)'(?!\w)
| (?P<iso>(?<![\w.-])\d{{4}}-\d{{2}}-\d{{2}})(?:T(?P<iso_time>\d{{2}}:\d{{2}}(?::\d{{2}})?)(?:\.\d+)?(?:Z|[+-]\d{{2}}:?\d{{2}})?)?(?![\w-])
| (?P<ndate>(?<![\w./-])(?:\d{{4}}/\d{{1,2}}/\d{{1,2}}|\d{{1,2}}/\d{{1,2}}/(?:\d{{4}}|\d{{2}})|\d{{1,2}}\.\d{{1,2}}\.\d{{4}}))(?![\w/.]\w)
| (?P<mdate>(?<!\w){_MONTH}\s+\d{{1,2}}{_ORD}?(?:,?\s+\d{{4}})?)(?![\w:])
| (?P<ddate>(?<![\w.,])\d{{1,2}}{_ORD}?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?)(?!\w)
| (?P<mydate>(?<!\w){_MONTH}\s+\d{{4}})(?!\w)
| (?P<clock>(?<![\w:.])\d{{1,2}}:\d{{2}}(?::\d{{2}})?(?:\s*[aApP]\.?\s?[mM]\.?(?!\w))?)(?![\w:])
| (?P<ampm>(?<![\w:.,])\d{{1,2}}\s*[aApP]\.?[mM]\.?)(?!\w)
| (?P<money_pre>(?<![\w.,])(?P<neg>-)?(?P<sym>US\$|C\$|A\$|[$€£¥₹]|(?:{"|".join(_CURRENCY_CODES)}))\s*(?P<pamt>{_NUM})(?:\s*(?P<pmult>[kKmMbB]n?|thousand|million|billion))?)(?!\w)
| (?P<number>(?<![\w.,])(?P<sign>-)?(?P<amt>{_NUM})(?:(?P<ord>{_ORD})|\s*(?P<mult>thousand|million|billion)|\s*(?P<cur>{"|".join(_CURRENCY_CODES)}|(?i:dollars?|bucks|euros?))|(?:\s*|-)(?P<unit>(?i:{_UNIT_RE})))?)(?![\w%])
| (?P<id>(?<![\w-])(?=[\w.-]*?\d)(?=[\w.-]*?[^\W\d_])[^\W_](?:[\w-]|\.(?=\w))*)
| (?P<code>(?<!\w)[A-Z]{{2,}}(?!\w))
| (?P<word>\w+)
""", re.X)


def _decimal_key(text: str, exponent: int = 0, negative: bool = False) -> str | None:
    """'1,200.50' -> '1200.5' (times 10**exponent); None for something Decimal cannot read."""
    try:
        value = Decimal(text.replace(",", "")).scaleb(exponent)
    except InvalidOperation:
        return None
    return format((-value if negative else value).normalize(), "f")


_DATE_DEFAULT = datetime(2000, 1, 1)  # a leap year, so Feb 29 without a year parses


@lru_cache(maxsize=8192)
def date_key(span: str, has_year: bool, has_day: bool = True, day_first: bool = False) -> str | None:
    """'May 17, 2024' -> '2024-05-17'; '17th of May' -> '--05-17'; 'May 2024' -> '2024-05'; None if no date."""
    try:
        d = date_parser.parse(span, default=_DATE_DEFAULT, dayfirst=day_first)
    except (ValueError, OverflowError):
        return None
    if not has_day:
        return f"{d.year:04d}-{d.month:02d}"
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}" if has_year else f"--{d.month:02d}-{d.day:02d}"


_CLOCK_RE = re.compile(r"(\d{1,2})(?::(\d{2}))?(?::(\d{2}))?\s*(?:([aApP])\.?\s?[mM]\.?)?")


def time_key(span: str) -> str | None:
    """'3:05 p.m.' -> '15:05'; '15:00:00' -> '15:00'; '00:00 AM' -> '00:00'; None for an impossible time."""
    m = _CLOCK_RE.fullmatch(span.strip())
    if m is None:
        return None
    hour, minute, second = int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0)
    if m.group(4):
        if not 0 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if m.group(4) in "pP" else 0)
    if hour > 24 or minute > 59 or second > 59:
        return None
    return f"{hour:02d}:{minute:02d}" + (f":{second:02d}" if second else "")


def _money(m: re.Match) -> Fact | None:
    sym = m.group("sym").strip()
    currency = _CURRENCY_SYMBOLS.get(sym, sym.upper())
    key = _decimal_key(m.group("pamt"), _MULTIPLIERS.get((m.group("pmult") or "").lower(), 0), bool(m.group("neg")))
    return Fact("money", f"{currency} {key}", m.group(0)) if key is not None else None


def _number(m: re.Match) -> Fact | None:
    key = _decimal_key(m.group("amt"), _MULTIPLIERS.get((m.group("mult") or "").lower(), 0), bool(m.group("sign")))
    if key is None:
        return None
    if m.group("cur"):
        cur = m.group("cur")
        return Fact("money", f"{_CURRENCY_WORDS.get(cur.lower(), cur.upper())} {key}", m.group(0))
    unit = m.group("unit")
    if unit:
        return Fact("number", f"{key} {_UNITS[unit.lower()]}", m.group(0))
    return Fact("number", key, m.group(0))


def _date(m: re.Match, group: str) -> Fact | None:
    span = m.group(group)
    if group == "ndate":
        has_year, day_first = True, "." in span
    else:
        has_year, day_first = bool(re.search(r"\d{4}", span)), group == "ddate"
    key = date_key(re.sub(r"(\d)(?:st|nd|rd|th)\b", r"\1", span), has_year, group != "mydate", day_first)
    return Fact("date", key, span) if key is not None else None


def _one_fact(m: re.Match) -> list[Fact] | Fact | None:
    """The fact(s) of one scanner match (None: not a fact after all, e.g. an impossible date)."""
    group = m.lastgroup
    if group == "email":
        return Fact("email", m.group(0).casefold(), m.group(0))
    if group == "url":
        url = m.group(0).rstrip(".,;:!?")
        return Fact("url", url.rstrip("/"), url)
    if group in ("dq", "sq"):  # the quoted words are the fact; their case is not (as for ids and codes)
        return Fact("quote", " ".join(m.group(group).casefold().split()), m.group(0))
    if m.group("iso") is not None:
        date = date_key(m.group("iso"), True)
        facts = [Fact("date", date, m.group("iso"))] if date else []
        clock = m.group("iso_time") and time_key(m.group("iso_time"))
        return facts + ([Fact("time", clock, m.group("iso_time"))] if clock else [])
    if group in ("ndate", "mdate", "ddate", "mydate"):
        return _date(m, group)
    if group in ("clock", "ampm"):
        span = m.group(group)
        # An impossible time ("00:60") is still a stated value: compared as written, so a changed digit counts.
        return Fact("time", time_key(span) or "as written: " + "".join(span.split()).casefold(), span)
    if m.group("money_pre") is not None:
        return _money(m)
    if m.group("number") is not None:
        return _number(m)
    if group == "id":
        return Fact("id", m.group(0).upper(), m.group(0))
    return None


_PUNCT = re.compile(r"[^\w\s]")
_SPACES = re.compile(r"\s+")
_ALPHA_RUN = re.compile(r"[^\W\d_]+")


@lru_cache(maxsize=65536)
def extract(text: str) -> TextFacts:
    """Facts of a text (see module docstring), cached per string."""
    text = strip_markdown(text)
    facts: list[Fact] = []
    codes: dict[str, str] = {}
    pieces: list[str] = []
    pos = 0
    for m in _SCANNER.finditer(text):
        if m.lastgroup in ("gap", "plain", "word"):  # start no fact: skipped whole, which saves the scan
            continue
        if m.lastgroup == "code":  # stays in the text: counted there, case-insensitively
            word = m.group(0)
            if word.casefold() not in _CODE_STOPWORDS:
                codes.setdefault(word.casefold(), word)
            continue
        fact = _one_fact(m)
        if not fact:
            continue
        facts.extend(fact if isinstance(fact, list) else [fact])
        pieces.append(text[pos:m.start()])
        pos = m.end()
    pieces.append(text[pos:])
    return _text_facts(facts, codes, " ".join(pieces).casefold())


@lru_cache(maxsize=65536)
def _word_counts(words: str) -> Counter:
    """Alphabetic runs of a case-folded text: "you're" -> you, re (as "YOU'RE" gives codes YOU and RE)."""
    return Counter(_ALPHA_RUN.findall(words))


def value_facts(value: Any) -> TextFacts:
    """Facts of a JSON value (call arguments): every string leaf's facts, every number as a number fact.

    Keys are structure, not facts. An arithmetic expression string is one `expression` fact, so a changed
    operator counts as much as a changed number.
    """
    facts: list[Fact] = []
    codes: dict[str, str] = {}
    words: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
        elif isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, str):
            expr = parse_expression(v)
            if expr is not None:
                facts.append(Fact("expression", expr.canonical, v))
                continue
            tf = extract(v)
            facts.extend(tf.facts)
            for folded, spelling in tf.codes.items():
                codes.setdefault(folded, spelling)
            words.append(tf.words)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            key = _number_key(v)
            facts.append(Fact("number", key, key))
    return _text_facts(facts, codes, " \n ".join(words))


@lru_cache(maxsize=16384)
def value_facts_of_key(key: str) -> TextFacts:
    """value_facts of canonical JSON text (a Call's key), cached per text."""
    return value_facts(loads_canonical(key))


@lru_cache(maxsize=16384)
def surface_json(key: str) -> str:
    """Canonical JSON text (a Call's key) with every string value reduced to its `rest` (facts removed)."""
    def reduce(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: reduce(x) for k, x in v.items()}
        if isinstance(v, list):
            return [reduce(x) for x in v]
        if isinstance(v, str):
            return "" if parse_expression(v) is not None else extract(v).rest
        return v

    try:
        return canonical_json(reduce(loads_canonical(key)))
    except RecursionError:
        return key


def _number_key(v: int | float) -> str:
    """A JSON number's key; integers too long for str() (over 4300 digits) are keyed by size and hash."""
    if isinstance(v, float):
        return _decimal_key(repr(v)) or repr(v)
    try:
        return str(v)
    except ValueError:
        return f"<{v.bit_length()}-bit integer #{hash(v):x}>"


# -------------------------------------------------------------------------------------------------
# comparison


def _code_counts(tf: TextFacts, words: tuple[str, ...]) -> tuple[int, ...]:
    counts = _word_counts(tf.words)
    return tuple(counts[w] for w in words)


def _short(surface: str) -> str:
    surface = " ".join(surface.split())
    return surface if len(surface) <= _MAX_SURFACE else surface[:_MAX_SURFACE] + "..."


def fact_difference(expected: TextFacts, candidate: TextFacts, mode: str = "exact") -> str | None:
    """None when the candidate's facts agree with the expert's, else a detail naming the first difference.

    exact: equal multisets. subset: the candidate's facts are a sub-multiset of the expert's (it may leave
    facts out, never state one the expert did not). ignore: always None. Code words (all caps in either
    text) are counted case-insensitively in both texts and compared like any other fact.
    """
    if mode == "ignore":
        return None
    words = tuple(sorted(expected.codes.keys() | candidate.codes.keys()))
    exp_codes, cand_codes = _code_counts(expected, words), _code_counts(candidate, words)
    if mode == "subset":
        if candidate.counts <= expected.counts and all(c <= e for c, e in zip(cand_codes, exp_codes)):
            return None
    elif candidate.counts == expected.counts and cand_codes == exp_codes:
        return None
    spellings = {**candidate.codes, **expected.codes}
    return _describe(_in_order(expected, words, exp_codes, spellings),
                     _in_order(candidate, words, cand_codes, spellings), mode)


@lru_cache(maxsize=65536)
def text_fact_difference(expected: str, candidate: str, mode: str = "exact") -> str | None:
    """fact_difference of two texts, cached per pair (the K samples of a turn often repeat)."""
    return fact_difference(extract(expected), extract(candidate), mode)


def _in_order(tf: TextFacts, words: tuple[str, ...], counts: tuple[int, ...], spellings: dict) -> list[Fact]:
    """The text's facts in text order, then its code words (alphabetical), for naming the first difference."""
    return list(tf.facts) + [Fact("code", w, spellings[w]) for w, n in zip(words, counts) for _ in range(n)]


def _describe(expected: list[Fact], candidate: list[Fact], mode: str) -> str:
    """'expected X, got Y' for the first expert fact the candidate lacks and the candidate fact in its place."""
    exp_all = Counter((f.kind, f.key) for f in expected)
    cand_all = Counter((f.kind, f.key) for f in candidate)
    missing, extra = exp_all - cand_all, cand_all - exp_all
    first_missing = next((f for f in expected if (f.kind, f.key) in missing), None) if mode == "exact" or extra else None
    kind = first_missing.kind if first_missing else None
    first_extra = (next((f for f in candidate if (f.kind, f.key) in extra and f.kind == kind), None)
                   or next((f for f in candidate if (f.kind, f.key) in extra), None))
    if first_missing and first_extra:
        return f"expected {_short(first_missing.surface)}, got {_short(first_extra.surface)}"
    if first_extra:
        return f"unexpected {_short(first_extra.surface)}"
    return f"expected {_short(first_missing.surface)}, got none"
