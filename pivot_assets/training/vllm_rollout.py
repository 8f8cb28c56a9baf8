"""GRPO's completions from the project's vLLM engine: TRL's `rollout_func` (Dagster-free).

TRL 1.16's GRPOTrainer samples with `model.generate` unless it is given a `rollout_func`; its own vLLM modes need a
GPU (grpo.VLLM_ON_CPU). `VLLMRollout` is such a function over policies.vllm_backend.VLLMBackend, on a CPU or a GPU:

- the same sampling as TRL's transformers path: temperature, top_p, top_k, min_p, repetition_penalty and
  max_completion_length read from the trainer's GRPOConfig (one source), TRL's EOS ids as the stops, the stop token
  kept at the end of its completion (TRL keeps the EOS it generated: the policy learns to end its turn);
- the same prompt ids: the text prompt tokenized as TRL tokenizes it (add_special_tokens=True; grpo._for_trl made
  that profiling's ids);
- the current weights: before each generation, when the trainer's optimizer step moved since the engine was last
  loaded, the trainer's weights are written as a checkpoint in `sync_dir` (safetensors in the engine's dtype,
  /dev/shm where there is one) and loaded into the running engine in place (VLLMBackend.reload_weights, the prefix
  cache emptied). `synced_steps` records the step each generation sampled under;
- seeds: one engine request per run of identical prompts (TRL's RepeatSampler puts a prompt's num_generations
  copies together), n = the run's length, seeded by (GRPOConfig.seed, step, the run's position): a rerun draws the
  same completions;
- logprobs: the engine's per-token logprobs of the sampled tokens (TRL takes them; it uses them only for its vLLM
  importance-sampling correction, which is off here: generation and the optimizer step alternate, so the completions
  are on-policy up to the engine's numerics).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pivot_assets.core.ids import seeded_int

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class RolloutEngine:
    """Where GRPO's completions come from, resolved once from the config (training.rollout_engine + policy)."""

    name: Literal["transformers", "vllm"] = "transformers"
    device: str = "cpu"
    dtype: str = "bfloat16"  # the engine's compute dtype (vLLM); the trainer keeps fp32 master weights
    threads: int = 1
    engine_args: dict = field(default_factory=dict)  # vllm.LLM arguments (policy.engine_args)

    @property
    def identity(self) -> dict:
        """What the GRPO identity records: nothing for the trainer's own generation (keys made before this existed
        stay valid), the engine and its dtype for vLLM (its numerics differ from the trainer's)."""
        return {} if self.name == "transformers" else {"rollout_engine": self.name, "rollout_dtype": self.dtype}


def resolve_rollout_engine(cfg) -> RolloutEngine:
    """training.rollout_engine: `auto` = the policy's engine when it samples GRPO's rollouts (its grpo_rollouts
    capability: vLLM), else the trainer's own generation; `vllm` asks for it (one line where it is not installed)."""
    from pivot_assets.core.engines import capabilities, missing
    from pivot_assets.core.hardware import policy_precision, resolve_threads

    wanted = cfg.training.rollout_engine
    if wanted == "auto":  # the policy's engine where it can, and is installed (else preflight names the backend)
        backend = cfg.policy.backend
        able = capabilities(backend).grpo_rollouts and not missing(backend)
        wanted = backend if able else "transformers"
    if wanted == "transformers":
        return RolloutEngine()
    why = missing(wanted)
    if why:
        raise ValueError(f"training.rollout_engine {wanted}: {why}")
    device = cfg.policy.device if str(cfg.policy.device).startswith("cuda") else "cpu"
    return RolloutEngine("vllm", device, policy_precision(cfg.policy, device).dtype,
                         resolve_threads(cfg.runtime.threads), dict(cfg.policy.engine_args))


