"""Same-data SFT: the assistant-token mask, a save/reload round trip, and a 2-step train that learns."""

from __future__ import annotations

import json

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
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_model_dir))
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


@pytest.mark.slow
def test_two_steps_lower_loss_and_round_trip(embedded_model_dir, tokenizer, tmp_path):
    examples = build_sft_examples([shop_trajectory("E5", "shipped"), shop_trajectory("F6", "late")],
                                  tokenizer, max_length=512)
    base, _ = load_model(str(embedded_model_dir))
    before = _mean_loss(base, examples)
    seen = []
    rows = train_sft(str(embedded_model_dir), examples, SFTSection(steps=2, batch_size=2), tmp_path / "sft", resolve_dtype("auto"),
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
