"""pivot_eval's measurements: the OOD probe set and scorer, local accuracy on held-out pivots."""

from __future__ import annotations

import json
import re

import pytest

from pivot_assets.evaluation.heldout import local_accuracy
from collections import Counter

from pivot_assets.evaluation.ood_probe import (
    CATEGORY_MATCH,
    FAMILY,
    is_correct,
    load_probe,
    ood_accuracy,
    ood_probe_items,
    probe_items,
)
from pivot_assets.verifiers import DomainVerifiers


def test_probe_set_is_fixed_and_well_formed():
    items = ood_probe_items()
    assert items == ood_probe_items()
    assert len(items) >= 400  # one item is < 0.25 points
    families = Counter(FAMILY[it["kind"]] for it in items)
    assert families["arithmetic"] >= 150 and families["words"] >= 150  # two generated kinds, each large
    assert len({it["prompt"] for it in items}) == len(items)
    assert {it["kind"] for it in items} <= set(CATEGORY_MATCH)
    for it in items:  # the scorer accepts the item's own answer: scoring is deterministic and well posed
        assert is_correct(it, it["answer"]), it
    for it in items:
        if CATEGORY_MATCH[it["kind"]] == "number":
            # the number rule skips numbers echoed from the prompt: an answer among them could never match
            assert it["answer"] not in re.findall(r"\d+", it["prompt"]), it


def _item(kind: str, answer: str, prompt: str = "Q?") -> dict:
    return {"prompt": prompt, "answer": answer, "kind": kind}


@pytest.mark.parametrize("item, completion, expected", [
    (_item("arithmetic", "15", "What is 7 plus 8?"), "7 + 8 = 15", True),
    (_item("arithmetic", "17", "What is 12 plus 5?"), "12 + 5 = 6.", False),
    (_item("arithmetic", "7", "What is 10 minus 3?"), "10 minus 3 is 2.", False),
    (_item("arithmetic", "30", "What is 5 times 6?"), "To solve this, we convert 5 times 6 to", False),
    (_item("fact_number", "4"), "A dog has four legs.", True),
    (_item("fact_number", "8"), "A spider has 8 legs, not 6.", True),
    (_item("fact_number", "149000"), "about 149,000 km", True),
    (_item("count", "3", "How many letters are in 'cat'?"), "The word 'cat' has 11 letters.", False),
    (_item("letter", "c"), "The first letter of the word 'cat' is 'C'.", True),
    (_item("letter", "g"), "The last letter of the word 'dog' is 'd'.", False),
    (_item("letter", "t"), "t", True),
    (_item("uppercase", "CAT"), 'The word in uppercase is "CAT".', True),
    (_item("uppercase", "CAT"), 'The uppercase version of "cat" is "Cat".', False),
    (_item("reverse", "tac"), "Reversed: Tac", True),
    (_item("reverse", "tac"), "The letters of 'cat' are 'cat'.", False),
    (_item("compose", "sunflower"), "Sunflower", True),
    (_item("fact", "Paris"), "The capital of France is Paris.", True),
    (_item("fact", "Paris"), "Parisian cafes are nice.", False),
    (_item("fact", "carbon dioxide"), "Plants absorb Carbon Dioxide.", True),
])
def test_lenient_matching_on_handmade_answers(item, completion, expected):
    assert is_correct(item, completion) is expected


def test_unknown_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="kind 'poetry'"):
        is_correct(_item("poetry", "x"), "x")


@pytest.mark.scenario
def test_ood_accuracy_runs_greedy_and_reports_details(tiny_model_dir):
    items = [it for it in ood_probe_items() if it["kind"] == "fact"][:3]
    details: list = []
    acc = ood_accuracy(str(tiny_model_dir), items, max_new_tokens=12, details=details)
    assert 0.0 <= acc <= 1.0 and len(details) == 3
    assert acc == sum(d["correct"] for d in details) / 3
    assert all(d["correct"] == is_correct(d, d["completion"]) for d in details)


TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order by id",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]