def sync_root() -> Path:
    """Where weight checkpoints for the engine go: memory-backed /dev/shm where there is one."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class VLLMRollout:
    """A TRL rollout_func: `rollout(prompts, trainer) -> {prompt_ids, completion_ids, logprobs}` (module docstring)."""

    def __init__(self, model_dir: str, engine: RolloutEngine, fmt=None):
        from pivot_assets.policies.models import PromptFormat
        from pivot_assets.policies.vllm_backend import VLLMBackend

        self.backend = VLLMBackend(model=model_dir, dtype=engine.dtype, device=engine.device, threads=engine.threads,
                                   fmt=fmt or PromptFormat(), engine_args=engine.engine_args,
                                   in_process=False)  # beside the trainer: its own processes
        self.engine = engine
        self.sync_dir = Path(tempfile.mkdtemp(prefix="pivot-grpo-weights-", dir=sync_root()))
        self.loaded_step = 0  # the engine holds model_dir's weights: the trainer's at step 0
        self.synced_steps: list[int] = []  # per generation: the optimizer step whose weights sampled it
        self.seconds = {"generate": 0.0, "sync": 0.0}

    def close(self) -> None:
        self.backend.close()
        shutil.rmtree(self.sync_dir, ignore_errors=True)

    def __call__(self, prompts: list, trainer) -> dict:
        step = int(trainer.state.global_step)
        if step != self.loaded_step:
            self.sync(trainer, step)
        tokenizer = trainer.processing_class
        t0 = time.perf_counter()
        runs = _runs_of_identical(prompts)
        params = [self._sampling_params(trainer, n, seeded_int(trainer.args.seed, f"{step}:{i}", bits=31))
                  for i, (_, n) in enumerate(runs)]
        ids = [_prompt_ids(tokenizer, prompt) for prompt, _ in runs]
        outputs = self.backend.llm.generate([{"prompt_token_ids": p} for p in ids], sampling_params=params,
                                            use_tqdm=False)
        result = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for prompt_ids, out in zip(ids, outputs):
            for choice in out.outputs:
                completion, logprobs = _with_stop_token(choice)
                result["prompt_ids"].append(list(prompt_ids))
                result["completion_ids"].append(completion)
                result["logprobs"].append(logprobs)
        self.seconds["generate"] += time.perf_counter() - t0
        self.synced_steps.append(step)
        return result

    def sync(self, trainer, step: int) -> None:
        """The trainer's current weights into the engine (module docstring)."""
        import torch

        t0 = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        dtype = getattr(torch, self.engine.dtype)
        state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
        model.save_pretrained(self.sync_dir, state_dict=state, safe_serialization=True)
        self.backend.reload_weights(self.sync_dir)
        self.loaded_step = step
        self.seconds["sync"] += time.perf_counter() - t0

    def _sampling_params(self, trainer, n: int, seed: int):
        from vllm import SamplingParams

        args = trainer.args
        if args.generation_kwargs:  # transformers' generate keywords: no vLLM meaning to give them
            raise ValueError("training.grpo.generation_kwargs applies to the trainer's own generate: with "
                             "training.rollout_engine vllm set the sampling through GRPOConfig's own keys "
                             "(temperature, top_p, top_k, min_p, repetition_penalty)")
        return SamplingParams(n=n, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k if args.top_k else -1, min_p=args.min_p or 0.0,
                              repetition_penalty=args.repetition_penalty, max_tokens=args.max_completion_length,
                              seed=seed, stop_token_ids=list(trainer.eos_token_ids), logprobs=0, detokenize=False)


def _runs_of_identical(prompts: list) -> list[tuple[object, int]]:
    """Consecutive identical prompts as (prompt, count): a GRPO batch holds each prompt's group together."""
    runs: list[list] = []
    for prompt in prompts:
        if runs and runs[-1][0] == prompt:
            runs[-1][1] += 1
        else:
            runs.append([prompt, 1])
    return [(p, n) for p, n in runs]


def _prompt_ids(tokenizer, prompt) -> list[int]:
    if not isinstance(prompt, str):
        raise ValueError("the vLLM rollout takes text prompts (grpo renders them); got a conversational prompt")
    return tokenizer(prompt)["input_ids"]  # as TRL tokenizes a text prompt: add_special_tokens=True


def _with_stop_token(choice) -> tuple[list[int], list[float]]:
    """A choice's token ids and their logprobs, with the stop token at the end when vLLM stopped on one it did not
    return (a stop_token_ids stop): TRL's own generation keeps the EOS it sampled."""
    ids = list(choice.token_ids)
    steps = list(choice.logprobs or [])
    logprobs = [steps[i][token].logprob if i < len(steps) and token in steps[i] else None
                for i, token in enumerate(ids)]
    stop = choice.stop_reason
    if choice.finish_reason == "stop" and isinstance(stop, int) and (not ids or ids[-1] != stop):
        ids.append(stop)
        logprobs.append(None)  # not returned by the engine; TRL maps None to NaN and corrects nothing with it
    return ids, logprobs
