"""Same-data SFT: the assistant-token mask, a save/reload round trip, and a 2-step train that learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pivot_assets.policies.models import TOOL_CHAT_TEMPLATE, load_model, render_action
from pivot_assets.core.config import SFTSection
from pivot_assets.core.hardware import resolve_dtype
from pivot_assets.core.shapes import action_from_message
from pivot_assets.training.sft import (
    IGNORE_INDEX,
    assistant_token_mask,
    build_sft_examples,
    save_model_atomic,
    train_sft,
)

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order by id",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]


def shop_trajectory(order_id: str, status: str) -> dict:
    messages = [
        {"role": "system", "content": "You are a shop assistant."},
        {"role": "user", "content": f"Where is my order {order_id}?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "name": "get_order", "arguments": json.dumps({"order_id": order_id})}]},
        {"role": "tool", "content": json.dumps({"status": status}), "tool_call_id": "c1"},
        {"role": "assistant", "content": f"Order {order_id} is {status}."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ]
    return {"trajectory_id": f"t-{order_id}", "messages": messages, "tools": json.dumps(TOOLS)}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tok.chat_template = TOOL_CHAT_TEMPLATE
    return tok


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    """[start, end) index ranges of consecutive True values."""
    runs, start = [], None
    for i, m in enumerate(mask + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_mask_covers_exactly_the_assistant_bodies(tokenizer):
    traj = shop_trajectory("A17", "shipped")
    ids, mask = assistant_token_mask(tokenizer, traj["messages"], TOOLS)
    runs = _runs(mask)
    assistants = [m for m in traj["messages"] if m["role"] == "assistant"]
    assert len(runs) == len(assistants)
    for (start, end), message in zip(runs, assistants):
        # every assistant content token carries loss, and nothing else does: body + <|im_end|> exactly
        expected = render_action(action_from_message(message)[1]) + "<|im_end|>"
        assert tokenizer.decode(ids[start:end]) == expected
        # the role header, including its newline, is prompt: the token just before the run
        assert tokenizer.decode(ids[:start]).endswith("<|im_start|>assistant\n")
        assert tokenizer.decode(ids[start - 1:start]) == "\n"
    prompt_text = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    for message in traj["messages"]:
        if message["role"] in ("system", "user", "tool"):
            assert message["content"] in prompt_text
    assert prompt_text.count("<|im_start|>assistant\n") == len(assistants)


def test_no_prompt_token_carries_loss_in_examples(tokenizer):
    trajs = [shop_trajectory("B2", "lost"), shop_trajectory("C3", "delivered")]
    examples = build_sft_examples(trajs, tokenizer, max_length=1024)
    assert len(examples) == 2
    for traj, ex in zip(trajs, examples):
        ids, mask = assistant_token_mask(tokenizer, traj["messages"], traj["tools"])
        assert ex["input_ids"] == ids
        assert ex["labels"] == [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]
        labelled = tokenizer.decode([t for t in ex["labels"] if t != IGNORE_INDEX])
        for forbidden in ("<|im_start|>", "system", "Where is my order", "status"):
            assert forbidden not in labelled


def test_truncation_and_rejection(tokenizer):
    traj = shop_trajectory("D4", "shipped")
    ids, _ = assistant_token_mask(tokenizer, traj["messages"], traj["tools"])
    rejections: list = []
    # cut inside the system prompt: no assistant token left -> rejected with a reason, not dropped silently
    assert build_sft_examples([traj], tokenizer, max_length=20, rejections=rejections) == []
    assert rejections and rejections[0][0] == "t-D4" and "max_length" in rejections[0][1]
    short = build_sft_examples([traj], tokenizer, max_length=len(ids) - 5)[0]
    assert len(short["input_ids"]) == len(ids) - 5


def _mean_loss(model, examples) -> float:
    from pivot_assets.training.sft import _collate

    with torch.no_grad():
        return float(model(**_collate(examples, 0)).loss)


@pytest.mark.scenario
def test_two_steps_lower_loss_and_round_trip(tiny_model_dir, tokenizer, tmp_path):
    examples = build_sft_examples([shop_trajectory("E5", "shipped"), shop_trajectory("F6", "late")],
                                  tokenizer, max_length=512)
    base, _ = load_model(str(tiny_model_dir))
    before = _mean_loss(base, examples)
    seen = []
    rows = train_sft(str(tiny_model_dir), examples, SFTSection(steps=2, batch_size=2), tmp_path / "sft", resolve_dtype("auto"),
                     on_step=seen.append)
    assert [r["step"] for r in rows] == [1, 2] and seen == rows
    assert all(r["tokens"] > r["loss_tokens"] > 0 for r in rows)
    trained, trained_tok = load_model(str(tmp_path / "sft"))
    after = _mean_loss(trained, examples)
    assert after < before, (before, after)
    assert trained_tok.chat_template == TOOL_CHAT_TEMPLATE

    # save/reload round trip: identical logits
    save_model_atomic(trained, trained_tok, tmp_path / "copy")
    reloaded, _ = load_model(str(tmp_path / "copy"))
    x = torch.tensor([examples[0]["input_ids"][:64]])
    with torch.no_grad():
        assert torch.equal(trained(x).logits, reloaded(x).logits)
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no tmp dirs left behind


# -- per-turn examples (long real trajectories) ----------------------------------------------------


def long_system_trajectory(order_id: str) -> dict:
    """A trajectory whose system prompt alone is longer than the max_length used below (like airline's)."""
    traj = shop_trajectory(order_id, "shipped")
    traj["messages"][0]["content"] = "Policy: " + " ".join(f"rule {i} applies to every order." for i in range(200))
    return traj


def test_turn_examples_cut_the_state_from_the_left_and_train_only_the_action(tokenizer):
    from pivot_assets.policies.models import render_prompt
    from pivot_assets.training.sft import build_turn_examples

    traj = long_system_trajectory("G7")
    assert build_sft_examples([traj], tokenizer, max_length=256) == []  # whole-trajectory SFT: nothing to train
    turns = [{"turn_id": f"turn-{i}", "trajectory_id": traj["trajectory_id"], "messages": traj["messages"],
              "message_index": i, "tools": traj["tools"]} for i in (2, 4, 6)]
    examples = build_turn_examples(turns, tokenizer, max_length=256)
    assert [e["turn_id"] for e in examples] == ["turn-2", "turn-4", "turn-6"]
    for turn, ex in zip(turns, examples):
        assert len(ex["input_ids"]) == 256 and ex["truncated"] > 0
        action = traj["messages"][turn["message_index"]]
        labelled = tokenizer.decode([t for t in ex["labels"] if t != IGNORE_INDEX])
        assert labelled == render_action(action_from_message(action)[1]) + "<|im_end|>"
        # the kept state is the *end* of the profiling prompt: the latest messages and the generation prompt
        prompt = tokenizer(render_prompt(tokenizer, traj["messages"][: turn["message_index"]], TOOLS),
                           add_special_tokens=False)["input_ids"]
        n_state = sum(1 for t in ex["labels"] if t == IGNORE_INDEX)
        assert ex["input_ids"][:n_state] == prompt[-n_state:]


def test_a_turn_that_cannot_fit_is_reported_with_its_reason(tokenizer):
    from pivot_assets.training.sft import build_turn_examples, no_examples_reason

    traj = shop_trajectory("H8", "shipped")
    rejections: list = []
    turn = {"turn_id": "turn-x", "trajectory_id": "t-H8", "messages": traj["messages"], "message_index": 2,
            "tools": traj["tools"]}
    assert build_turn_examples([turn], tokenizer, max_length=16, rejections=rejections) == []
    assert rejections[0][0] == "turn-x" and "does not fit in max_length=16" in rejections[0][1]
    assert "sft.max_length=16" in no_examples_reason(rejections, 16)
    bad: list = []
    assert build_turn_examples([{**turn, "message_index": 1}], tokenizer, 256, bad) == []
    assert "not an assistant message" in bad[0][1]


def test_auto_examples_keep_short_trajectories_whole_and_split_long_ones(tokenizer):
    from pivot_assets.training.sft import build_examples

    short, long = shop_trajectory("J1", "late"), long_system_trajectory("K2")
    examples = build_examples([short, long], tokenizer, max_length=512, mode="auto")
    assert examples[0]["trajectory_id"] == "t-J1" and "truncated" not in examples[0]
    assert [e["turn_id"] for e in examples[1:]] == ["t-K2@2", "t-K2@4", "t-K2@6"]
    rejections: list = []  # whole-trajectory mode: the long one has no assistant token within max_length
    assert len(build_examples([short, long], tokenizer, 512, "trajectory", rejections)) == 1
    assert rejections == [("t-K2", "no assistant token within max_length=512")]


def test_a_warm_up_that_skips_an_example_is_up_to_date_on_the_next_run(tmp_path, tiny_model_dir):
    """The model's key is what the marker holds, also when some example did not fit (a loop over the skipped
    examples once overwrote it with the last example's id, so every run retrained)."""
    from pivot_assets.core.config import load_config
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.ingest.inputs import write_ingest
    from pivot_assets.training.runs import is_done
    from pivot_assets.training.sft import sft_run_status, train_sft_policy

    records = [{"messages": shop_trajectory(f"A{i}", "shipped")["messages"], "tools": TOOLS} for i in range(5)]
    records[0]["messages"][4]["content"] = "Order A0 " + "is very late " * 300  # longer than max_length: skipped
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "pivot.yaml").write_text(
        f"warehouse: ./wh\ninputs: [{{path: data.jsonl}}]\npolicy: {{model: sft, dtype: float32}}\n"
        f"sft: {{model: {tiny_model_dir}, steps: 1, batch_size: 1, max_length: 256, examples: turn, dtype: float32}}\n"
        "training: {eval_fraction: 0.2}\n")
    cfg = load_config(tmp_path / "pivot.yaml")
    wh = Warehouse(cfg.warehouse_dir)
    write_ingest(wh, [{"path": str(tmp_path / "data.jsonl")}])
    first = train_sft_policy(wh, cfg, lambda line: None)
    assert not first["skipped"] and first["not_trained_on"] >= 1
    assert is_done(Path(first["model_dir"]), first["key"])
    assert sft_run_status(wh, cfg)["skipped"]
    assert train_sft_policy(wh, cfg, lambda line: None)["skipped"]
