"""Table-driven tests of the verifier library: parsing, every verifier, every reason category, config, CLI logic."""

from __future__ import annotations

import io
import json

import pytest

from pivot_assets.verifiers import (
    DomainVerifiers,
    Reason,
    Score,
    build_verifier,
    parse_candidate,
    verify_jsonl,
)


def call(name: str, **args) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(args)}


def hermes(name: str, **args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def msg(text: str) -> dict:
    return {"type": "message", "content": text}


WEATHER_TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "units": {"type": "string", "enum": ["metric", "imperial"], "default": "metric"},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}]
# The same tool as a flat Responses-style schema (NeMo-Gym rows).
WEATHER_TOOLS_FLAT = [{"type": "function", **WEATHER_TOOLS[0]["function"]}]


# ---------------------------------------------------------------------------------------------------
# parsing

PARSE_CASES = [
    ("hermes", hermes("f", a=1), {"type": "function_call", "name": "f", "arguments": '{"a":1}'}),
    ("hermes batch", hermes("f", a=1) + "\n" + hermes("g"),
     {"type": "function_call_batch", "calls": [
         {"type": "function_call", "name": "f", "arguments": '{"a":1}'},
         {"type": "function_call", "name": "g", "arguments": "{}"}]}),
    ("unclosed final block with complete JSON", '<tool_call>{"name": "f", "arguments": {"a": 1}}',
     {"type": "function_call", "name": "f", "arguments": '{"a":1}'}),
    ("bare JSON, parameters alias, 1.0", '{"name": "f", "parameters": {"a": 1.0}}',
     {"type": "function_call", "name": "f", "arguments": '{"a":1}'}),
    ("fenced JSON", '```json\n{"name": "f", "arguments": {}}\n```', {"type": "function_call", "name": "f", "arguments": "{}"}),
    ("JSON list of calls", '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]',
     {"type": "function_call_batch", "calls": [
         {"type": "function_call", "name": "f", "arguments": "{}"},
         {"type": "function_call", "name": "g", "arguments": "{}"}]}),
    ("mistral prefix", '[TOOL_CALLS][{"name": "f", "arguments": {"x": "y"}}]',
     {"type": "function_call", "name": "f", "arguments": '{"x":"y"}'}),
    ("think stripped", "<think>I should call f</think>" + hermes("f"), {"type": "function_call", "name": "f", "arguments": "{}"}),
    ("think tags inside arguments are data", "<think>ok</think>" + hermes("f", a="<think>", b="</think> x"),
     {"type": "function_call", "name": "f", "arguments": '{"a":"<think>","b":"</think> x"}'}),
    ("think tags inside bare JSON are data", '{"name": "f", "arguments": {"a": "<think>"}}',
     {"type": "function_call", "name": "f", "arguments": '{"a":"<think>"}'}),
    ("orphan </think> from the template", "reasoning...</think>\nHello there", msg("Hello there")),
    ("plain text", "  Sure, which city?  ", msg("Sure, which city?")),
    ("JSON-looking prose", '{"answer": 42}', msg('{"answer": 42}')),
    ("doubly encoded arguments", {"name": "f", "arguments": json.dumps(json.dumps({"a": 1}))},
     {"type": "function_call", "name": "f", "arguments": '{"a":1}'}),
    ("openai message", {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"b": 2, "a": 1}'}}]},
     {"type": "function_call", "name": "f", "arguments": '{"a":1,"b":2}'}),
    ("openai message with hermes text content", {"role": "assistant", "content": hermes("f")},
     {"type": "function_call", "name": "f", "arguments": "{}"}),
    ("openai message, content parts", {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}, msg("hi")),
    ("responses output items", [{"type": "reasoning", "summary": []},
                                {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "x"}],
     {"type": "function_call", "name": "f", "arguments": "{}"}),
    ("responses message item", [{"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": "done"}]}], msg("done")),
    ("action dict", call("f", a=[1, 2]), {"type": "function_call", "name": "f", "arguments": '{"a":[1,2]}'}),
    ("invalid utf-8 bytes", b"caf\xe9 ok", msg("caf\ufffd ok")),
]


