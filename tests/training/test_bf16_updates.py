"""bf16 training keeps its updates: AdamW updates fp32 master weights and bf16 only runs the forward/backward
(autocast), for GRPO and SFT alike. A few steps at lr 1e-6 in bf16 move the parameters as fp32 steps do; bf16
*storage* of the weights (the control) rounds almost every such update away."""

from __future__ import annotations

import pytest

from pivot_assets.core.config import SFTSection, TrainingSection
from pivot_assets.core.hardware import Precision
from pivot_assets.verifiers import DomainVerifiers

LR = 1e-6
FP32 = Precision("float32", "float32", "cpu", "explicit")
BF16 = Precision("bfloat16", "bfloat16", "cpu", "explicit")  # this CPU's native bf16 where it has one
NORM_FACTOR = 2.0  # bf16-autocast update norms lie within this factor of fp32's (both ~ lr x sqrt(#params))


def _movement(before: dict, model_dir) -> tuple[float, float]:
    """(share of parameter entries that changed, L2 norm of the update) of a saved model against `before`."""
    from pivot_assets.policies.models import load_model

    after, _ = load_model(str(model_dir), dtype="float32")
    changed = total = 0
    square = 0.0
    for name, p in after.state_dict().items():
        d = p.float() - before[name]
        changed += int((d != 0).sum())
        total += d.numel()
        square += float((d.double() ** 2).sum())
    return changed / total, square ** 0.5


@pytest.fixture(scope="module")
def initial(tiny_model_dir):
    from pivot_assets.policies.models import load_model

    model, _ = load_model(str(tiny_model_dir), dtype="float32")
    return {k: v.detach().clone().float() for k, v in model.state_dict().items()}


def _assert_same_movement(fp32: tuple[float, float], bf16: tuple[float, float]) -> None:
    print(f"changed / update norm: fp32 {fp32[0]:.4%} / {fp32[1]:.3e}, bf16 autocast {bf16[0]:.4%} / {bf16[1]:.3e}")
    assert fp32[0] > 0.5, f"fp32 moved only {fp32[0]:.2%} of the parameters: no gradient reached them"
    assert abs(bf16[0] - fp32[0]) < 0.02, (fp32, bf16)
    assert 1 / NORM_FACTOR < bf16[1] / fp32[1] < NORM_FACTOR, (fp32, bf16)


@pytest.mark.scenario
def test_grpo_in_bf16_moves_the_parameters_as_fp32_does(tiny_model_dir, initial, tmp_path):
    from datasets import Dataset

    from pivot_assets.training.grpo import run_grpo

    prompts = ["Hi there!", "Good morning.", "Thanks a lot!"]
    data = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": p, "tool_calls": None, "tool_call_id": None}] for p in prompts],
        "tools": ["[]"] * 3, "expert_action": ['{"type": "message", "content": "Hello! How can I help you?"}'] * 3,
        "turn_id": [f"t{i}" for i in range(3)], "trajectory_id": [f"j{i}" for i in range(3)], "domain": ["chat"] * 3})
    verifiers = DomainVerifiers({"default": {"name": "string_similarity", "graded": True}})  # rewards with variance
    options = TrainingSection(steps=2, num_generations=4, max_completion_length=8, learning_rate=LR, eval_fraction=0.0)
    moved = {}
    for precision in (FP32, BF16):
        run = run_grpo(str(tiny_model_dir), data, verifiers, options, tmp_path / precision.dtype, cpu_smoke=True,
                       precision=precision, held_out=set())
        assert run.grpo_config["bf16"] is precision.bf16
        assert all(r["frac_reward_zero_std"] < 1 for r in run.steps)  # every step had a gradient
        moved[precision.dtype] = _movement(initial, tmp_path / precision.dtype)
    _assert_same_movement(moved["float32"], moved["bfloat16"])


@pytest.mark.scenario
def test_sft_in_bf16_moves_the_parameters_as_fp32_does_and_bf16_storage_would_not(tiny_model_dir, initial,
                                                                                  tmp_path):
    import torch

    from pivot_assets.policies.models import load_model, load_tokenizer
    from pivot_assets.training.sft import _collate, build_sft_examples, train_sft

    tokenizer = load_tokenizer(str(tiny_model_dir))
    trajectories = [{"trajectory_id": f"j{i}", "tools": [], "messages": [
        {"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"It is {2 * i}."}]}
        for i in range(4)]
    examples = build_sft_examples(trajectories, tokenizer, 128)
    options = SFTSection(steps=2, learning_rate=LR, batch_size=2)
    moved = {}
    for precision in (FP32, BF16):
        train_sft(str(tiny_model_dir), examples, options, tmp_path / precision.dtype, precision)
        moved[precision.dtype] = _movement(initial, tmp_path / precision.dtype)
    _assert_same_movement(moved["float32"], moved["bfloat16"])

    # the control: the same AdamW step on weights *stored* in bf16 loses nearly every update at this rate
    model, _ = load_model(str(tiny_model_dir), dtype="bfloat16")
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    batch = _collate(examples[:2], tokenizer.eos_token_id)
    model(**batch).loss.backward()
    optimizer.step()
    kept = sum(int((p != before[k]).sum()) for k, p in model.state_dict().items())
    share = kept / sum(p.numel() for p in before.values())
    assert share < 0.1 < moved["bfloat16"][0], share
