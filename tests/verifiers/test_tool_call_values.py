"""tool_call v3 (issue 24): no wrong value rewarded, several accepted answers per argument, string rules."""

from __future__ import annotations

import json

import pytest

from pivot_assets.core.ids import canonical_json
from pivot_assets.ingest.bfcl import expected_action
from pivot_assets.verifiers import DomainVerifiers, Reason, build_verifier
from pivot_assets.verifiers.arguments import is_free_text, looks_like_a_name
from pivot_assets.verifiers.parsing import prepare_expected


def call(name: str, **args) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(args)}


def hermes(name: str, **args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def tool(name: str, **props) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


TOOL_CALL = build_verifier({"name": "tool_call"})

# ---------------------------------------------------------------------------------------------------
# 1. no wrong value rewarded: the issue's false accepts, each with and without tool schemas

WRONG_VALUES = [
    ("id off by one", "account_id", 123456789, 123456790, {"type": "integer"}),
    ("amount off by ten", "total_payout", 50000000, 50000010, {"type": "integer"}),
    ("small float doubled", "capacitance", 1e-7, 2e-7, {"type": "number"}),
    ("small float vs zero", "capacitance", 5e-7, 0, {"type": "number"}),
    ("a float's last digit", "rate", 0.0525, 0.0526, {"type": "number"}),
    ("infinity is no large number", "limit", 1e308, float("inf"), {"type": "number"}),
    ("museum", "museum_name", "Metropolitan Museum of Art", "Metropolitan Museum of Norway", {"type": "string"}),
    ("law", "law", "Law of Universal Gravitation", "Law of marble Gravitation", {"type": "string"}),
    ("city", "location", "New York, New York", "New York, New Norway", {"type": "string"}),
    ("a name in a free-text-named argument", "description", "Metropolitan Museum of Art",
     "Metropolitan Museum of Norway", {"type": "string"}),
    ("one changed word of a short value", "condition", "open on Sundays", "open on Mondays", {"type": "string"}),
]


@pytest.mark.parametrize("label,arg,expert,candidate,prop", WRONG_VALUES, ids=[w[0] for w in WRONG_VALUES])
def test_a_wrong_value_is_never_paid(label, arg, expert, candidate, prop):
    for tools in (None, [tool("f", **{arg: prop})]):
        s = TOOL_CALL.score(call("f", **{arg: expert}), hermes("f", **{arg: candidate}), tools)
        assert s.reward == 0.0, (tools is not None, s)


SAME_VALUES = [
    ("float noise", "x", 0.1 + 0.2, 0.3),
    ("int for an integral float", "x", 5.0, 5),
    ("huge floats", "x", 1e300, 1e300),
    ("whitespace in a name", "city", "New  York", " New York"),
    ("free text paraphrase", "message", "customer wants a refund for the cancelled flight",
     "the customer wants a refund for a cancelled flight"),
    ("free text case and punctuation", "body", "Dear Jane, this is a reminder for our meeting tomorrow.",
     "dear jane this is a reminder for our meeting tomorrow"),
]


@pytest.mark.parametrize("label,arg,expert,candidate", SAME_VALUES, ids=[w[0] for w in SAME_VALUES])
def test_the_same_value_is_paid(label, arg, expert, candidate):
    s = TOOL_CALL.score(call("f", **{arg: expert}), hermes("f", **{arg: candidate}))
    assert (s.reward, s.reason) == (1.0, Reason.OK), s


def test_free_text_still_checks_facts():
    s = TOOL_CALL.score(call("f", message="Refund $45 for reservation 3FRNFB please"),
                        hermes("f", message="Refund $450 for reservation 3FRNFB please"))
    assert (s.reward, s.reason) == (0.0, Reason.FACT_MISMATCH)


def test_free_text_is_decided_by_schema_name_and_shape():
    assert is_free_text("message", None, "please call me back tomorrow", 5, 3)
    assert is_free_text("comment_content", None, "ready for the next adventure", 5, 3)
    assert is_free_text("searchQuery", None, "cheap flights to somewhere warm", 5, 3)
    assert not is_free_text("museum_name", None, "the museum of modern art", 5, 3)  # a value name
    assert not is_free_text("message", None, "Metropolitan Museum of Art", 4, 3)  # a name-shaped value
    assert not is_free_text("message", {"enum": ["a b c"]}, "a b c", 3, 3)  # constrained by the schema
    assert not is_free_text("message", None, "two words", 2, 3)  # too short
    assert is_free_text("x", {"description": "The text of the note"}, "see you at the game tonight", 6, 3)
    assert not is_free_text("x", {"description": "Name of the venue"}, "the old town hall and garden", 6, 3)
    assert not is_free_text("condition", None, "open on Sundays", 3, 3)  # nothing says free text, and short
    assert is_free_text("final_result", None, "the company had about 164,000 employees as of September 2022", 10, 3)
    assert looks_like_a_name("New York, NY") and looks_like_a_name("Law of Universal Gravitation")
    assert not looks_like_a_name("refund USD 40 for HAT045 on May 17")  # codes, ids and dates do not count


def test_json_text_for_a_declared_array_is_a_type_error_whatever_the_other_arguments():
    tools = [tool("f", weights={"type": "array", "items": {"type": "number"}}, label={"type": "string"})]
    expert = call("f", weights=[0.8, 0.7], label="run 1")
    for candidate in (hermes("f", weights="[0.8, 0.7]", label="run 1"),  # otherwise identical
                      hermes("f", weights="[0.8, 0.7]", label="run  1")):  # another argument differs in form
        s = TOOL_CALL.score(expert, candidate, tools)
        assert (s.reward, s.reason) == (0.0, Reason.SCHEMA_INVALID), s
        assert s.detail.startswith("weights: expected array, got string")
    # Without tool schemas nothing declares a type: JSON text is decoded as before.
    assert TOOL_CALL.score(expert, hermes("f", weights="[0.8, 0.7]", label="run 1")).reward == 1.0


# ---------------------------------------------------------------------------------------------------
# 3. string rules

@pytest.mark.parametrize("expert,candidate,verdicts", [
    ("all", "All", {"exact": 0.0, "casefold": 1.0, "bfcl": 1.0}),  # short and long strings alike
    ("Los Angeles Lakers", "los angeles lakers", {"exact": 0.0, "casefold": 1.0, "bfcl": 1.0}),
    ("New York, NY", "New York NY", {"exact": 0.0, "casefold": 0.0, "bfcl": 1.0}),
    ("e-mail", "email", {"exact": 0.0, "casefold": 0.0, "bfcl": 1.0}),
    ("it's", 'it"s', {"exact": 0.0, "casefold": 0.0, "bfcl": 1.0}),
    ("New York", "New Jersey", {"exact": 0.0, "casefold": 0.0, "bfcl": 0.0}),
])
def test_string_rules(expert, candidate, verdicts):
    for rule, reward in verdicts.items():
        s = build_verifier({"name": "tool_call", "strings": rule}).score(call("f", team=expert), hermes("f", team=candidate))
        assert s.reward == reward, (rule, s)


def test_an_enum_string_is_the_member_it_spells():
    tools = [tool("f", genotype={"type": "string", "enum": ["AA", "Aa", "aa"]},
                  unit={"type": "string", "enum": ["celsius", "fahrenheit"]})]
    bfcl = build_verifier({"name": "tool_call", "strings": "bfcl"})
    # One member spelled: read as that member (under the chosen rule only).
    assert bfcl.score(call("f", unit="celsius"), hermes("f", unit="Celsius"), tools).reward == 1.0
    s = TOOL_CALL.score(call("f", unit="celsius"), hermes("f", unit="Celsius"), tools)
    assert (s.reward, s.reason) == (0.0, Reason.SCHEMA_INVALID)
    # Several members spelled the same under the rule: the value as written (AA is not Aa).
    s = bfcl.score(call("f", genotype="Aa"), hermes("f", genotype="AA"), tools)
    assert (s.reward, s.reason) == (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)


def test_the_string_rule_is_in_the_fingerprint_and_the_old_knobs_are_retired():
    prints = {build_verifier({"name": "tool_call", "strings": r}).fingerprint for r in ("exact", "casefold", "bfcl")}
    assert len(prints) == 3
    assert TOOL_CALL.fingerprint == build_verifier({"name": "tool_call", "strings": "exact"}).fingerprint
    for old in ("ignore_case", "strip_punctuation", "collapse_whitespace"):
        with pytest.raises(ValueError, match=f"parameter '{old}' was replaced"):
            build_verifier({"name": "tool_call", old: True})


# ---------------------------------------------------------------------------------------------------
# 2. acceptable

def accepted(name: str, arguments: dict, acceptable: dict) -> dict:
    return {"type": "function_call", "name": name, "arguments": arguments, "acceptable": acceptable}


AREA = accepted("area", {"base": 10, "height": 5, "unit": "cm"},
                {"base": [10], "height": [5], "unit": ["cm", "centimeters", ""]})
AREA_TOOLS = [tool("area", base={"type": "integer"}, height={"type": "integer"}, unit={"type": "string"})]

ACCEPTABLE_CASES = [
    ("the demonstration", hermes("area", base=10, height=5, unit="cm"), (1.0, Reason.OK)),
    ("another listed value", hermes("area", base=10, height=5, unit="centimeters"), (1.0, Reason.OK)),
    ("a listed value under the string rule", hermes("area", base=10, height=5, unit=" cm"), (1.0, Reason.OK)),
    ("omitted where the list holds ''", hermes("area", base=10, height=5), (1.0, Reason.OK)),
    ("an unlisted value", hermes("area", base=10, height=5, unit="mm"), (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("a wrong number", hermes("area", base=11, height=5), (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("missing without ''", hermes("area", base=10, unit="cm"), (0.0, Reason.MISSING_ARGUMENT)),
    ("an unlisted argument", hermes("area", base=10, height=5, color="red"), (0.0, Reason.EXTRA_ARGUMENT)),
    ("a wrong type", hermes("area", base="10", height=5), (0.0, Reason.SCHEMA_INVALID)),
]


@pytest.mark.parametrize("label,candidate,verdict", ACCEPTABLE_CASES, ids=[c[0] for c in ACCEPTABLE_CASES])
def test_acceptable_values(label, candidate, verdict):
    for tools in (AREA_TOOLS, None):
        if tools is None and verdict[1] == Reason.SCHEMA_INVALID:
            continue  # a declared type needs the schema
        s = TOOL_CALL.score(AREA, candidate, tools)
        assert (s.reward, s.reason) == verdict, (tools is not None, s)


def test_the_reason_names_the_argument_and_the_accepted_values():
    s = TOOL_CALL.score(AREA, hermes("area", base=10, height=5, unit="mm"))
    assert s.detail == "unit: got 'mm', accepted: 'cm', 'centimeters' or omitted"
    s = TOOL_CALL.score(AREA, hermes("area", base=10, unit="cm"))
    assert s.detail == "missing argument 'height' (accepted: 5)"


def test_a_schema_required_argument_cannot_be_omitted_even_when_listed_with_blank():
    action = accepted("f", {"a": 1}, {"a": [1, ""]})
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
    assert TOOL_CALL.score(action, hermes("f"), tools).reason == Reason.MISSING_ARGUMENT
    assert TOOL_CALL.score(action, hermes("f")).reward == 1.0


def test_dict_values_list_accepted_values_per_key():
    """BFCL's dict_checker: a dict among the accepted values holds, per key, a list of accepted values."""
    action = expected_action([{"book": {"filters": [{"genre": ["fiction", "novel"], "year": [2001, ""]}],
                                        "rooms": [[{"type": ["single"], "n": [1, ""]}, {"type": ["double"]}]]}}])
    ok = [({"genre": "novel"}, [{"type": "single"}, {"type": "double"}]),
          ({"genre": "fiction", "year": 2001}, [{"type": "single", "n": 1}, {"type": "double"}])]
    bad = [({"genre": "poetry"}, [{"type": "single"}, {"type": "double"}]),
           ({"genre": "novel", "year": 2002}, [{"type": "single"}, {"type": "double"}]),
           ({"genre": "novel", "price": 3}, [{"type": "single"}, {"type": "double"}]),
           ({"year": 2001}, [{"type": "single"}, {"type": "double"}]),
           ({"genre": "novel"}, [{"type": "double"}, {"type": "single"}]),
           ({"genre": "novel"}, [{"type": ["single"]}, {"type": ["double"]}])]  # the pattern as written is no value
    for filters, rooms in ok:
        assert TOOL_CALL.score(action, hermes("book", filters=filters, rooms=rooms)).reward == 1.0, (filters, rooms)
    for filters, rooms in bad:
        assert TOOL_CALL.score(action, hermes("book", filters=filters, rooms=rooms)).reward == 0.0, (filters, rooms)


def test_each_call_of_a_batch_has_its_own_acceptable():
    action = expected_action([{"weather": {"city": ["Paris", "Paris, France"], "unit": ["", "C"]}},
                              {"weather": {"city": ["Tokyo"], "unit": ["F"]}}])
    good = hermes("weather", city="Tokyo", unit="F") + hermes("weather", city="Paris, France")
    assert TOOL_CALL.score(action, good).reward == 1.0
    # Tokyo may not omit its unit, and Paris may not take F: each call is held to its own list.
    s = TOOL_CALL.score(action, hermes("weather", city="Tokyo") + hermes("weather", city="Paris", unit="F"))
    assert s.reward == 0.0 and "accepted" in s.detail
    f1 = build_verifier({"name": "tool_call", "mode": "f1"}).score(
        action, hermes("weather", city="Tokyo", unit="F") + hermes("weather", city="Paris", unit="F"))
    assert f1.reward == 0.5


def test_acceptable_survives_parsing_and_is_checked():
    parsed, err = prepare_expected(canonical_json(AREA))  # as the turns table stores it
    assert err is None and parsed.calls[0].acceptable["unit"].omittable
    for bad, fragment in (({**AREA, "acceptable": ["cm"]}, "must map arguments"),
                          ({**AREA, "acceptable": {"base": [10], "height": [5], "unit": []}}, "non-empty list"),
                          ({**AREA, "acceptable": {"base": [10], "height": [5]}}, "'unit' is not in acceptable")):
        s = TOOL_CALL.score(bad, hermes("area", base=10, height=5))
        assert s.reason == Reason.INVALID_EXPECTED and fragment in s.detail, s
    # A candidate's own `acceptable` is no part of it.
    s = TOOL_CALL.score(call("area", base=10), {**accepted("area", {"base": 11}, {"base": [10, 11]})})
    assert s.reward == 0.0


def test_acceptable_reaches_profiling_and_the_grpo_reward():
    from pivot_assets.training.grpo import make_verifier_reward

    expert = canonical_json(AREA)
    completions = [hermes("area", base=10, height=5, unit="centimeters"), hermes("area", base=10, height=5, unit="mm")]
    rows = [{"domain": "geo", "expected_action": expert, "candidate": c, "tools": json.dumps(AREA_TOOLS)}
            for c in completions]
    verifiers = DomainVerifiers({"default": {"name": "tool_call"}})
    assert [s.reward for s in verifiers.score_rows(rows)] == [1.0, 0.0]  # profiling's call
    reward = make_verifier_reward(verifiers)  # GRPO's (evaluation scores with the same verifier.score)
    assert reward(prompts=["p", "p"], completions=completions, expert_action=[expert] * 2,
                  tools=[json.dumps(AREA_TOOLS)] * 2, domain=["geo"] * 2) == [1.0, 0.0]