@pytest.mark.parametrize("label,candidate,expected", PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_candidate(label, candidate, expected):
    action, err = parse_candidate(candidate)
    assert err is None, err
    assert action == expected


PARSE_ERRORS = [
    ("empty", "   ", "empty completion"),
    ("unclosed think", "<think>still thinking about", "reasoning block never closed"),
    ("truncated tool call", '<tool_call>{"name": "f", "argu', "tool call cut off"),
    ("bad JSON in block", "<tool_call>{name: f}</tool_call>", "invalid JSON"),
    ("block without name", '<tool_call>{"arguments": {}}</tool_call>', "missing tool name"),
    ("arguments not an object", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ("arguments not JSON", {"name": "f", "arguments": "{oops"}, "not valid JSON"),
    ("unsupported type", 42, "unsupported candidate type"),
    ("unknown action type", {"type": "image", "url": "x"}, "unrecognized candidate object"),
    ("non-JSON object", {"name": "f", "arguments": {"a": {1, 2}}}, "not JSON-serializable"),
]


@pytest.mark.parametrize("label,candidate,fragment", PARSE_ERRORS, ids=[c[0] for c in PARSE_ERRORS])
def test_parse_errors_never_raise(label, candidate, fragment):
    action, err = parse_candidate(candidate)
    assert action is None
    assert fragment in err
    assert "\n" not in err
    score = build_verifier({"name": "tool_call"}).score(call("f"), candidate)
    reason = Reason.TRUNCATED if label in ("unclosed think", "truncated tool call") else Reason.PARSE_ERROR
    assert score == Score(0.0, reason, err)


# ---------------------------------------------------------------------------------------------------
# tool_call: every reason category

TOOL_CALL_CASES = [
    # label, spec params, expected, candidate, tools, (reward, reason)
    ("same call", {}, call("get_weather", city="Paris"), hermes("get_weather", city="Paris"), None, (1.0, Reason.OK)),
    ("key order + 1 vs 1.0 + whitespace", {}, call("f", a=1, b={"y": 2, "x": 3}),
     '{"name":"f","arguments":{ "b" : {"x":3.0,"y":2} , "a":1.0 }}', None, (1.0, Reason.OK)),
    ("arguments as JSON text vs object", {}, {"type": "function_call", "name": "f", "arguments": {"a": 1}},
     {"name": "f", "arguments": '{"a": 1}'}, None, (1.0, Reason.OK)),
    ("JSON string vs array inside", {}, call("f", ids=[1, 2]), hermes("f", ids="[1, 2]"), None, (1.0, Reason.OK)),
    ("whitespace in strings", {}, call("f", q="new  york"), hermes("f", q=" new york"), None, (1.0, Reason.OK)),
    ("case differs (case-sensitive default)", {}, call("f", id="ABC1"), hermes("f", id="abc1"), None,
     (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("case differs, strings casefold", {"strings": "casefold"}, call("f", id="ABC1"), hermes("f", id="abc1"), None,
     (1.0, Reason.OK)),
    ("punctuation, strings bfcl", {"strings": "bfcl"}, call("f", q="Paris, France"),
     hermes("f", q="Paris France"), None, (1.0, Reason.OK)),
    ("free text above threshold", {}, call("f", note="customer wants a refund for the cancelled flight"),
     hermes("f", note="the customer wants a refund for a cancelled flight"), None, (1.0, Reason.OK)),
    ("free text below threshold", {}, call("f", note="customer wants a refund for the cancelled flight"),
     hermes("f", note="upgrade the seat to business class please"), None, (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("short strings compared exactly", {}, call("f", city="New York"), hermes("f", city="New Jersey"), None,
     (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("float tolerance", {}, call("f", x=0.1 + 0.2), hermes("f", x=0.3), None, (1.0, Reason.OK)),
    ("bool is not 1", {}, call("f", flag=True), hermes("f", flag=1), None, (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("number vs string", {}, call("f", n=5), hermes("f", n="5"), None, (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("list order matters by default", {}, call("f", l=[1, 2]), hermes("f", l=[2, 1]), None,
     (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("unordered_lists", {"unordered_lists": True}, call("f", l=[1, 2, 2]), hermes("f", l=[2, 1, 2]), None,
     (1.0, Reason.OK)),
    ("wrong tool", {}, call("get_weather", city="Paris"), hermes("get_time", city="Paris"), None,
     (0.0, Reason.UNEXPECTED_TOOL)),
    ("missing argument", {}, call("f", a=1, b=2), hermes("f", a=1), None, (0.0, Reason.MISSING_ARGUMENT)),
    ("extra argument", {}, call("f", a=1), hermes("f", a=1, b=2), None, (0.0, Reason.EXTRA_ARGUMENT)),
    ("nested missing key", {}, call("f", o={"a": 1, "b": 2}), hermes("f", o={"a": 1}), None,
     (0.0, Reason.MISSING_ARGUMENT)),
    ("ignore_arguments", {"ignore_arguments": ["goal"]}, call("f", a=1, goal="x"), hermes("f", a=1, goal="y"), None,
     (1.0, Reason.OK)),
    ("schema default counts as absent", {}, call("get_weather", city="Paris"),
     hermes("get_weather", city="Paris", units="metric"), WEATHER_TOOLS, (1.0, Reason.OK)),
    ("schema default, flat tools as JSON text", {}, call("get_weather", city="Paris", units="metric"),
     hermes("get_weather", city="Paris"), json.dumps(WEATHER_TOOLS_FLAT), (1.0, Reason.OK)),
    ("float default 1.0 counts as absent", {}, call("scale", x=2),
     hermes("scale", x=2, factor=1), [{"type": "function", "name": "scale", "parameters": {
         "type": "object", "properties": {"x": {"type": "number"}, "factor": {"type": "number", "default": 1.0}}}}],
     (1.0, Reason.OK)),
    ("int too large for a float", {}, call("f", n=1e308), '{"name": "f", "arguments": {"n": 1' + "0" * 400 + "}}", None,
     (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ("non-default optional differs", {}, call("get_weather", city="Paris"),
     hermes("get_weather", city="Paris", units="imperial"), WEATHER_TOOLS, (0.0, Reason.EXTRA_ARGUMENT)),
    ("equivalent but schema-invalid", {}, call("get_weather", city="Paris", days=2),
     hermes("get_weather", city="Paris", days=2.0000001), WEATHER_TOOLS, (0.0, Reason.SCHEMA_INVALID)),
    ("enum value in another case", {}, call("get_weather", city="Paris", units="imperial"),
     hermes("get_weather", city="Paris", units="IMPERIAL"), WEATHER_TOOLS, (0.0, Reason.SCHEMA_INVALID)),
    ("enum value in another case, strings casefold: the member it spells", {"strings": "casefold"},
     call("get_weather", city="Paris", units="imperial"), hermes("get_weather", city="Paris", units="IMPERIAL"),
     WEATHER_TOOLS, (1.0, Reason.OK)),
    ("equivalent but below the schema's minimum", {}, call("get_weather", city="Paris", days=0),
     hermes("get_weather", city=" Paris", days=0), WEATHER_TOOLS, (0.0, Reason.SCHEMA_INVALID)),
    ("schema off", {"validate_schema": False}, call("get_weather", city="Paris", days=0),
     hermes("get_weather", city=" Paris", days=0), WEATHER_TOOLS, (1.0, Reason.OK)),
    ("spoke instead of call", {}, call("f"), "Let me check that for you.", None, (0.0, Reason.SPOKE_INSTEAD_OF_CALL)),
    ("called instead of speaking", {}, msg("Which city?"), hermes("f"), None, (0.0, Reason.CALLED_INSTEAD_OF_SPEAK)),
    ("text vs text similar", {}, msg("Which city are you flying to?"), "Which city are you flying to ?", None,
     (1.0, Reason.OK)),
    ("text vs text different: never an automatic 1.0", {}, msg("Your booking is cancelled."),
     "I can't help with that.", None, (0.0, Reason.TEXT_DIFFERENT)),
    ("text verifier = exact", {"text_verifier": {"name": "exact"}}, msg("Which city?"), "Which city ?", None,
     (0.0, Reason.TEXT_DIFFERENT)),
    ("parse error", {}, call("f"), "<tool_call>{broken</tool_call>", None, (0.0, Reason.PARSE_ERROR)),
    ("invalid expected action", {}, {"type": "function_call", "name": "f", "arguments": "{oops"}, hermes("f"), None,
     (0.0, Reason.INVALID_EXPECTED)),
]


@pytest.mark.parametrize("label,params,expected,candidate,tools,verdict", TOOL_CALL_CASES,
                         ids=[c[0] for c in TOOL_CALL_CASES])
def test_tool_call_table(label, params, expected, candidate, tools, verdict):
    score = build_verifier({"name": "tool_call", **params}).score(expected, candidate, tools)
    assert (score.reward, score.reason) == verdict, score.detail
    assert isinstance(score.detail, str) and "\n" not in score.detail


def batch(*calls: dict) -> dict:
    return {"type": "function_call_batch", "calls": list(calls)}


PARIS, TOKYO, CAIRO = (call("get_weather", city=c) for c in ("Paris", "Tokyo", "Cairo"))

BATCH_CASES = [
    ("permutation", "binary", batch(PARIS, TOKYO, CAIRO),
     hermes("get_weather", city="Cairo") + hermes("get_weather", city="Paris") + hermes("get_weather", city="Tokyo"),
     1.0, Reason.OK),
    ("one missing, binary", "binary", batch(PARIS, TOKYO, CAIRO),
     hermes("get_weather", city="Cairo") + hermes("get_weather", city="Paris"), 0.0, Reason.WRONG_CALL_COUNT),
    ("one missing, f1", "f1", batch(PARIS, TOKYO, CAIRO),
     hermes("get_weather", city="Cairo") + hermes("get_weather", city="Paris"), 0.8, Reason.WRONG_CALL_COUNT),
    ("one wrong value, binary", "binary", batch(PARIS, TOKYO),
     hermes("get_weather", city="Tokyo") + hermes("get_weather", city="Lima"), 0.0, Reason.ARGUMENT_VALUE_DIFFERENT),
    ("one wrong value, f1", "f1", batch(PARIS, TOKYO),
     hermes("get_weather", city="Tokyo") + hermes("get_weather", city="Lima"), 0.5, Reason.ARGUMENT_VALUE_DIFFERENT),
    ("duplicates are a multiset", "binary", batch(PARIS, PARIS),
     hermes("get_weather", city="Paris") + hermes("get_weather", city="Tokyo"), 0.0, Reason.ARGUMENT_VALUE_DIFFERENT),
    ("single expected, two candidates", "binary", PARIS,
     hermes("get_weather", city="Paris") + hermes("get_weather", city="Paris"), 0.0, Reason.WRONG_CALL_COUNT),
    ("wrong tool in batch", "binary", batch(PARIS, call("get_time", tz="UTC")),
     hermes("get_weather", city="Paris") + hermes("get_date", tz="UTC"), 0.0, Reason.UNEXPECTED_TOOL),
    ("equivalent after normalization in a batch", "binary", batch(PARIS, call("f", n=1)),
     hermes("f", n=1.0) + hermes("get_weather", city=" Paris"), 1.0, Reason.OK),
]


@pytest.mark.parametrize("label,mode,expected,candidate,reward,reason", BATCH_CASES, ids=[c[0] for c in BATCH_CASES])
def test_parallel_calls(label, mode, expected, candidate, reward, reason):
    score = build_verifier({"name": "tool_call", "mode": mode}).score(expected, candidate)
    assert score.reward == pytest.approx(reward)
    assert score.reason == reason, score.detail


def test_large_batches_do_not_explode():
    expected = batch(*[call("f", i=i) for i in range(300)])
    candidate = "".join(hermes("f", i=i) for i in reversed(range(300)))
    assert build_verifier({"name": "tool_call"}).score(expected, candidate).reward == 1.0
    wrong = "".join(hermes("f", i=i + 1000) for i in range(300))
    assert build_verifier({"name": "tool_call", "mode": "f1"}).score(expected, wrong).reward == 0.0


# ---------------------------------------------------------------------------------------------------
# the other verifiers

OTHER_CASES = [
    # spec, expected, candidate, (reward, reason)
    ({"name": "exact"}, call("f", a=1, b=2), '{"name": "f", "arguments": {"b": 2, "a": 1.0}}', (1.0, Reason.OK)),
    ({"name": "exact"}, call("f", q="a b"), hermes("f", q="a  b"), (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ({"name": "exact"}, call("f"), hermes("g"), (0.0, Reason.UNEXPECTED_TOOL)),
    ({"name": "exact"}, batch(PARIS, TOKYO), hermes("get_weather", city="Tokyo") + hermes("get_weather", city="Paris"),
     (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    ({"name": "exact"}, batch(PARIS, TOKYO), hermes("get_weather", city="Tokyo"), (0.0, Reason.WRONG_CALL_COUNT)),
    ({"name": "exact"}, msg("Hello  there"), "Hello there", (1.0, Reason.OK)),
    ({"name": "exact"}, msg("Hello there"), "Hello there!", (0.0, Reason.TEXT_DIFFERENT)),
    ({"name": "exact"}, msg("Hello"), hermes("f"), (0.0, Reason.CALLED_INSTEAD_OF_SPEAK)),
    ({"name": "exact"}, call("f"), "Hello", (0.0, Reason.SPOKE_INSTEAD_OF_CALL)),
    ({"name": "string_similarity", "threshold": 0.8}, msg("The flight is cancelled."),
     "The flight is canceled.", (1.0, Reason.OK)),
    ({"name": "string_similarity", "threshold": 0.8}, msg("The flight is cancelled."),
     "Please share your user id.", (0.0, Reason.TEXT_DIFFERENT)),
    ({"name": "string_similarity", "mode": "commands", "threshold": 1.0}, call("run", command="ls -la 'my dir'"),
     hermes("run", command='ls  -la "my dir"'), (1.0, Reason.OK)),
    ({"name": "string_similarity", "mode": "commands", "threshold": 0.9}, call("run", command="rm -rf build"),
     hermes("run", command="cat notes.md"), (0.0, Reason.ARGUMENT_VALUE_DIFFERENT)),
    # Facts come first in commands too: README is a code word the expert's command does not have.
    ({"name": "string_similarity", "mode": "commands", "threshold": 0.9}, call("run", command="rm -rf build"),
     hermes("run", command="cat README.md"), (0.0, Reason.FACT_MISMATCH)),
    ({"name": "string_similarity", "mode": "commands"}, call("run", command="head -n 20 log.txt"),
     hermes("run", command="head -n 200 log.txt"), (0.0, Reason.FACT_MISMATCH)),
    ({"name": "string_similarity", "mode": "commands", "facts": "ignore"}, call("run", command="head -n 20 log.txt"),
     hermes("run", command="head -n 200 log.txt"), (1.0, Reason.OK)),
    ({"name": "string_similarity", "mode": "commands", "threshold": 0.9}, msg("ls -la"), "ls   -la",
     (1.0, Reason.OK)),
    ({"name": "string_similarity", "mode": "commands"}, call("run", command="ls"), hermes("shell", command="ls"),
     (0.0, Reason.UNEXPECTED_TOOL)),
    ({"name": "string_similarity", "mode": "commands"}, batch(call("run", command="ls"), call("run", command="pwd")),
     hermes("run", command="ls"), (0.0, Reason.WRONG_CALL_COUNT)),
    ({"name": "string_similarity", "mode": "commands", "threshold": 0.9, "graded": True},
     call("run", command="pytest tests/test_a.py"), hermes("run", command="pytest tests/test_b.py"),
     (pytest.approx(0.9545, abs=1e-3), Reason.OK)),
    ({"name": "tool_name"}, call("str_replace_editor", path="a.py"), hermes("str_replace_editor", path="b.py"),
     (1.0, Reason.OK)),
    ({"name": "tool_name"}, call("edit"), hermes("grep"), (0.0, Reason.UNEXPECTED_TOOL)),
    ({"name": "tool_name", "aliases": {"sed": "edit", "str_replace_editor": "edit"}}, call("str_replace_editor"),
     hermes("sed", expr="s/a/b/"), (1.0, Reason.OK)),
    ({"name": "tool_name"}, batch(call("a"), call("b")), hermes("b") + hermes("a"), (1.0, Reason.OK)),
    ({"name": "tool_name"}, batch(call("a"), call("b")), hermes("b"), (0.0, Reason.WRONG_CALL_COUNT)),
    # Reply vs reply is compared as text (facts first), not paid a flat 1.0 ...
    ({"name": "tool_name"}, msg("done"), "All finished.", (0.0, Reason.TEXT_DIFFERENT)),
    ({"name": "tool_name"}, msg("Your total is $45."), "Your total is $450.", (0.0, Reason.FACT_MISMATCH)),
    ({"name": "tool_name"}, msg("Your total is $45."), "your total is **$45**", (1.0, Reason.OK)),
    ({"name": "tool_name", "text_verifier": {"name": "exact"}}, msg("done"), "All finished.",
     (0.0, Reason.TEXT_DIFFERENT)),
    # ... unless explicitly asked for (operation type only, the paper's SWE setting).
    ({"name": "tool_name", "accept_any_reply": True}, msg("done"), "All finished.", (1.0, Reason.OK)),
    ({"name": "tool_name"}, call("submit"), "I am done", (0.0, Reason.SPOKE_INSTEAD_OF_CALL)),
]


@pytest.mark.parametrize("spec,expected,candidate,verdict", OTHER_CASES,
                         ids=[f"{i}-{c[0]['name']}" for i, c in enumerate(OTHER_CASES)])
def test_other_verifiers(spec, expected, candidate, verdict):
    score = build_verifier(spec).score(expected, candidate)
    assert (score.reward, score.reason) == verdict, score.detail


def test_string_similarity_long_texts_are_compared_exactly():
    v = build_verifier({"name": "string_similarity", "max_chars": 100})
    long = "word " * 100
    assert v.score(msg(long), long).reward == 1.0
    s = v.score(msg(long), long + "extra")
    assert s.reason == Reason.TEXT_DIFFERENT and "longer than 100" in s.detail


STACK_CASES = [
    # mode, steps, candidate, (reward, reason, detail prefix)
    ("all", [{"name": "tool_name"}, {"name": "tool_call"}], hermes("f", a=1), (1.0, Reason.OK, "all steps")),
    ("all", [{"name": "tool_name"}, {"name": "tool_call"}], hermes("f", a=2),
     (0.0, Reason.ARGUMENT_VALUE_DIFFERENT, "tool_call:")),
    ("all", [{"name": "tool_name"}, {"name": "tool_call"}], hermes("g", a=1), (0.0, Reason.UNEXPECTED_TOOL, "tool_name:")),
    ("any", [{"name": "exact"}, {"name": "tool_name"}], hermes("f", a=2), (1.0, Reason.OK, "tool_name:")),
    ("any", [{"name": "exact"}, {"name": "tool_name"}], hermes("g", a=2), (0.0, Reason.UNEXPECTED_TOOL, "exact:")),
    ("all", [{"name": "tool_call"}], "<tool_call>{", (0.0, Reason.TRUNCATED, "")),
]


@pytest.mark.parametrize("mode,steps,candidate,verdict", STACK_CASES)
def test_stack(mode, steps, candidate, verdict):
    v = build_verifier({"name": "stack", "mode": mode, "steps": steps})
    for score in (v.score(call("f", a=1), candidate),
                  v.score_many([{"expected_action": call("f", a=1), "candidate": candidate}])[0]):
        assert (score.reward, score.reason) == verdict[:2]
        assert score.detail.startswith(verdict[2]), score.detail


# ---------------------------------------------------------------------------------------------------
# registry, config, fingerprints

BAD_SPECS = [
    ({"name": "nope"}, "unknown verifier 'nope'"),
    ({"name": "tool_call", "threshold": 0.5}, "unknown parameter 'threshold'"),
    ({"name": "tool_call", "mode": "f2"}, "parameter 'mode' must be one of"),
    ({"name": "tool_call", "text_threshold": "high"}, "parameter 'text_threshold' must be float"),
    ({"name": "tool_call", "text_threshold": 1.5}, "outside"),
    ({"name": "tool_call", "strings": "lower"}, "parameter 'strings' must be one of"),
    ({"name": "tool_call", "ignore_case": True}, "parameter 'ignore_case' was replaced: strings: casefold"),
    ({"name": "string_similarity", "mode": "shell"}, "parameter 'mode'"),
    ({"name": "stack", "steps": []}, "at least one"),
    ({"name": "stack", "steps": [{"name": "exact", "x": 1}]}, "unknown parameter 'x'"),
    ({"name": "llm_judge", "model": "m"}, "missing required parameter 'base_url'"),
    ({"name": "llm_judge", "model": "m", "base_url": "ftp://x"}, "http(s) URL"),
    ({"name": "tool_name", "aliases": {"sed": 1}}, "alias 'sed'"),
    ({"name": "tool_name", "accept_any_reply": True, "text_verifier": {"name": "exact"}}, "not both"),
    ({"name": "tool_call", "facts": "loose"}, "parameter 'facts' must be one of"),
    ({"text_threshold": 0.5}, "must be a mapping with a 'name'"),
]


@pytest.mark.parametrize("spec,fragment", BAD_SPECS)
def test_bad_specs_raise_one_line_value_error(spec, fragment):
    with pytest.raises(ValueError) as exc:
        build_verifier(spec)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_fingerprints():
    a = build_verifier({"name": "tool_call"})
    assert a.fingerprint == build_verifier({"name": "tool_call", "mode": "binary"}).fingerprint
    assert a.fingerprint != build_verifier({"name": "tool_call", "text_threshold": 0.6}).fingerprint
    assert a.fingerprint != build_verifier({"name": "exact"}).fingerprint
    assert (a.name, a.version, a.config["mode"], a.config["facts"]) == ("tool_call", "3", "binary", "exact")
    assert a.fingerprint != build_verifier({"name": "tool_call", "facts": "ignore"}).fingerprint
    assert len(a.fingerprint) == 16
    judge = {"name": "llm_judge", "base_url": "http://127.0.0.1:9/v1", "model": "judge"}
    j = build_verifier(judge)
    # Operational settings (env var name, timeouts, cache path) never re-score; the model does.
    assert j.fingerprint == build_verifier({**judge, "api_key_env": "K", "timeout_s": 1.0, "cache_dir": "/x"}).fingerprint
    assert j.fingerprint != build_verifier({**judge, "model": "judge2"}).fingerprint
    s1 = build_verifier({"name": "stack", "steps": [{"name": "exact"}, judge]})
    s2 = build_verifier({"name": "stack", "steps": [{"name": "exact"}, {**judge, "model": "judge2"}]})
    assert s1.fingerprint != s2.fingerprint


@pytest.fixture
def edited_source(monkeypatch):
    """Pretend a package module's source was edited: edit(module, appended_text); caches reset either way."""
    from pivot_assets.verifiers import code_version

    original = code_version.read_module_source

    def edit(module: str, appended: str) -> None:
        monkeypatch.setattr(code_version, "read_module_source",
                            lambda m: original(m) + (appended if m == module else ""))
        code_version.clear_cache()

    yield edit
    monkeypatch.undo()
    code_version.clear_cache()


def test_fingerprint_covers_the_verifier_code(edited_source):
    names = ("tool_call", "string_similarity", "exact", "tool_name", "stack_of_exact")
    specs = {n: {"name": n} for n in names[:4]} | {"stack_of_exact": {"name": "stack", "steps": [{"name": "exact"}]}}
    before = {n: build_verifier(spec).fingerprint for n, spec in specs.items()}
    section = DomainVerifiers(None).fingerprint
    edited_source("facts", "\n_SOMETHING_NEW = 1\n")  # a helper tool_call and string_similarity use, exact does not
    after = {n: build_verifier(spec).fingerprint for n, spec in specs.items()}
    assert after["tool_call"] != before["tool_call"] and after["string_similarity"] != before["string_similarity"]
    assert after["tool_name"] != before["tool_name"]  # via its text verifier (string_similarity)
    assert after["exact"] == before["exact"] and after["stack_of_exact"] == before["stack_of_exact"]
    assert DomainVerifiers(None).fingerprint != section  # the scoring stage's code version moves with the code
    edited_source("base", "\n_SOMETHING_NEW = 1\n")  # every verifier builds on base
    assert all(build_verifier(spec).fingerprint != before[n] for n, spec in specs.items())
    edited_source("facts", "\n# a comment cannot change a verdict\n\n")
    assert build_verifier("tool_call").fingerprint == before["tool_call"]


def test_code_closure_follows_imports():
    from pivot_assets.verifiers.code_version import module_closure

    assert {"tool_call", "facts", "arithmetic", "canonical", "parsing", "base", "registry"} <= set(
        module_closure("tool_call"))
    assert "llm_judge" not in module_closure("tool_call") and "facts" not in module_closure("exact")


def _package_imports() -> dict[str, list]:
    """module -> ImportFrom nodes of package modules, for every module of pivot_assets/verifiers."""
    import ast
    from pathlib import Path

    from pivot_assets.verifiers import code_version

    out = {}
    for path in sorted(Path(code_version.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        out[path.stem] = [(node, node in tree.body) for node in ast.walk(tree)
                          if isinstance(node, ast.ImportFrom) and node.level == 1]
    return out


def test_no_import_cycles_in_the_verifier_package():
    """Imports are at module level and form a DAG (the registry imports no verifier back)."""
    imports = _package_imports()
    lazy = [(m, node.module) for m, nodes in imports.items() for node, top in nodes if not top]
    assert lazy == []
    graph = {m: {(node.module or "").split(".")[0] for node, _ in nodes} for m, nodes in imports.items()
             if m != "__init__"}
    assert graph["registry"] == {"base"}
    state: dict[str, str] = {}

    def visit(m: str, path: tuple) -> None:
        assert state.get(m) != "open", f"import cycle: {' -> '.join(path + (m,))}"
        if state.get(m) == "done":
            return
        state[m] = "open"
        for dep in graph.get(m, ()):
            visit(dep, path + (m,))
        state[m] = "done"

    for m in graph:
        visit(m, ())


def test_domain_verifiers():
    section = {"default": {"name": "tool_call", "text_threshold": 0.5},
               "domains": {"swe": {"name": "tool_name"}, "exact": {"name": "exact"}}}
    dv = DomainVerifiers(section)
    assert dv.for_domain("swe").name == "tool_name"
    assert dv.for_domain("unknown").name == "tool_call" and dv.for_domain(None).name == "tool_call"
    assert DomainVerifiers(None).default.name == "tool_call"
    fp = dv.fingerprint
    assert fp == DomainVerifiers(json.loads(json.dumps(section))).fingerprint
    changed = json.loads(json.dumps(section))
    changed["domains"]["swe"]["aliases"] = {"sed": "edit"}
    assert DomainVerifiers(changed).fingerprint != fp
    rows = [
        {"domain": "swe", "expected_action": call("edit", a=1), "candidate": hermes("edit", a=2)},
        {"domain": None, "expected_action": call("edit", a=1), "candidate": hermes("edit", a=2)},
        {"domain": "exact", "expected_action": call("edit", a=1), "candidate": hermes("edit", a=1.0)},
        {"domain": "swe", "expected_action": call("edit", a=1), "candidate": hermes("run")},
    ]
    assert [(s.reward, s.reason) for s in dv.score_rows(rows)] == [
        (1.0, Reason.OK), (0.0, Reason.ARGUMENT_VALUE_DIFFERENT), (1.0, Reason.OK), (0.0, Reason.UNEXPECTED_TOOL)]
    with pytest.raises(ValueError, match="domain 'swe'"):
        DomainVerifiers({"domains": {"swe": {"name": "tool_name", "bogus": 1}}})
    with pytest.raises(ValueError, match="unknown key 'defaults'"):
        DomainVerifiers({"defaults": {"name": "exact"}})


# ---------------------------------------------------------------------------------------------------
# pivot verify


def _line(**row) -> str:
    return json.dumps(row)


def test_verify_jsonl_one_output_line_per_input_line():
    lines = [
        _line(expected_action=call("f", a=1), candidate=hermes("f", a=1.0)),
        "not json",
        _line(expected_action=call("f", a=1)),
        _line(expected_action=call("f", a=1), candidate="hello"),
        "",
        _line(expected_action={"type": "function_call"}, candidate="x"),
        _line(expected_action=call("edit", a=1), candidate=hermes("edit", a=5), domain="swe"),
        _line(expected_action=call("f", a=1), candidate="x", domain=["swe"]),
    ]
    out = io.StringIO()
    counts = verify_jsonl(lines, out, DomainVerifiers({"domains": {"swe": {"name": "tool_name"}}}))
    results = [json.loads(x) for x in out.getvalue().splitlines()]
    assert len(results) == len(lines)
    assert results[0] == {"reward": 1.0, "reason": "OK", "detail": ""}
    assert "invalid JSON" in results[1]["error"]
    assert results[2] == {"error": "missing key 'candidate'"}
    assert results[3]["reason"] == "SPOKE_INSTEAD_OF_CALL"
    assert results[4] == {"error": "empty line"}
    assert "missing tool name" in results[5]["error"]
    assert results[6]["reward"] == 1.0  # tool_name for the swe domain
    assert "domain" in results[7]["error"]
    assert counts["lines"] == 8 and counts["scored"] == 3 and counts["errors"] == 5
    assert counts["reasons"] == {"OK": 2, "SPOKE_INSTEAD_OF_CALL": 1}


def test_verify_jsonl_verifier_override():
    out = io.StringIO()
    verify_jsonl([_line(expected_action=call("f", a=1), candidate=hermes("f", a=2), domain="swe")], out,
                 DomainVerifiers({"domains": {"swe": {"name": "tool_name"}}}), verifier_name="exact")
    assert json.loads(out.getvalue())["reason"] == "ARGUMENT_VALUE_DIFFERENT"
    with pytest.raises(ValueError, match="unknown verifier"):
        verify_jsonl([], io.StringIO(), DomainVerifiers(None), verifier_name="nope")


def test_verify_jsonl_with_a_config_section():
    """What `pivot verify --config` does with pivot.yaml's verifier section (the CLI itself is pivot_jobs/cli.py)."""
    section = {"default": {"name": "tool_call"}, "domains": {"swe": {"name": "tool_name"}}}
    lines = [_line(expected_action=call("f", a=1), candidate=hermes("f", b=1), domain="swe"),
             _line(expected_action=call("f", a=1), candidate=hermes("f", b=1)),
             _line(expected_action=msg("Your reservation 3FRNFB is cancelled."),
                   candidate="Your reservation 3FRNFD is cancelled.")]
    out = io.StringIO()
    counts = verify_jsonl(lines, out, DomainVerifiers(section))
    results = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["reason"] for r in results] == ["OK", "MISSING_ARGUMENT", "FACT_MISMATCH"]
    assert results[2]["detail"] == "reply: expected 3FRNFB, got 3FRNFD"
    assert counts["reasons"] == {"OK": 1, "MISSING_ARGUMENT": 1, "FACT_MISMATCH": 1}
    with pytest.raises(ValueError, match="unknown parameter 'colour'"):
        DomainVerifiers({"default": {"name": "tool_call", "colour": "red"}})


# ---------------------------------------------------------------------------------------------------
# real rows


def test_nemo_gym_argument_comparison_rows(shared_data_dir):
    """NeMo-Gym's own rows: every expected action scores 1 against itself; on its rollouts our tool_call verdict
    agrees with NeMo-Gym's reward for expected calls, and (unlike its server) a reply is not paid 1.0 for free."""
    base = shared_data_dir / "nemo-gym" / "resources_servers" / "single_step_tool_use_with_argument_comparison" / "data"
    if not base.is_dir():
        pytest.skip(f"{base} absent")
    v = build_verifier({"name": "tool_call"})
    n_self = 0
    for path in sorted(base.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            action, err = parse_candidate(row["expected_action"])
            assert err is None
            assert v.score(row["expected_action"], action, row["responses_create_params"].get("tools")).reward == 1.0
            n_self += 1
    assert n_self >= 10
    call_verdicts, message_rewards = [], []
    for line in (base / "example_rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        s = v.score(row["expected_action"], row["response"]["output"], row["responses_create_params"].get("tools"))
        if row["expected_action"]["type"] == "function_call":
            call_verdicts.append((s.reward, row["reward"]))
        else:
            message_rewards.append((s.reward, row["reward"]))
    assert call_verdicts and all(ours == theirs for ours, theirs in call_verdicts)
    assert any(theirs == 1.0 and ours < 1.0 for ours, theirs in message_rewards)
