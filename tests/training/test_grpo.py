"""Local GRPO: the trajectory split, the verifier reward, GRPOConfig building, and a real 2-step TRL run."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from pivot_assets.training.grpo import (
    _grpo_config_kwargs,
    _text_prompt_dataset,
    as_canonical_messages,
    make_verifier_reward,
)
from pivot_assets.core.config import TrainingSection
from pivot_assets.core.hardware import Precision, resolve_dtype
from pivot_assets.verifiers import DomainVerifiers

FP32 = Precision("float32", "float32", "cpu", "explicit")

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order by id",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]
# chat turns get a graded string-similarity reward (partial credit: the 2-step run sees nonzero rewards)
VERIFIERS = {"default": {"name": "tool_call"},
             "domains": {"chat": {"name": "string_similarity", "graded": True}}}


def call_action(order_id: str) -> str:
    return json.dumps({"type": "function_call", "name": "get_order", "arguments": json.dumps({"order_id": order_id})})


def tiny_dataset():
    """Pivot-export-shaped rows: template-shaped prompt messages, tools and expert_action as JSON text."""
    from datasets import Dataset

    rows = defaultdict(list)
    examples = [
        ("chat", [{"role": "user", "content": "Hi there!"}], {"type": "message", "content": "Hello! How can I help you today?"}),
        ("chat", [{"role": "user", "content": "Good morning."}], {"type": "message", "content": "Good morning! How can I help you?"}),
        ("shop", [{"role": "system", "content": "You are a shop assistant."},
                  {"role": "user", "content": "Where is my order A1?"}], json.loads(call_action("A1"))),
    ]
    for i, (domain, prompt, action) in enumerate(examples):
        rows["prompt"].append([{"role": m["role"], "content": m["content"], "tool_calls": None, "tool_call_id": None}
                               for m in prompt])
        rows["tools"].append(json.dumps(TOOLS if domain == "shop" else []))
        rows["expert_action"].append(json.dumps(action))
        rows["turn_id"].append(f"turn-{i}")
        rows["trajectory_id"].append(f"traj-{i}")
        rows["domain"].append(domain)
    return Dataset.from_dict(dict(rows))


# -- split ----------------------------------------------------------------------------------------


# -- reward ---------------------------------------------------------------------------------------


def test_verifier_reward_scores_text_and_conversational_completions():
    reward = make_verifier_reward(DomainVerifiers(VERIFIERS))
    good = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "A1"}}\n</tool_call>'
    wrong = '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "B9"}}\n</tool_call>'
    completions = [good, [{"role": "assistant", "content": good}], wrong, "Your order is on its way."]
    values = reward(prompts=["p"] * 4, completions=completions, completion_ids=None,
                    expert_action=[call_action("A1")] * 4, tools=[json.dumps(TOOLS)] * 4,
                    domain=["shop"] * 4, turn_id=["t1"] * 4)
    assert values == [1.0, 1.0, 0.0, 0.0]
    log = reward.completions_log
    assert [r["reward"] for r in log] == values
    assert [r["reason"] for r in log][2:] == ["ARGUMENT_VALUE_DIFFERENT", "SPOKE_INSTEAD_OF_CALL"]
    assert log[1]["completion"] == good and log[0]["turn_id"] == "t1"


# -- GRPOConfig -----------------------------------------------------------------------------------


def test_grpo_config_passthrough_smoke_caps_and_errors():
    options = TrainingSection(steps=50, num_generations=8, max_completion_length=256, grpo={"beta": 0.04, "temperature": 0.9})
    kwargs = _grpo_config_kwargs(options, "/tmp/x", cpu_smoke=True, precision=FP32)
    assert (kwargs["max_steps"], kwargs["num_generations"], kwargs["max_completion_length"]) == (8, 4, 48)
    assert kwargs["per_device_train_batch_size"] % kwargs["num_generations"] == 0
    assert kwargs["beta"] == 0.04 and kwargs["temperature"] == 0.9 and kwargs["use_cpu"]
    assert kwargs["report_to"] == "none" and kwargs["logging_steps"] == 1
    with pytest.raises(ValueError, match="unknown trl.GRPOConfig key 'no_such_key'"):
        _grpo_config_kwargs(TrainingSection(grpo={"no_such_key": 1}), "/tmp/x", cpu_smoke=True, precision=FP32)
    with pytest.raises(ValueError, match="duplicates training.learning_rate"):
        _grpo_config_kwargs(TrainingSection(grpo={"learning_rate": 0.1}), "/tmp/x", cpu_smoke=False, precision=FP32)


def test_vllm_generation_is_refused_in_one_line_where_training_runs_on_the_cpu():
    vllm = TrainingSection(grpo={"use_vllm": True, "vllm_mode": "colocate"})
    with pytest.raises(ValueError, match="use_vllm needs a GPU.*weight_loader"):
        _grpo_config_kwargs(vllm, "/tmp/x", cpu_smoke=True, precision=FP32)  # cpu_smoke: no GPU in use


def test_a_keyed_run_checkpoints_every_save_steps_and_a_plain_one_never():
    options = TrainingSection(save_steps=3)
    keyed = _grpo_config_kwargs(options, "/tmp/x", cpu_smoke=True, precision=FP32, checkpoints=True)
    assert (keyed["save_strategy"], keyed["save_steps"], keyed["save_total_limit"]) == ("steps", 3, 1)
    assert _grpo_config_kwargs(options, "/tmp/x", cpu_smoke=True, precision=FP32)["save_strategy"] == "no"


def test_prompts_render_like_profiling_and_held_out_rows_are_removed(tiny_model_dir):
    from transformers import AutoTokenizer

    from pivot_assets.policies.models import TOOL_CHAT_TEMPLATE, render_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    source = tiny_dataset()
    ds = _text_prompt_dataset(source, tokenizer, held_out={"traj-1"})
    assert ds["turn_id"] == ["turn-0", "turn-2"]
    canonical = as_canonical_messages(source[2]["prompt"])
    assert ds["prompt"][1] == render_prompt(tokenizer, canonical, TOOLS)
    assert "<tools>" in ds["prompt"][1] and ds["prompt"][1].endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match=r"all 3 pivot\(s\) of the training set lie in held-out conversations"):
        _text_prompt_dataset(source, tokenizer, held_out={"traj-0", "traj-1", "traj-2"})


def test_template_and_canonical_tool_calls_normalize_alike():
    canonical = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "f", "arguments": '{"a":1}'}]}]
    template = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}], "tool_call_id": None}]
    a, b = as_canonical_messages(canonical)[0], as_canonical_messages(template)[0]
    assert a["tool_calls"][0]["name"] == b["tool_calls"][0]["name"] == "f"
    assert json.loads(a["tool_calls"][0]["arguments"]) == b["tool_calls"][0]["arguments"]


# -- a real run -----------------------------------------------------------------------------------


@pytest.mark.scenario
def test_two_step_grpo_run_rewards_come_from_the_verifier(tiny_model_dir, tmp_path):
    from pivot_assets.training.grpo import run_grpo
    from pivot_assets.policies.models import TOOL_CHAT_TEMPLATE, load_model

    verifiers = DomainVerifiers(VERIFIERS)
    options = TrainingSection(steps=2, num_generations=2, max_completion_length=16, eval_fraction=0.0)
    result = run_grpo(str(tiny_model_dir), tiny_dataset(), verifiers, options, tmp_path / "grpo", cpu_smoke=True,
                      precision=resolve_dtype("auto"))

    # checkpoint written: a normal HF dir with the tool template, loadable
    model, tokenizer = load_model(result.model_dir)
    assert tokenizer.chat_template == TOOL_CHAT_TEMPLATE
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # trainer work dir cleaned up

    # one metrics row per step
    assert [r["step"] for r in result.steps] == [1, 2]
    for row in result.steps:
        assert 0.0 <= row["reward_mean"] <= 1.0 and row["loss"] is not None and row["frac_reward_zero_std"] is not None

    # the rewards the trainer saw are the verifier's: re-score the logged completions, and the per-step
    # mean of the logged rewards is the trainer's reported reward mean
    log = result.completions_log
    assert len(log) == 2 * options.num_generations
    assert any(e["reward"] > 0 for e in log)  # seeded run: a chat turn is drawn, graded similarity pays > 0
    source = {r["turn_id"]: r for r in tiny_dataset()}
    for entry in log:
        row = source[entry["turn_id"]]
        again = verifiers.for_domain(row["domain"]).score(row["expert_action"], entry["completion"], tools=row["tools"])
        assert again.reward == entry["reward"] and again.reason == entry["reason"]
    for row in result.steps:
        logged = [e["reward"] for e in log if e["step"] == row["step"]]
        assert row["reward_mean"] == pytest.approx(sum(logged) / len(logged), abs=1e-6)
    assert result.verifier_fingerprints == {d: verifiers.for_domain(d).fingerprint for d in ("chat", "shop")}
