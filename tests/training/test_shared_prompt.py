"""The shared-prompt policy-gradient forward (training/shared_prompt.py) against TRL's own computation.

What is checked, on the tiny policy in fp32: for a group of completions of one prompt (right-padded, of different
lengths) the per-token log-probabilities, the entropies and the gradient of a loss built from them are TRL's
(`GRPOTrainer._get_per_token_logps_and_entropies`) to float precision; rows with different prompts, a chunked batch
and gradient checkpointing take TRL's path; a real GRPO run goes through the shared path and trains.
"""

from __future__ import annotations

import pytest
import torch

from pivot_assets.core.config import TrainingSection
from pivot_assets.core.hardware import Precision
from pivot_assets.training.shared_prompt import shared_prompt_length, shared_prompt_trainer
from pivot_assets.verifiers import DomainVerifiers

from .test_grpo import VERIFIERS, tiny_dataset

FP32 = Precision("float32", "float32", "cpu", "explicit")


def test_a_shared_prompt_is_the_same_ids_and_mask_in_every_row():
    ids = torch.tensor([[5, 6, 7, 1, 2], [5, 6, 7, 3, 0], [5, 6, 7, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert shared_prompt_length(ids, mask, logits_to_keep=2) == 3
    other = ids.clone()
    other[1, 0] = 9
    assert shared_prompt_length(other, mask, logits_to_keep=2) is None
    assert shared_prompt_length(ids[:1], mask[:1], logits_to_keep=2) is None  # one row: nothing to share


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    from trl import GRPOConfig, GRPOTrainer

    from pivot_assets.policies.models import PromptFormat, load_model
    from pivot_assets.training.grpo import _grpo_config_kwargs, _text_prompt_dataset, make_verifier_reward

    model, tokenizer = load_model(str(tiny_model_dir), dtype="float32", fmt=PromptFormat())
    options = TrainingSection(steps=2, num_generations=4, max_completion_length=12, eval_fraction=0.0,
                              learning_rate=1e-3, grpo={"temperature": 0.7})  # a temperature the head divides by
    kwargs = _grpo_config_kwargs(options, str(tmp_path_factory.mktemp("work")), cpu_smoke=True, precision=FP32)
    cls = shared_prompt_trainer(GRPOTrainer)
    return cls(model=model, reward_funcs=[make_verifier_reward(DomainVerifiers(VERIFIERS), tokenizer)],
               args=GRPOConfig(**kwargs), train_dataset=_text_prompt_dataset(tiny_dataset(), tokenizer, set()),
               processing_class=tokenizer)


def _group(rows: int = 4, prompt: int = 9, completion: int = 7):
    torch.manual_seed(0)
    ids = torch.cat([torch.randint(10, 1000, (1, prompt)).expand(rows, -1),
                     torch.randint(10, 1000, (rows, completion))], dim=1)
    mask = torch.ones_like(ids)
    for r in range(rows):  # right-padded completions of lengths 7, 6, 5, ...
        mask[r, prompt + completion - r:] = 0
    return ids, mask


def _logps_and_grad(trainer, ids, mask, keep, unshared: bool):
    model = trainer.model
    model.zero_grad()
    fn = super(type(trainer), trainer)._get_per_token_logps_and_entropies if unshared else \
        trainer._get_per_token_logps_and_entropies
    logps, entropy, _ = fn(model, ids, mask, keep, compute_entropy=True)
    completion_mask = mask[:, -keep:].float()
    ((logps * completion_mask).sum() + 0.1 * (entropy * completion_mask).sum()).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()
    return logps.detach() * completion_mask, entropy.detach() * completion_mask, grads


@pytest.mark.scenario
def test_the_shared_forward_gives_trls_log_probs_entropies_and_gradients(trainer):
    ids, mask = _group()
    before = dict(trainer.shared_prompt_counts)
    shared = _logps_and_grad(trainer, ids, mask, keep=7, unshared=False)
    assert trainer.shared_prompt_counts["shared"] == before["shared"] + 1
    plain = _logps_and_grad(trainer, ids, mask, keep=7, unshared=True)
    for mine, trls in zip(shared, plain):
        assert mine.shape == trls.shape
        torch.testing.assert_close(mine, trls, rtol=1e-4, atol=1e-5)
    assert shared[2].abs().sum() > 0  # the loss has a gradient to compare


def test_rows_of_different_prompts_take_trls_path(trainer):
    ids, mask = _group()
    ids[2, 0] += 1
    before = dict(trainer.shared_prompt_counts)
    trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 7)
    trainer._get_per_token_logps_and_entropies(trainer.model, *_group(), 7, batch_size=2)  # TRL's chunking kept
    assert trainer.shared_prompt_counts == {"shared": before["shared"], "unshared": before["unshared"] + 2}


@pytest.mark.scenario
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_grpo_run_scores_its_groups_with_the_prompt_once(checkpointing, tiny_model_dir, tmp_path):
    from pivot_assets.training.grpo import run_grpo

    options = TrainingSection(steps=2, num_generations=2, max_completion_length=12, eval_fraction=0.0,
                              grpo={"gradient_checkpointing": checkpointing})
    result = run_grpo(str(tiny_model_dir), tiny_dataset(), DomainVerifiers(VERIFIERS), options, tmp_path / "m",
                      cpu_smoke=True, precision=FP32)
    # one loss forward per step, each shared; gradient checkpointing drops the prompt's cache: TRL's path
    assert result.shared_prompt == ({"shared": 0, "unshared": 2} if checkpointing else {"shared": 2, "unshared": 0})
    assert [r["step"] for r in result.steps] == [1, 2] and all(r["loss"] is not None for r in result.steps)
