"""Continuous rewards in the verifiers: tool_call's argument-fraction credit, graded string_similarity, and the pass
threshold each verifier states (what turn_profiles.n_pass and the exports' pass_rate count)."""

from __future__ import annotations

import itertools
import json

import pytest

from pivot_assets.verifiers import DomainVerifiers, Reason, build_verifier
from pivot_assets.verifiers.base import passes

EXPECTED = {"type": "function_call", "name": "book",
            "arguments": json.dumps({"flight": "UA100", "seats": 2, "cabin": "economy"})}
TOOLS = [{"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "required": ["flight", "seats"],
    "properties": {"flight": {"type": "string"}, "seats": {"type": "integer"},
                   "cabin": {"type": "string", "enum": ["economy", "business"]},
                   "note": {"type": "string", "default": ""}}}}}]
BINARY = build_verifier({"name": "tool_call"})
CREDIT = build_verifier({"name": "tool_call", "credit": "arguments", "pass_threshold": 0.6})


def hermes(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


CASES = [  # (candidate, the reward under credit: arguments, its reason)
    (hermes("book", flight="UA100", seats=2, cabin="economy"), 1.0, Reason.OK),
    (hermes("book", flight="UA100", seats=3, cabin="economy"), 2 / 3, Reason.ARGUMENT_VALUE_DIFFERENT),
    (hermes("book", flight="UA100", seats=2), 2 / 3, Reason.MISSING_ARGUMENT),
    (hermes("book", flight="UA100", seats=2, cabin="economy", meal="veg"), 3 / 4, Reason.EXTRA_ARGUMENT),
    (hermes("book", flight="UA101", seats=5), 0.0, Reason.MISSING_ARGUMENT),
    (hermes("book", flight="UA100", seats=2, cabin="economy", note=""), 1.0, Reason.OK),  # a default is no extra
    (hermes("cancel", flight="UA100", seats=2, cabin="economy"), 0.0, Reason.UNEXPECTED_TOOL),
    ("I booked UA100 for you.", 0.0, Reason.SPOKE_INSTEAD_OF_CALL),
]


@pytest.mark.parametrize("candidate,reward,reason", CASES)
def test_argument_credit_pays_the_share_of_right_arguments_and_keeps_the_verdict(candidate, reward, reason):
    credited, binary = CREDIT.score(EXPECTED, candidate, TOOLS), BINARY.score(EXPECTED, candidate, TOOLS)
    assert credited.reward == pytest.approx(reward) and credited.reason == reason
    assert (binary.reason, binary.detail) == (credited.reason, credited.detail)  # credit changes the reward only
    assert binary.reward == (1.0 if reason == Reason.OK else 0.0)


def test_an_invalid_call_gets_no_credit():
    wrong_type = hermes("book", flight="UA100", seats="2", cabin="economy")  # "2" for a declared integer
    off_enum = hermes("book", flight="UA100", seats=2, cabin="first")
    for candidate in (wrong_type, off_enum):
        s = CREDIT.score(EXPECTED, candidate, TOOLS)
        assert (s.reward, s.reason) == (0.0, Reason.SCHEMA_INVALID), s


def test_accepted_values_are_credited_argument_by_argument():
    expected = {"type": "function_call", "name": "weather", "arguments": json.dumps({"city": "Paris", "unit": "C"}),
                "acceptable": {"city": ["Paris", "Paris, France"], "unit": ["C", "celsius", ""], "days": [1, ""]}}
    score = CREDIT.score
    assert score(expected, hermes("weather", city="Paris, France")).reward == 1.0
    assert score(expected, hermes("weather", city="Lyon")).reward == 0.0  # only city counts: unit and days may go
    assert score(expected, hermes("weather", city="Lyon", unit="celsius")).reward == pytest.approx(1 / 2)
    assert score(expected, hermes("weather", city="Paris", unit="F", days=1)).reward == pytest.approx(2 / 3)
    assert score(expected, hermes("weather", unit="C")).reward == pytest.approx(1 / 2)  # city left out: a miss
    assert score(expected, hermes("weather", city="Paris", wind=True)).reward == pytest.approx(1 / 2)


def test_full_reward_only_for_an_ok_verdict_over_every_combination():
    """Over every mix of right, wrong, missing and extra arguments: 1.0 exactly when the verdict is OK, and the
    credited reward is the share of right arguments."""
    options = {"flight": ["UA100", "UA999", None], "seats": [2, 7, None], "cabin": ["economy", "business", None]}
    for values in itertools.product(*options.values()):
        args = {k: v for k, v in zip(options, values) if v is not None}
        for extra in ({}, {"meal": "veg"}):
            s = CREDIT.score(EXPECTED, hermes("book", **args, **extra), TOOLS)
            right = sum(1 for k, v in args.items() if v == options[k][0])
            assert (s.reward == 1.0) == (s.reason == Reason.OK), (args, extra, s)
            if s.reason in (Reason.OK, Reason.ARGUMENT_VALUE_DIFFERENT, Reason.MISSING_ARGUMENT, Reason.EXTRA_ARGUMENT):
                assert s.reward == pytest.approx(right / (3 + len(extra))), (args, extra, s)


def test_parallel_calls_keep_their_mode():
    """Credit is per call: a batch is still paid by `mode` (binary: a perfect matching; f1: matched calls)."""
    batch = {"type": "function_call_batch", "calls": [
        {"name": "a", "arguments": json.dumps({"x": 1})}, {"name": "b", "arguments": json.dumps({"y": 2})}]}
    candidate = hermes("a", x=1) + hermes("b", y=3)
    assert CREDIT.score(batch, candidate).reward == 0.0
    f1 = build_verifier({"name": "tool_call", "credit": "arguments", "mode": "f1"})
    assert f1.score(batch, candidate).reward == pytest.approx(0.5)


def test_graded_string_similarity_is_continuous_and_passes_at_its_threshold():
    graded = build_verifier({"name": "string_similarity", "graded": True, "threshold": 0.7, "facts": "ignore"})
    reply = {"type": "message", "content": "Your booking is confirmed for tomorrow morning."}
    s = graded.score(reply, "Your booking is confirmed for tomorrow evening.")
    assert 0.7 <= s.reward < 1.0 and s.reason == Reason.OK and graded.passes(s.reward)
    far = graded.score(reply, "Sorry, no.")
    assert 0.0 < far.reward < 0.7 and not graded.passes(far.reward)
    assert graded.pass_threshold == 0.7
    assert build_verifier({"name": "string_similarity", "threshold": 0.7}).pass_threshold == 1.0  # 0/1 rewards


def test_pass_thresholds_of_a_verifier_section():
    section = DomainVerifiers({"default": {"name": "tool_call", "credit": "arguments", "pass_threshold": 0.5},
                               "domains": {"chat": {"name": "string_similarity", "graded": True, "threshold": 0.6},
                                           "strict": {"name": "exact"}}})
    assert section.pass_thresholds == {None: 0.5, "chat": 0.6, "strict": 1.0}
    assert BINARY.pass_threshold == 1.0 and CREDIT.passes(2 / 3) and not CREDIT.passes(0.5)
    assert not passes(0.0, 0.0) and passes(1.0, 1.0)  # a reward of 0 never passes


def test_credit_and_threshold_are_checked_and_in_the_fingerprint():
    with pytest.raises(ValueError, match=r"parameter 'credit' must be one of \['binary', 'arguments'\]"):
        build_verifier({"name": "tool_call", "credit": "partial"})
    with pytest.raises(ValueError, match=r"'pass_threshold'=1.5 outside \[0.0, 1.0\]"):
        build_verifier({"name": "tool_call", "pass_threshold": 1.5})
    assert len({BINARY.fingerprint, CREDIT.fingerprint,
                build_verifier({"name": "tool_call", "credit": "arguments"}).fingerprint}) == 3


@pytest.mark.scenario  # two Great Expectations runs: over 5 s
def test_profiles_count_passes_by_each_domain_verifiers_threshold_and_the_contract_checks_it(tmp_path):
    """turn_profiles.n_pass from the real profiler SQL, one threshold per domain (a quote in a name included), and
    the turn_profiles contract's n_pass_gap, which a miscounted n_pass fails."""
    import polars as pl
    import pyarrow as pa

    from pivot_assets.core.catalog import REWARDS_SCHEMA
    from pivot_assets.core.config import AdaptiveSection
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.curation.contracts import run_contract
    from pivot_assets.profiling.adaptive import annotate
    from pivot_assets.profiling.profiler import build_profiles

    section = DomainVerifiers({"default": {"name": "exact"},
                               "domains": {"graded": {"name": "string_similarity", "graded": True, "threshold": 0.5},
                                           "o'k": {"name": "tool_call", "credit": "arguments", "pass_threshold": 0.3}}})
    samples = {"graded": [0.0, 0.4, 0.5, 0.9], "o'k": [0.0, 0.25, 1 / 3, 2 / 3], "plain": [0.0, 0.5, 1.0, 1.0]}
    wh = Warehouse(tmp_path / "wh")
    turns = [{"turn_id": f"t-{d}", "trajectory_id": f"tr-{d}", "domain": d, "message_index": 2, "turn_index": 0,
              "action_kind": "message", "expert_action": '{"content":"ok","type":"message"}', "tool_names": []}
             for d in samples]
    rewards = [{"turn_id": f"t-{d}", "policy_fp": "pol", "sampling_fp": "samp", "sample_index": i, "verifier_fp": "ver",
                "domain": d, "reward": r, "reason": "OK", "detail": None, "action": "a"}
               for d, values in samples.items() for i, r in enumerate(values)]
    wh.write_table("turns", pl.DataFrame(turns).to_arrow())
    wh.append_part("rollout_rewards", pa.Table.from_pylist(rewards, schema=REWARDS_SCHEMA))
    counts = build_profiles(wh, "pol", "samp", "ver", [t["turn_id"] for t in turns],
                            pass_thresholds=section.pass_thresholds)
    profiles = pl.from_arrow(annotate(counts, AdaptiveSection(), 4, 0.6)[0])
    got = {r["domain"]: (r["n_pass"], r["pass_threshold"]) for r in profiles.iter_rows(named=True)}
    assert got == {"graded": (2, 0.5), "o'k": (2, 0.3), "plain": (2, 1.0)}
    assert got == {d: (sum(section.for_domain(d).passes(r) for r in v), section.for_domain(d).pass_threshold)
                   for d, v in samples.items()}

    params = {"lambda_diff": 0.6, "policy_k": 4}
    related = {"rollout_rewards": pl.DataFrame(rewards)}
    assert run_contract("turn_profiles", profiles, related=related, params=params).success
    miscounted = profiles.with_columns(pl.col("n_pass") + (pl.col("domain") == "graded").cast(pl.Int32))
    result = run_contract("turn_profiles", miscounted, related=related, params=params)
    assert not result.success and "n_pass_gap" in result.summary()