def _pivot(i: int, order_id: str) -> dict:
    action = {"type": "function_call", "name": "get_order", "arguments": json.dumps({"order_id": order_id})}
    return {"turn_id": f"turn-{i}", "trajectory_id": f"traj-{i}", "domain": "shop", "expert_action": json.dumps(action),
            "tools": TOOLS, "messages": [{"role": "system", "content": "You are a shop assistant."},
                                         {"role": "user", "content": f"Where is my order {order_id}?"}]}


@pytest.mark.scenario
def test_local_accuracy_on_two_pivots(tiny_model_dir):
    pivots = [_pivot(0, "A1"), _pivot(1, "B2")]
    out = local_accuracy(str(tiny_model_dir), pivots, DomainVerifiers(None), k=2, max_new_tokens=24, seed=0)
    assert out["n_pivots"] == 2 and out["k"] == 2
    assert 0.0 <= out["local_accuracy"] <= 1.0
    assert [t["turn_id"] for t in out["per_turn"]] == ["turn-0", "turn-1"]
    for t in out["per_turn"]:
        assert len(t["rewards"]) == 2 and all(0.0 <= r <= 1.0 for r in t["rewards"])
        assert t["reward_mean"] == sum(t["rewards"]) / 2
    assert out["local_accuracy"] == sum(t["reward_mean"] for t in out["per_turn"]) / 2
    # the same draw through an engine the caller keeps across models (evaluation's EngineSlot): left open for the next
    from pivot_assets.core.config import PolicySection
    from pivot_assets.policies.factory import EngineSlot

    with EngineSlot(PolicySection()) as slot:
        kept = local_accuracy(str(tiny_model_dir), pivots, DomainVerifiers(None), k=2, max_new_tokens=24, seed=0,
                              engines=slot)
        assert slot.engine is not None and slot.starts == 1
    assert [t["rewards"] for t in kept["per_turn"]] == [t["rewards"] for t in out["per_turn"]]
    assert [t["reasons"] for t in kept["per_turn"]] == [t["reasons"] for t in out["per_turn"]]


def test_local_accuracy_without_pivots_is_none():
    out = local_accuracy("embedded", [], DomainVerifiers(None), k=4)
    assert out == {"n_pivots": 0, "k": 4, "local_accuracy": None, "per_turn": []}


def test_user_probe_from_jsonl_and_hf_dir_and_a_seeded_cap(tmp_path):
    rows = [{"prompt": "Capital of Peru?", "answer": "Lima", "kind": "contains"},
            {"prompt": "Say yes.", "answer": "yes"}]
    path = tmp_path / "probe.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    items = load_probe(str(path))
    assert [it["kind"] for it in items] == ["contains", "exact"]
    assert is_correct(items[0], "It is lima.") and is_correct(items[1], "Yes.") and not is_correct(items[1], "yes sir")
    from datasets import Dataset

    Dataset.from_list([{**r, "kind": r.get("kind", "exact")} for r in rows]).save_to_disk(str(tmp_path / "hf"))
    assert load_probe(str(tmp_path / "hf")) == items
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "x", "answer": "y", "kind": "poetry"}) + "\n")
    with pytest.raises(ValueError, match="row 1: kind 'poetry'"):
        load_probe(str(tmp_path / "bad.jsonl"))
    capped = probe_items(None, 50)
    assert len(capped) == 50 and capped == probe_items(None, 50)
    assert {FAMILY[it["kind"]] for it in capped} >= {"arithmetic", "words"}


def test_an_engine_in_its_own_processes_scores_one_model_at_a_time(tmp_path):
    """runtime.workers scores several models at once with in-process engines; a vLLM engine is one per model."""
    from pivot_assets.core.config import load_config
    from pivot_assets.core.parallel import EVAL_MEMORY_GIB, resolve_workers
    from pivot_assets.evaluation.heldout import evaluation_workers

    (tmp_path / "pivot.yaml").write_text("policy: {backend: transformers}\nruntime: {workers: 2, threads: 1}\n")
    assert evaluation_workers(load_config(tmp_path / "pivot.yaml"), 3) == resolve_workers(2, 1, 3, EVAL_MEMORY_GIB)
    (tmp_path / "pivot.yaml").write_text("policy: {backend: vllm}\nruntime: {workers: 2, threads: 1}\n")
    assert evaluation_workers(load_config(tmp_path / "pivot.yaml"), 3) == 1
