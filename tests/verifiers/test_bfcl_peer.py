"""`tool_call` against BFCL's own AST checker on cases built from BFCL's single-turn data (see bfcl_peer.py).

Asserted: no disagreement outside the documented policy differences (bfcl_peer.POLICIES, docs/verifiers.md),
under `strings: exact` (the default) and `strings: bfcl`, both with the possible answers as `acceptable`; and
at least 99% agreement under `strings: bfcl` where both judge by the same rule (every case but a float written
for an integer parameter, which JSON Schema counts as an integer). The table by kind of change is in
bench/RESULTS_verifiers.md (bench/bench_verifiers.py --only bfcl).
"""

from __future__ import annotations

import pytest

from pivot_assets.verifiers.canonical import normalize_string

from . import bfcl_peer

pytest.importorskip("bfcl_eval")


@pytest.fixture(scope="module")
def cases():
    return bfcl_peer.make_cases(bfcl_peer.load_items())


@pytest.fixture(scope="module")
def comparisons(cases):
    return {strings: bfcl_peer.compare(cases, strings, {"name": "tool_call", "strings": strings})
            for strings in ("exact", "bfcl")}


def _unexplained(comparison) -> str:
    lines = [f"{len(comparison.false_accepts)} false accepts, {len(comparison.false_rejects)} false rejects:"]
    lines += [bfcl_peer.describe(c, s) for c, s in (comparison.false_accepts + comparison.false_rejects)[:10]]
    return "\n".join(lines)


def test_every_kind_of_change_is_generated(cases):
    kinds = {c.kind for c in cases}
    assert kinds == set(bfcl_peer.KINDS)
    assert len(cases) > 10_000
    assert {c.item.category for c in cases} == set(bfcl_peer.CATEGORIES)


@pytest.mark.scenario
@pytest.mark.parametrize("strings", ["exact", "bfcl"])
def test_no_disagreement_outside_the_documented_policies(comparisons, strings):
    comparison = comparisons[strings]
    assert not comparison.false_accepts and not comparison.false_rejects, _unexplained(comparison)
    assert set(comparison.explained) <= set(bfcl_peer.POLICIES)


@pytest.mark.scenario
def test_agreement_with_bfcl_strings_and_acceptable(cases, comparisons):
    comparison = comparisons["bfcl"]
    same_rule = [i for i, c in enumerate(cases) if c.kind != "float for int"]
    agree = sum((comparison.scores[i].reward == 1.0) == bool(cases[i].bfcl["valid"]) for i in same_rule)
    assert agree / len(same_rule) >= 0.99, (agree, len(same_rule), dict(comparison.explained))


def test_listed_values_need_acceptable(cases):
    """With one reference call, another listed value is a miss; with the possible answers, it is accepted."""
    listed = [c for c in cases if c.kind in ("another listed value", "omitted optional") and c.bfcl["valid"]]
    with_acceptable = bfcl_peer.score_cases(listed, {"name": "tool_call"})
    reference_only = bfcl_peer.score_cases(listed, {"name": "tool_call"}, use_acceptable=False)
    assert all(s.reward == 1.0 for s in with_acceptable)
    assert sum(s.reward == 1.0 for s in reference_only) < len(listed) / 2


@pytest.mark.scenario
def test_wrong_values_bfcl_rejects_are_never_paid(cases, comparisons):
    """The issue's false accepts (ids off by one, 1e-7 vs 2e-7, one word of a name) are gone."""
    for strings, comparison in comparisons.items():
        paid = [(c, s) for c, s in zip(cases, comparison.scores)
                if c.kind in ("wrong value", "wrong type") and not c.bfcl["valid"] and s.reward == 1.0]
        assert all(bfcl_peer.policy_of(c, True, strings) == "free text" for c, _ in paid), \
            [bfcl_peer.describe(c, s) for c, s in paid]


def test_strings_bfcl_is_bfcls_standardize_string():
    bfcl_peer.bfcl_checker()
    from bfcl_eval.eval_checker.ast_eval.ast_checker import standardize_string

    for text in ("New York, NY", "Dr. Jane O'Neil", "e-mail_address", "2**3 ^ 4 * 5", " A/B.C ", "tab\tand\nline",
                 "ÉCOLE", "it's", "x" * 3):
        assert normalize_string(text, "bfcl") == standardize_string(text), text
