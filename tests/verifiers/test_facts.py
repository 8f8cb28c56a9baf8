"""Facts must match: near misses of every fact kind, surface variants, arithmetic, modes, properties, real replies."""

from __future__ import annotations

import json
import re
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pivot_assets.verifiers import Reason, build_verifier
from pivot_assets.verifiers.arithmetic import parse_expression
from pivot_assets.verifiers.facts import extract, fact_difference
from tests.verifiers.layouts import BULLET, numbered_and_flattened


def msg(text: str) -> dict:
    return {"type": "message", "content": text}


def call(name: str, **args) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(args)}


def hermes(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


# How each setup scores an (expert text, candidate text) pair: as replies, or as a free-text call argument.
SETUPS = {
    "tool_call reply": lambda e, c: build_verifier({"name": "tool_call"}).score(msg(e), c),
    "string_similarity reply": lambda e, c: build_verifier({"name": "string_similarity"}).score(msg(e), c),
    "tool_name reply": lambda e, c: build_verifier({"name": "tool_name"}).score(msg(e), c),
    "tool_call free-text argument": lambda e, c: build_verifier({"name": "tool_call"}).score(
        call("transfer_to_human_agents", summary=e), hermes("transfer_to_human_agents", summary=c)),
    "string_similarity call": lambda e, c: build_verifier({"name": "string_similarity"}).score(
        call("transfer_to_human_agents", summary=e), hermes("transfer_to_human_agents", summary=c)),
}

# kind, expert text, the same text with one fact changed, (expected fact, changed fact), a surface-only variant
NEAR_MISSES = [
    ("reservation id", "Your reservation 3FRNFB is confirmed.", "Your reservation 3FRNFD is confirmed.",
     ("3FRNFB", "3FRNFD"), "your reservation **3FRNFB** is confirmed"),
    ("flight number", "Flight HAT045 departs on time.", "Flight HAT054 departs on time.", ("HAT045", "HAT054"),
     "FLIGHT HAT045 DEPARTS ON TIME!"),
    ("user id", "I found the profile of sophia_silva_7557.", "I found the profile of sophia_silva_7575.",
     ("sophia_silva_7557", "sophia_silva_7575"), "I found the   profile of `sophia_silva_7557`"),
    ("order id", "Order #W8859225 has been cancelled.", "Order #W8859252 has been cancelled.",
     ("W8859225", "W8859252"), "order #W8859225 has been cancelled"),
    ("money", "Your total is $45.", "Your total is $450.", ("$45", "$450"), "Your total is *$45*"),
    ("money with cents", "A refund of $1,200.50 was issued.", "A refund of $1,200.05 was issued.",
     ("$1,200.50", "$1,200.05"), "a refund of $1,200.50 was issued!"),
    ("percent", "You get a 10% discount on the fare.", "You get a 15% discount on the fare.", ("10%", "15%"),
     "You get a __10%__ discount on the fare"),
    ("number with unit", "Each checked bag may weigh up to 23 kg.", "Each checked bag may weigh up to 32 kg.",
     ("23 kg", "32 kg"), "Each checked bag may weigh up to 23 kg"),
    ("plain number", "There are 3 passengers on this booking.", "There are 4 passengers on this booking.",
     ("3", "4"), "There are 3 passengers on this booking"),
    ("ISO date", "The flight on 2024-05-17 is delayed.", "The flight on 2024-05-18 is delayed.",
     ("2024-05-17", "2024-05-18"), "The flight on **2024-05-17** is delayed!"),
    ("long date", "Your trip starts on May 17, 2024.", "Your trip starts on May 7, 2024.",
     ("May 17, 2024", "May 7, 2024"), "your trip starts on May 17, 2024"),
    ("year of a date", "Your trip starts on May 17, 2024.", "Your trip starts on May 17, 2025.",
     ("May 17, 2024", "May 17, 2025"), "Your Trip Starts On May 17, 2024."),
    ("time", "Boarding starts at 3:30 PM today.", "Boarding starts at 3:30 AM today.", ("3:30 PM", "3:30 AM"),
     "boarding starts at 3:30 pm today"),
    ("email", "I sent the receipt to jane.doe@example.com today.", "I sent the receipt to jane.dot@example.com today.",
     ("jane.doe@example.com", "jane.dot@example.com"), "I sent the receipt to Jane.Doe@example.com today"),
    ("url", "The policy is at https://example.com/baggage for you.", "The policy is at https://example.com/bagage for you.",
     ("https://example.com/baggage", "https://example.com/bagage"), "The policy is at https://example.com/baggage for you"),
    ("quoted string", "Reply with 'confirm' to proceed now.", "Reply with 'cancel' to proceed now.",
     ("'confirm'", "'cancel'"), 'Reply with "confirm" to proceed now!'),
    ("airport code", "Your flight from JFK to ORD is booked.", "Your flight from JFK to LGA is booked.",
     ("ORD", "LGA"), "your flight from JFK to ORD is booked"),
]


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("kind,expert,changed,diff,surface", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_one_changed_fact_is_a_fact_mismatch(setup, kind, expert, changed, diff, surface):
    score = SETUPS[setup](expert, changed)
    assert (score.reward, score.reason) == (0.0, Reason.FACT_MISMATCH), score
    assert score.detail.endswith(f"expected {diff[0]}, got {diff[1]}"), score.detail


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("kind,expert,changed,diff,surface", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_surface_only_variants_score_one(setup, kind, expert, changed, diff, surface):
    score = SETUPS[setup](expert, surface)
    assert (score.reward, score.reason) == (1.0, Reason.OK), score


def test_the_issue_example():
    s = build_verifier({"name": "tool_call"}).score(msg("Your total is $45"), "Your total is $450")
    assert s == (0.0, Reason.FACT_MISMATCH, "reply: expected $45, got $450")
    s = build_verifier({"name": "tool_call"}).score(
        call("transfer_to_human_agents", summary="User wants to cancel reservation 3FRNFB, booked 2 days ago."),
        hermes("transfer_to_human_agents", summary="User wants to cancel reservation 3FRNFD, booked 2 days ago."))
    assert s == (0.0, Reason.FACT_MISMATCH, "summary: expected 3FRNFB, got 3FRNFD")


# ---------------------------------------------------------------------------------------------------
# normalization: one fact, many spellings

SAME_FACT = [
    ("money", ["$1,200.00", "$1200", "1200 dollars", "USD 1200", "$1.2k", "US$1,200"]),
    ("money, millions", ["$3 million", "$3M", "$3,000,000"]),
    ("date", ["May 17, 2024", "2024-05-17", "17 May 2024", "05/17/2024", "17th of May, 2024", "may 17th, 2024"]),
    ("date without a year", ["May 17", "17th May", "May 17th"]),
    ("time", ["3pm", "15:00", "3:00 p.m.", "3 PM", "15:00:00"]),
    ("percent", ["10%", "10 percent", "10.0 %"]),
    ("unit", ["23 kg", "23kg", "23 kilograms", "23.0 kgs"]),
    ("id", ["3FRNFB", "3frnfb"]),
    ("email", ["Jane.Doe@Example.com", "jane.doe@example.com"]),
    ("quoted", ["'confirm'", '"confirm"', "\u201cConfirm\u201d"]),
]


@pytest.mark.parametrize("kind,spellings", SAME_FACT, ids=[s[0] for s in SAME_FACT])
def test_spellings_of_one_fact_are_equal(kind, spellings):
    facts = [extract(f"The value is {s} here.") for s in spellings]
    assert all(len(f.facts) == 1 for f in facts), [f.facts for f in facts]
    assert len({(f.facts[0].kind, f.facts[0].key) for f in facts}) == 1, [f.facts for f in facts]


DIFFERENT_FACTS = [
    ("money vs plain number", "$45", "45"),
    ("date with and without a year", "May 17, 2024", "May 17"),
    ("month vs day first is not guessed for ISO", "2024-05-06", "2024-06-05"),
    ("am vs pm", "3 AM", "3 PM"),
    ("percent vs number", "10%", "10"),
    ("unit", "23 kg", "23 lb"),
    ("leading digit of an id", "3FRNFB", "4FRNFB"),
]


@pytest.mark.parametrize("label,a,b", DIFFERENT_FACTS, ids=[d[0] for d in DIFFERENT_FACTS])
def test_different_facts_differ(label, a, b):
    assert fact_difference(extract(f"The value is {a} here."), extract(f"The value is {b} here.")) is not None


def test_no_facts_in_plain_words():
    tf = extract("Sure, I can help you change your flight. May I have your user id?")
    assert tf.facts == () and tf.codes == {}
    assert tf.rest == "sure i can help you change your flight may i have your user id"
    assert extract("OK, what is your user ID?").codes == {}  # all-caps words that name no value


def test_shouting_and_its_lower_case_copy_agree():
    shout = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."
    assert fact_difference(extract(shout), extract(shout.lower())) is None
    assert fact_difference(extract("Flying JFK to ORD."), extract("Flying jfk to ord.")) is None
    assert fact_difference(extract("Flying JFK to ORD."), extract("Flying JFK to LGA.")) == "expected ORD, got LGA"


def test_fact_modes():
    expert = "Flight HAT045 on May 17 costs $45."
    fewer = "Flight HAT045 costs $45."
    more = "Flight HAT045 on May 17 costs $45, plus $10 for a bag."
    wrong = "Flight HAT045 on May 18 costs $45."
    exact = build_verifier({"name": "tool_call"})
    subset = build_verifier({"name": "tool_call", "facts": "subset"})
    ignore = build_verifier({"name": "tool_call", "facts": "ignore"})
    assert exact.score(msg(expert), fewer) == (0.0, Reason.FACT_MISMATCH, "reply: expected May 17, got none")
    assert subset.score(msg(expert), fewer).reward == 1.0  # may leave facts out ...
    assert subset.score(msg(expert), more) == (0.0, Reason.FACT_MISMATCH, "reply: unexpected $10")  # never add one
    assert subset.score(msg(expert), wrong) == (0.0, Reason.FACT_MISMATCH, "reply: expected May 17, got May 18")
    assert ignore.score(msg(expert), wrong).reward == 1.0  # the version-1 comparison, kept for ablations
    assert build_verifier({"name": "string_similarity", "facts": "ignore"}).score(
        msg("Your total is $45"), "Your total is $450").reward == 1.0


def test_similarity_still_applies_after_facts_match():
    s = build_verifier({"name": "tool_call"}).score(msg("Your reservation 3FRNFB is cancelled."),
                                                    "I booked 3FRNFB for you, enjoy the trip to the beach!")
    assert s.reason == Reason.TEXT_DIFFERENT


# ---------------------------------------------------------------------------------------------------
# arithmetic arguments

ARITHMETIC = [
    # expert expression, candidate expression, (reward, reason)
    ("175 + 200", "175+200", (1.0, Reason.OK)),
    ("175 + 200", " (175 + 200) ", (1.0, Reason.OK)),
    ("175 + 200", "((175)) + (200)", (1.0, Reason.OK)),
    ("175 + 200", "200 + 175", (1.0, Reason.OK)),
    ("175 + 200", "175.0 + 200", (1.0, Reason.OK)),
    ("2 * ((350 - 122) + (499 - 127))", "2*((350-122)+(499-127))", (1.0, Reason.OK)),
    ("2 * ((350 - 122) + (499 - 127))", "2 * (350 - 122 + 499 - 127)", (1.0, Reason.OK)),
    ("2^3", "2 ** 3", (1.0, Reason.OK)),
    ("175 + 200", "175 + 300", (0.0, Reason.FACT_MISMATCH)),
    ("175 + 200", "175 + 2000", (0.0, Reason.FACT_MISMATCH)),
    ("175 + 200", "175 - 200", (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("175 + 200", "175 * 200", (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("2 * (3 + 4)", "2 * 3 + 4", (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("10 - 4", "4 - 10", (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("2 ** 3 ** 2", "(2 ** 3) ** 2", (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("9 ** 9 ** 9 ** 9", "9 ** 9 ** 9 ** 8", (0.0, Reason.FACT_MISMATCH)),  # compared, never evaluated
    ("175 + 200", "__import__('os').system('echo hi')", (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("175 + 200", "175 + 200 + x", (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
]


@pytest.mark.parametrize("expert,candidate,verdict", ARITHMETIC)
def test_arithmetic_arguments(expert, candidate, verdict):
    for spec in ({"name": "tool_call"}, {"name": "tool_call", "mode": "f1", "strings": "casefold"}):
        s = build_verifier(spec).score(call("calculate", expression=expert), hermes("calculate", expression=candidate))
        assert (s.reward, s.reason) == verdict, s.detail
    if verdict[0] == 0.0:  # string_similarity sees the expression as one fact too
        s = build_verifier({"name": "string_similarity"}).score(call("calculate", expression=expert),
                                                                hermes("calculate", expression=candidate))
        assert s.reward == 0.0, s


def test_arithmetic_detail_and_the_old_behaviour():
    s = build_verifier({"name": "tool_call"}).score(call("calculate", expression="175 + 200"),
                                                    hermes("calculate", expression="175 + 300"))
    assert s.detail == "expression: expected 200, got 300"
    # Without the parse an expression is a value, not free text: a changed number is another string (version 2
    # compared it by word overlap, 0.8 >= 0.75, and paid 1.0).
    old = build_verifier({"name": "tool_call", "arithmetic": False, "facts": "ignore"})
    expr = "2 * ((350 - 122) + (499 - 127))"
    s = old.score(call("calculate", expression=expr), hermes("calculate", expression=expr.replace("499", "498")))
    assert (s.reward, s.reason) == (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)


def test_expression_parser_accepts_only_arithmetic():
    for text in ("175", "-5", "2024-05-17", "05/17/2024", "1,200 + 5", "x + 1", "abs(-1)", "1 < 2", "(" * 300 + "1",
                 "1e5 + 1", "", "+", "[1, 2] + [3]"):
        assert parse_expression(text) is None, text


# ---------------------------------------------------------------------------------------------------
# properties

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILLER = ["your", "the", "reservation", "flight", "is", "confirmed", "for", "and", "total", "please", "check",
          "booking", "we", "have", "updated", "passenger", "on", "at", "to", "with"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def _money(v):
    n, c = v
    return [f"${n:,}.{c:02d}", f"USD {n}.{c:02d}"] if c else [f"${n:,}", f"${n}", f"{n} dollars", f"USD {n}"]


def _date(d):
    return [d.isoformat(), f"{MONTHS[d.month - 1]} {d.day}, {d.year}", f"{d.day} {MONTHS[d.month - 1]} {d.year}"]


def _time(v):
    h, m = v
    return [f"{h:02d}:{m:02d}", f"{(h + 11) % 12 + 1}:{m:02d} {'PM' if h >= 12 else 'AM'}"]


# kind -> (strategy of fact values, renderings of a value). Values differ <=> facts differ.
FACT_KINDS = {
    "money": (st.tuples(st.integers(0, 10**7), st.integers(0, 99)), _money),
    "id": (st.from_regex(r"[A-Z]{1,4}[0-9]{1,5}[A-Z0-9]{0,3}[0-9]", fullmatch=True), lambda v: [v]),
    "date": (st.dates(min_value=__import__("datetime").date(1990, 1, 1)), _date),
    "time": (st.tuples(st.integers(0, 23), st.sampled_from([0, 5, 15, 30, 45])), _time),
    "number with unit": (st.tuples(st.integers(0, 10**6), st.sampled_from(["kg", "miles", "hours", "%"])),
                         lambda v: [f"{v[0]} {v[1]}", f"{v[0]}{v[1]}"]),
    "email": (st.from_regex(r"[a-z]{2,8}\.[a-z]{2,8}@[a-z]{3,8}\.com", fullmatch=True), lambda v: [v]),
    "code": (st.from_regex(r"[A-Z]{3}", fullmatch=True).filter(lambda w: w.lower() not in FILLER), lambda v: [v]),
    "quoted": (st.from_regex(r"[a-z]{2,8}( [a-z]{2,8}){0,2}", fullmatch=True), lambda v: [f"'{v}'", f'"{v}"']),
}


@st.composite
def near_miss(draw):
    """(expert text, candidate text) around one fact of a random kind, the candidate's value changed."""
    kind = draw(st.sampled_from(sorted(FACT_KINDS)))
    values, render = FACT_KINDS[kind]
    value, other = draw(values), draw(values)
    if kind in ("email", "code", "quoted", "id"):
        assume(value.casefold() != other.casefold())
    else:
        assume(value != other)
    before = draw(st.lists(st.sampled_from(FILLER), min_size=2, max_size=6))
    after = draw(st.lists(st.sampled_from(FILLER), min_size=1, max_size=6))
    a, b = draw(st.sampled_from(render(value))), draw(st.sampled_from(render(other)))
    return " ".join(before + [a] + after) + ".", " ".join(before + [b] + after) + "."


@SETTINGS
@given(near_miss())
def test_a_changed_fact_never_scores_one(pair):
    expert, candidate = pair
    for setup, score in SETUPS.items():
        s = score(expert, candidate)
        assert s.reward < 1.0 and s.reason == Reason.FACT_MISMATCH, (setup, s)


def _surface(text: str, data) -> str:
    """Emphasis, case of the filler words, spacing and end punctuation changed; facts untouched."""
    words = text.split(" ")
    out = []
    for w in words:
        if w.rstrip(".") in FILLER:
            w = data.draw(st.sampled_from([w, w.upper(), w.capitalize(), f"**{w}**", f"_{w}_"]))
        out.append(w + data.draw(st.sampled_from(["", " ", "\n"])))
    text = " ".join(out)
    return data.draw(st.sampled_from([text, text.rstrip(".") + "!", text.rstrip("."), "  " + text]))


@SETTINGS
@given(near_miss(), st.data())
def test_surface_variants_of_texts_with_facts_score_one(pair, data):
    expert = pair[0]
    candidate = _surface(expert, data)
    for setup, score in SETUPS.items():
        s = score(expert, candidate)
        assert (s.reward, s.reason) == (1.0, Reason.OK), (setup, candidate, s)


@st.composite
def arithmetic(draw, depth=3):
    if depth == 0 or draw(st.booleans()):
        return str(draw(st.integers(0, 9999)))
    op = draw(st.sampled_from(["+", "-", "*", "/", "%", "**"]))
    return f"({draw(arithmetic(depth - 1))} {op} {draw(arithmetic(depth - 1))})"


@SETTINGS
@given(arithmetic(), st.data())
def test_arithmetic_spacing_never_counts_and_a_changed_number_always_does(expr, data):
    assume(any(op in expr for op in "+-*/%"))
    v = build_verifier({"name": "tool_call"})
    respaced = re.sub(r"\s+", lambda _: data.draw(st.sampled_from(["", " ", "  "])), expr)
    assert v.score(call("calculate", expression=expr), hermes("calculate", expression=f"({respaced})")).reward == 1.0
    numbers = list(re.finditer(r"\d+", expr))
    m = data.draw(st.sampled_from(numbers))
    new = str(int(m.group(0)) + data.draw(st.integers(1, 50)))
    changed = expr[:m.start()] + new + expr[m.end():]
    s = v.score(call("calculate", expression=expr), hermes("calculate", expression=changed))
    assert (s.reward, s.reason) == (0.0, Reason.FACT_MISMATCH), (expr, changed, s)


# ---------------------------------------------------------------------------------------------------
# real replies

_RESERVATION = re.compile(r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6}\b")


def test_real_airline_replies(shared_data_dir):
    """tau2 airline replies: a changed reservation id is a FACT_MISMATCH, a shouted or emphasized copy is not."""
    path = shared_data_dir / "tau2-bench" / "airline_run1.json"
    if not path.exists():
        pytest.skip(f"{path} absent")
    replies = {m["content"] for sim in json.loads(path.read_text())["simulations"] for m in sim["messages"]
               if m["role"] == "assistant" and not m.get("tool_calls") and isinstance(m.get("content"), str)
               and m["content"].strip()}
    v = build_verifier({"name": "tool_call"})
    n_changed = 0
    for text in sorted(replies):
        surface = "**" + text.replace(". ", ".  ").rstrip(".") + "**"
        assert v.score(msg(text), surface).reward == 1.0, text
        m = _RESERVATION.search(text)
        if m:
            token = m.group(0)
            other = token[:-1] + ("X" if token[-1] != "X" else "Y")
            s = v.score(msg(text), text[:m.start()] + other + text[m.end():])
            assert s.reason == Reason.FACT_MISMATCH and s.detail.endswith(f"got {other}"), (text, s)
            n_changed += 1
    assert len(replies) > 100 and n_changed > 30


LAYOUT_SAME = [
    ("numbered list flattened", "Two options:\n1. Flight HAT131 at $228\n2. Flight HAT190 at $464",
     "Two options: 1. Flight HAT131 at $228 2. Flight HAT190 at $464"),
    ("bullets numbered and flattened", "Two options:\n- Flight HAT131 at $228\n- Flight HAT190 at $464",
     "Two options: 1. Flight HAT131 at $228 2. Flight HAT190 at $464"),
    ("nested lists flattened", "Plan:\n* **Flight 1**\n    * Price: $53\n    * Cabin: economy\n* **Flight 2**\n"
     "    * Price: $71", "Plan: 1. **Flight 1** 1. Price: $53 2. Cabin: economy 2. **Flight 2** 1. Price: $71"),
    ("a list of one, introduced by a colon", "Please confirm the change:\n* Passenger: Mia Li",
     "Please confirm the change: 1. Passenger: Mia Li"),
    ("a list of one item in bold", "Summary\n* **Total: $1000.00**", "Summary 1. **Total: $1000.00**"),
    ("partly flattened", "Steps:\n1. cancel\n2. rebook 3. refund", "Steps: 1. cancel 2. rebook\n3. refund"),
]


@pytest.mark.parametrize("label,expert,candidate", LAYOUT_SAME, ids=[c[0] for c in LAYOUT_SAME])
def test_a_list_laid_out_otherwise_states_the_same_facts(label, expert, candidate):
    assert fact_difference(extract(expert), extract(candidate)) is None, (extract(expert), extract(candidate))


LAYOUT_CHANGED = [
    ("a changed amount in a flattened list", "Two options:\n1. HAT131 at $228\n2. HAT190 at $464",
     "Two options: 1. HAT131 at $228 2. HAT190 at $465"),
    ("renumbered", "Steps: 1. cancel 2. rebook 3. refund", "Steps: 1. cancel 2. rebook 4. refund"),
    ("a sentence-final number changed", "You have 2. Then we rebook.", "You have 3. Then we rebook."),
    ("a lone number", "Bags checked: 1. Anything else?", "Bags checked: 2. Anything else?"),
    ("a number that continues a list, changed", "1. cancel 2. rebook. Nights: 3. Done.",
     "1. cancel 2. rebook. Nights: 2. Done."),
    ("a lone 1 dropped", "We found 1. Okay?", "We found. Okay?"),
    ("dates are not list numbers", "Flights on May 1. Then on May 2. Fine.", "Flights on May 1. Then on May 3. Fine."),
]


@pytest.mark.parametrize("label,expert,candidate", LAYOUT_CHANGED, ids=[c[0] for c in LAYOUT_CHANGED])
def test_a_changed_number_is_never_taken_for_a_list_number(label, expert, candidate):
    assert fact_difference(extract(expert), extract(candidate)) is not None


def test_real_airline_replies_laid_out_on_one_line(shared_data_dir):
    """The issue's case: tau2 replies with their lists numbered and flattened keep their facts; one changed
    amount in that layout is still a FACT_MISMATCH."""
    path = shared_data_dir / "tau2-bench" / "airline_run1.json"
    if not path.exists():
        pytest.skip(f"{path} absent")
    replies = {m["content"] for sim in json.loads(path.read_text())["simulations"] for m in sim["messages"]
               if m["role"] == "assistant" and not m.get("tool_calls") and isinstance(m.get("content"), str)
               and BULLET.search(m["content"] or "")}
    v = build_verifier({"name": "tool_call"})
    for text in sorted(replies):
        laid_out = numbered_and_flattened(text)
        assert v.score(msg(text), laid_out).reward == 1.0, laid_out
        money = re.search(r"\$(\d+)", laid_out)
        if money:
            changed = laid_out[:money.start(1)] + str(int(money.group(1)) + 1) + laid_out[money.end(1):]
            assert v.score(msg(text), changed).reason == Reason.FACT_MISMATCH, changed
    assert len(replies) > 30


def test_punctuation_and_alphabet_do_not_crash_extraction():
    for text in (string.punctuation * 3, "\x00\x01 \ud800 $", "$" * 1000, "1" * 5000, "'" * 50 + '"' * 50,
                 "May " * 100 + "17", "12:" * 100, "http://" + "a" * 1000):
        tf = extract(text)
        assert isinstance(tf.rest, str)
