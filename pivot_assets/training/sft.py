"""Same-data SFT (issue 7): the paper's baseline and the warm-up reference policy (Dagster-free).

Each canonical trajectory is rendered by policies.models.render_chat with the chat template `policy.chat_template`
resolves for the model (the same one profiling, GRPO and evaluation prompt with), and only assistant tokens carry loss: the assistant message body and its
`<|im_end|>`. The `<|im_start|>assistant\\n` header, including the newline after the role, belongs to
the prompt (it is what `add_generation_prompt=True` emits at sampling time), so it is masked.

The text is tokenized segment by segment (prompt, assistant, prompt, ...), never as one string: at
sampling time the model sees the prompt tokenized up to the header's newline and generates from
there, so a BPE merge across the header/body boundary would train on token sequences the policy
never produces. Segment boundaries also make the mask exact by construction.

Training is trl.SFTTrainer on a pre-tokenized dataset (input_ids + the assistant mask above), on `policy.device`:
AdamW with the `sft:` section's schedule, warm-up and gradient accumulation, gradient checkpointing by default,
fp32 master weights with bf16 autocast where the resolved precision says so (core/hardware.py), checkpoints a
rerun resumes from; the result is a normal Hugging Face model dir written atomically (tmp dir + rename).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from pivot_assets.core.hardware import Precision, configure_torch, sft_precision
from pivot_assets.core.identity import fingerprint
from pivot_assets.core.shapes import as_canonical_messages, as_list, to_template_messages
from pivot_assets.policies.models import PromptFormat, load_model, load_tokenizer, render_chat

from .launcher import barrier, gather_lists, is_main_process, world_size

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label value torch's cross-entropy skips

if TYPE_CHECKING:
    import torch

    from pivot_assets.core.config import PivotConfig, SFTSection
    from pivot_assets.core.warehouse import Warehouse


# -- rendering and the assistant-token mask --------------------------------------------------


def _render(tokenizer, template_messages: list[dict], tools: list | None, gen_prompt: bool) -> str:
    return render_chat(tokenizer, template_messages, tools, add_generation_prompt=gen_prompt)


def assistant_char_spans(tokenizer, messages: list[dict], tools: list | None) -> tuple[str, list[tuple[int, int]]]:
    """(full rendered text, [(start, end) char span of each assistant message's loss region]).

    A span starts right after the generation prompt (`<|im_start|>assistant\\n`) and ends after the
    message's closing end-of-turn token. Raises ValueError if the template is not prefix-preserving
    (then no span could be located reliably).
    """
    tmsgs = to_template_messages(messages)
    full = _render(tokenizer, tmsgs, tools, gen_prompt=False)
    end_tok = tokenizer.eos_token or "<|im_end|>"
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        prefix = _render(tokenizer, tmsgs[:i], tools, gen_prompt=True)
        upto = _render(tokenizer, tmsgs[: i + 1], tools, gen_prompt=False)
        if not (full.startswith(prefix) and full.startswith(upto) and upto.startswith(prefix)):
            raise ValueError(f"chat template is not prefix-preserving at message {i}; cannot mask assistant tokens")
        segment = upto[len(prefix):]
        cut = segment.rfind(end_tok)
        end = len(prefix) + (cut + len(end_tok) if cut >= 0 else len(segment))
        spans.append((len(prefix), end))
    return full, spans


def assistant_token_mask(tokenizer, messages: list[dict], tools: list | None = None) -> tuple[list[int], list[bool]]:
    """(input_ids, mask): mask[i] is True iff token i is an assistant token that carries loss."""
    full, spans = assistant_char_spans(tokenizer, messages, as_list(tools, "tools") or None)
    ids: list[int] = []
    mask: list[bool] = []
    cursor = 0
    for start, end in spans + [(len(full), len(full))]:
        for text, is_assistant in ((full[cursor:start], False), (full[start:end], True)):
            if text:
                piece = tokenizer(text, add_special_tokens=False)["input_ids"]
                ids.extend(piece)
                mask.extend([is_assistant] * len(piece))
        cursor = end
    return ids, mask


def _trajectory_key(traj: dict, index: int) -> str:
    return str(traj.get("trajectory_id") or f"#{index}")


def build_sft_examples(
    trajectories: Iterable[dict],
    tokenizer,
    max_length: int,
    rejections: list[tuple[str, str]] | None = None,
) -> list[dict]:
    """Tokenized SFT examples `{"input_ids", "labels", "trajectory_id"}`, truncated to max_length.

    Each trajectory is a dict with `messages` (canonical, or OpenAI-shaped tool calls; list or JSON
    text) and `tools` (list or JSON text). Truncation keeps the start (system prompt and tools).

    `labels` equals input_ids on assistant tokens and IGNORE_INDEX elsewhere. A trajectory with no
    assistant token left after truncation (or that cannot be rendered) is not trained on; it is
    appended to `rejections` as (trajectory_id, reason) and counted in a warning, never silently dropped.
    """
    examples = []
    rejected: list[tuple[str, str]] = []
    for index, traj in enumerate(trajectories):
        key = _trajectory_key(traj, index)
        try:
            messages = as_canonical_messages(traj.get("messages"))
            ids, mask = assistant_token_mask(tokenizer, messages, traj.get("tools"))
        except (ValueError, KeyError, TypeError) as err:
            rejected.append((key, f"render failed: {err}"))
            continue
        ids, mask = ids[:max_length], mask[:max_length]
        if not any(mask):
            rejected.append((key, f"no assistant token within max_length={max_length}"))
            continue
        labels = [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]
        examples.append({"input_ids": ids, "labels": labels, "trajectory_id": key})
    if rejected:
        log.warning("SFT: %d of %d trajectories not trained on (first: %s)", len(rejected),
                    len(rejected) + len(examples), rejected[0])
    if rejections is not None:
        rejections.extend(rejected)
    return examples


def _action_segment(tokenizer, tmsgs: list[dict], message_index: int, tools: list | None, prompt: str) -> str | None:
    """The text the model must produce after `prompt` (the turn's profiling prompt) to write message_index.

    Usually the rendered conversation continues the prompt. A template whose generation prompt adds what its
    history rendering lacks (the empty thought `enable_thinking=False` pre-fills) does not: the action is then
    what the history rendering puts after the part of the generation prompt it shares (the role header)."""
    upto = _render(tokenizer, tmsgs[: message_index + 1], tools, gen_prompt=False)
    if upto.startswith(prompt):
        return upto[len(prompt):]
    base = _render(tokenizer, tmsgs[:message_index], tools, gen_prompt=False)
    if not (prompt.startswith(base) and upto.startswith(base)):
        return None
    header, body = prompt[len(base):], upto[len(base):]
    shared = os.path.commonprefix([header, body])
    return body[len(shared):] if shared else None


def turn_example(tokenizer, messages: list[dict], message_index: int, tools: list | None,
                 max_length: int) -> tuple[dict | None, str | None]:
    """(example, None) or (None, reason): one turn as an SFT example, its state rendered exactly as profiling
    and GRPO prompt it (tools, generation prompt) and cut from the *left* to fit max_length, its expert action
    (the assistant body + end-of-turn token) kept whole and the only tokens with loss.

    The example carries `truncated`: how many state tokens were cut off its start.
    """
    tmsgs = to_template_messages(messages[: message_index + 1])
    if not 0 <= message_index < len(messages) or messages[message_index].get("role") != "assistant":
        return None, f"message {message_index} is not an assistant message"
    prefix = _render(tokenizer, tmsgs[:message_index], tools, gen_prompt=True)
    segment = _action_segment(tokenizer, tmsgs, message_index, tools, prefix)
    if segment is None:
        return None, f"chat template is not prefix-preserving at message {message_index}"
    end_tok = tokenizer.eos_token or "<|im_end|>"
    cut = segment.rfind(end_tok)
    target = segment[: cut + len(end_tok)] if cut >= 0 else segment
    prompt_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
    room = max_length - len(target_ids)
    if room < 1:
        return None, f"expert action of {len(target_ids)} tokens does not fit in max_length={max_length}"
    kept = prompt_ids[-room:]
    return {"input_ids": kept + target_ids, "labels": [IGNORE_INDEX] * len(kept) + target_ids,
            "truncated": len(prompt_ids) - len(kept)}, None


def build_turn_examples(turns: Iterable[dict], tokenizer, max_length: int,
                        rejections: list[tuple[str, str]] | None = None) -> list[dict]:
    """Per-turn SFT examples (see turn_example) for dicts {turn_id?, trajectory_id, messages (the trajectory's),
    message_index, tools}; a turn that cannot fit is appended to `rejections` as (turn_id, reason)."""
    examples, rejected = [], []
    for index, turn in enumerate(turns):
        key = str(turn.get("turn_id") or f"{_trajectory_key(turn, index)}@{turn['message_index']}")
        try:
            messages = as_canonical_messages(turn.get("messages"))
            example, why = turn_example(tokenizer, messages, int(turn["message_index"]),
                                        as_list(turn.get("tools"), "tools") or None, max_length)
        except (ValueError, KeyError, TypeError) as err:
            example, why = None, f"render failed: {err}"
        if example is None:
            rejected.append((key, why))
            continue
        examples.append({**example, "trajectory_id": _trajectory_key(turn, index), "turn_id": key})
    if rejected:
        log.warning("SFT: %d of %d turns not trained on (first: %s)", len(rejected), len(rejected) + len(examples),
                    rejected[0])
    if rejections is not None:
        rejections.extend(rejected)
    return examples


def build_examples(trajectories: Iterable[dict], tokenizer, max_length: int, mode: str = "trajectory",
                   rejections: list[tuple[str, str]] | None = None) -> list[dict]:
    """SFT examples by `sft.examples`: `trajectory` (build_sft_examples), `turn` (one example per assistant
    turn, build_turn_examples), or `auto` (the whole trajectory when all of it fits in max_length, else its turns)."""
    if mode == "trajectory":
        return build_sft_examples(trajectories, tokenizer, max_length, rejections)
    if mode not in ("turn", "auto"):
        raise ValueError(f"sft.examples: {mode!r}: expected auto, trajectory or turn")
    examples, per_turn = [], []
    for index, traj in enumerate(trajectories):
        if mode == "auto":
            whole = build_sft_examples([traj], tokenizer, 1 << 30, [])
            if whole and len(whole[0]["input_ids"]) <= max_length:
                examples.extend(whole)
                continue
        messages = as_canonical_messages(traj.get("messages"))
        per_turn.extend({"trajectory_id": _trajectory_key(traj, index), "messages": messages, "message_index": i,
                         "tools": traj.get("tools"), "turn_id": f"{_trajectory_key(traj, index)}@{i}"}
                        for i, m in enumerate(messages) if m.get("role") == "assistant")
    return examples + build_turn_examples(per_turn, tokenizer, max_length, rejections)


# -- training ---------------------------------------------------------------------------------


def _collate(batch: list[dict], pad_id: int, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    import torch

    width = max(len(e["input_ids"]) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for row, e in enumerate(batch):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        labels[row, :n] = torch.tensor(e["labels"])
        attn[row, :n] = 1
    return {"input_ids": ids.to(device), "labels": labels.to(device), "attention_mask": attn.to(device)}


def save_model_atomic(model, tokenizer, out_dir: str | os.PathLike) -> Path:
    """save_pretrained model + tokenizer (with the chat template it was trained with, so `policy.chat_template:
    auto` renders the saved model's prompts as it was trained) into out_dir via tmp dir + rename."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return _swap_in(tmp, out)


def _swap_in(tmp: Path, out: Path) -> Path:
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def save_trained(trainer, tokenizer, out_dir: str | os.PathLike) -> Path:
    """The trained model into out_dir, atomically. One process: save_model_atomic. Launched ranks: every rank calls
    trainer.save_model (it gathers ZeRO-3 / FSDP shards; the main rank writes), then the main rank swaps it in."""
    if world_size() == 1:
        return save_model_atomic(trainer.model, tokenizer, out_dir)
    out = Path(out_dir)
    tmp = out.parent / f".{out.name}.tmp-launched"
    if is_main_process():
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    trainer.save_model(str(tmp))
    if is_main_process():
        tokenizer.save_pretrained(tmp)
        _swap_in(tmp, out)
    barrier()
    return out


# SFTConfig keys the `sft:` section (or the run) sets: sft.trl may not set them to something else.
SECTION_KEYS = {"output_dir": "(the run's checkpoint dir)", "max_steps": "steps",
                "per_device_train_batch_size": "batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
                "learning_rate": "learning_rate", "lr_scheduler_type": "lr_scheduler", "warmup_steps": "warmup_ratio",
                "gradient_checkpointing": "gradient_checkpointing", "padding_free": "padding_free",
                "max_length": "max_length", "seed": "seed", "bf16": "dtype", "use_cpu": "(policy.device)",
                "save_steps": "save_steps"}


def sft_config_kwargs(options: "SFTSection", output_dir: str, precision: Precision, on_cpu: bool) -> dict:
    """trl.SFTConfig keyword arguments from the `sft:` section, the precision and the `sft.trl` passthrough."""

    from trl import SFTConfig

    kwargs = {
        "output_dir": output_dir,
        "max_steps": options.steps,
        "per_device_train_batch_size": options.batch_size,
        "gradient_accumulation_steps": options.gradient_accumulation_steps,
        "learning_rate": options.learning_rate,
        "lr_scheduler_type": options.lr_scheduler,
        "warmup_steps": options.warmup_ratio,  # a float below 1 is a share of the steps in transformers 5
        "gradient_checkpointing": options.gradient_checkpointing,
        "padding_free": options.padding_free,
        "max_length": options.max_length,
        "seed": options.seed,
        "data_seed": options.seed,
        "bf16": precision.bf16,  # autocast over the fp32 master weights; resolved, never assumed
        "use_cpu": on_cpu,
        # the plain loop SFT used to be: torch AdamW's weight decay, no gradient clipping (sft.trl may set both)
        "weight_decay": 0.01,
        "max_grad_norm": 0.0,
        "save_strategy": "steps",
        "save_steps": options.save_steps,
        "save_total_limit": 1,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "remove_unused_columns": False,  # keeps example_key for `seen`; the collator wrapper drops it
        "dataloader_num_workers": 0,
    }
    from .runs import apply_trl_options

    return apply_trl_options(kwargs, options.trl, SFTConfig, "sft.trl", SECTION_KEYS)


def trainer_device(device: str) -> bool:
    """True when training runs on the CPU. The Trainer places a single-process run on the current CUDA device
    (cuda:0 unless CUDA_VISIBLE_DEVICES says otherwise), so another index is refused instead of silently moved."""
    if device == "cpu":
        return True
    if device not in ("cuda", "cuda:0"):
        raise ValueError(f"sft: device {device!r}: SFT trains on the first visible GPU; set "
                         f"CUDA_VISIBLE_DEVICES={device.split(':')[-1]} and policy.device: cuda")
    return False


def _run_fingerprint(model: str, examples: list[dict], options: "SFTSection") -> str:
    """Names the checkpoint dir: a rerun of the same model, examples and options resumes, any other run does not."""
    import hashlib

    digest = hashlib.sha256()
    for e in examples:
        digest.update(repr((e["input_ids"], e["labels"])).encode())
    return fingerprint({"model": model, "options": options.model_dump(), "examples": digest.hexdigest()})


def last_complete_checkpoint(work_dir: Path) -> str | None:
    """The newest checkpoint-N dir with its trainer_state.json (the Trainer writes it after the weights and the
    optimizer state), or None: a checkpoint a kill interrupted is skipped."""
    done = [p for p in work_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()
            and (p / "trainer_state.json").exists()]
    return str(max(done, key=lambda p: int(p.name.split("-")[-1]))) if done else None


def _dataset(examples: list[dict]):
    """Pre-tokenized rows: input_ids and the assistant mask TRL builds its labels from (loss on assistant tokens)."""
    from datasets import Dataset

    return Dataset.from_dict({
        "input_ids": [e["input_ids"] for e in examples],
        "assistant_masks": [[int(t != IGNORE_INDEX) for t in e["labels"]] for e in examples],
        "example_key": [str(e.get("turn_id") or e.get("trajectory_id")) for e in examples]})


class _CountingCollator:
    """Wraps TRL's collator: drops example_key and queues each batch's (keys, tokens, loss tokens). The queue is
    drained per optimizer step (take_step): a launched run's data loader collates a batch ahead of the step that
    trains it, so counting at collate time would credit the next step's batch to this one."""

    def __init__(self, inner, seen: set[str] | None) -> None:
        self.inner, self.seen = inner, seen
        self.batches: deque[tuple[list[str], int, int]] = deque()

    def __call__(self, features: list[dict]) -> dict:
        keys = [k for k in (f.pop("example_key", None) for f in features) if k is not None]
        self.batches.append((keys, sum(len(f["input_ids"]) for f in features),
                             sum(sum(1 for t in f["labels"] if t != IGNORE_INDEX) for f in features)))
        return self.inner(features)

    def take_step(self, batches: int) -> tuple[int, int]:
        """(tokens, loss tokens) of the next optimizer step's `batches` micro-batches; their keys go to `seen`."""
        tokens = loss_tokens = 0
        for _ in range(min(batches, len(self.batches))):
            keys, n, n_loss = self.batches.popleft()
            tokens, loss_tokens = tokens + n, loss_tokens + n_loss
            if self.seen is not None:
                self.seen.update(keys)
        return tokens, loss_tokens


def _step_rows_callback(collator: _CountingCollator, on_step: Callable[[dict], None] | None, rows: list[dict]):
    from transformers import TrainerCallback

    class StepRows(TrainerCallback):
        """One row per optimizer step from the Trainer's logs (logging_steps=1) and the collator's counts."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs:
                return
            tokens, loss_tokens = collator.take_step(args.gradient_accumulation_steps)
            row = {"step": state.global_step, "loss": float(logs["loss"]), "lr": float(logs.get("learning_rate", 0.0)),
                   "tokens": tokens, "loss_tokens": loss_tokens,
                   "seconds": time.perf_counter() - getattr(self, "t0", time.perf_counter())}
            rows.append(row)
            if on_step is not None:
                on_step(row)

    return StepRows()


def train_sft(
    model_dir_or_name: str,
    examples: list[dict],
    options: "SFTSection",
    out_dir: str | os.PathLike,
    precision: Precision,
    on_step: Callable[[dict], None] | None = None,
    threads: int | str = "auto",
    device: str = "cpu",
    fmt: PromptFormat = PromptFormat(),
    seen: set[str] | None = None,
) -> list[dict]:
    """Fine-tune on `examples` with trl.SFTTrainer for options.steps optimizer steps; save an HF model dir to out_dir.

    `options` is the `sft:` config section; `precision` the resolved dtype: the weights AdamW updates are fp32
    (master weights) and bf16 runs as autocast over them when it says bfloat16, so an update at lr 1e-6 is kept,
    never rounded away in bf16 storage. Checkpoints go to a dir beside out_dir named by the run's fingerprint; a
    rerun of the same run resumes from the last complete one, and the dir is removed once the model is saved.
    Returns one row per step: {step, loss, lr, tokens (input tokens), loss_tokens, seconds}. `on_step(row)` is
    called after every step; `seen`, when given, receives the turn (or trajectory) id of every example trained on
    (from the resumed step on, after a resume).
    """
    import torch  # lazy: building the pipeline's definitions must not pay torch's import
    from trl import SFTConfig, SFTTrainer

    if not examples:
        raise ValueError("train_sft: no examples to train on")
    on_cpu = trainer_device(device)
    configure_torch(threads)
    torch.manual_seed(options.seed)
    model, tokenizer = load_model(model_dir_or_name, dtype="float32", device=device, fmt=fmt)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = Path(out_dir)
    work_dir = out.parent / f".{out.name}.trainer-{_run_fingerprint(model_dir_or_name, examples, options)}"
    args = SFTConfig(**sft_config_kwargs(options, str(work_dir), precision, on_cpu))
    trainer = SFTTrainer(model=model, args=args, train_dataset=_dataset(examples), processing_class=tokenizer)
    collator = _CountingCollator(trainer.data_collator, seen)
    trainer.data_collator = collator
    rows: list[dict] = []
    trainer.add_callback(_step_rows_callback(collator, on_step, rows))
    resume = last_complete_checkpoint(work_dir) if work_dir.exists() else None
    if resume:
        log.info("SFT: resuming from %s", resume)
    trainer.train(resume_from_checkpoint=resume)
    trainer.model.eval()
    save_trained(trainer, tokenizer, out)
    if seen is not None:  # each launched rank trains on its share of every batch
        seen.update(gather_lists(sorted(seen)))
    rows = _all_ranks_tokens(rows)
    if is_main_process():
        shutil.rmtree(work_dir, ignore_errors=True)
    return rows


def _all_ranks_tokens(rows: list[dict]) -> list[dict]:
    """Each step's token counts summed over the launched ranks (each collated its share of the batch)."""
    if world_size() == 1:
        return rows
    per_rank = gather_lists([[(r["tokens"], r["loss_tokens"]) for r in rows]])
    return [{**r, "tokens": sum(p[i][0] for p in per_rank), "loss_tokens": sum(p[i][1] for p in per_rank)}
            for i, r in enumerate(rows)]


# -- the sft_policy stage -------------------------------------------------------------------------


def no_examples_reason(rejections: list[tuple[str, str]], max_length: int) -> str:
    """One line a user can act on when nothing is left to train on."""
    n = len(rejections)
    too_long = sum(1 for _, why in rejections if why.startswith(("no assistant token", "expert action of")))
    if n and too_long == n:
        return (f"sft_policy: {too_long} of {n} trajectories/turns have no assistant token within sft.max_length="
                f"{max_length}; raise sft.max_length, set sft.examples: turn, or shorten the inputs' system prompts")
    if n:
        return f"sft_policy: none of {n} trajectories can be trained on (first: {rejections[0][0]}: {rejections[0][1]})"
    return ("sft_policy: no trajectories in the warm-up split (lower training.eval_fraction, raise "
            "training.warmup_fraction or add inputs)")


def sft_run_status(wh: "Warehouse", cfg: "PivotConfig") -> dict:
    """The sft_policy run: {key, model_dir, precision, skipped (a model with this key and its table are there)}."""
    from .runs import SFT_DIR, is_done, sft_key

    out, key = wh.model_dir(SFT_DIR), sft_key(wh, cfg)
    return {"key": key, "model_dir": str(out), "precision": sft_precision(cfg),
            "skipped": is_done(out, key) and wh.exists("sft_steps")}


def train_sft_policy(wh: "Warehouse", cfg: "PivotConfig", log: Callable[[str], None]) -> dict:
    """The sft_policy stage: train on the expert turns of the warm-up split's trajectories (every trajectory
    outside the held-out split when training.warmup_fraction is 0) and save an HF dir under the warehouse, unless a
    model with the same key is already there (then nothing runs).

    Returns {skipped, key, model_dir, precision, rows?, n_examples?, n_held_out?, not_trained_on?, train_s?}.
    """
    from pivot_assets.core.progress import Progress

    from .runs import base_model, write_marker
    from pivot_assets.core.split import HELD_OUT, POOL, WARMUP, ConversationSplit

    result = sft_run_status(wh, cfg)
    if result["skipped"]:
        log(f"sft_policy is up to date ({result['key']}): not retraining")
        return result
    out, key = Path(result["model_dir"]), result["key"]
    device, fmt, precision = cfg.policy.device, PromptFormat.from_policy(cfg.policy), result["precision"]
    split = ConversationSplit.from_config(cfg)
    held_out = split.trajectories(wh, HELD_OUT)
    warmup = split.trajectories(wh, WARMUP) if split.warmup_fraction else split.trajectories(wh, WARMUP, POOL)
    trajectories = [t for t in wh.read("trajectories").iter_rows(named=True) if t["trajectory_id"] in warmup]
    tokenizer = load_tokenizer(base_model(cfg), fmt)
    rejections: list = []
    examples = build_examples(trajectories, tokenizer, cfg.sft.max_length, cfg.sft.examples, rejections)
    if not examples:
        raise ValueError(no_examples_reason(rejections, cfg.sft.max_length))
    for example_id, why in rejections[:5]:  # not `key`: that name holds the model's key, written below
        log(f"sft_policy: not trained on {example_id}: {why}")
    n_turns = sum(1 for e in examples if "truncated" in e)
    log(f"sft_policy: {len(trajectories)} warm-up trajectories ({len(held_out)} held out"
        f"{'' if split.warmup_fraction else ', no separate warm-up split'}), "
        f"{len(examples)} examples ({len(examples) - n_turns} whole trajectories, {n_turns} turns), "
        f"{cfg.sft.steps} steps, {precision.dtype} ({precision.reason})")
    progress = Progress(total=cfg.sft.steps, unit="sft steps", log=log, every_s=0)
    t0 = time.perf_counter()
    rows = train_sft(base_model(cfg), examples, cfg.sft, out, precision, threads=cfg.runtime.threads,
                     device=device, fmt=fmt, on_step=lambda r: progress.reach(r["step"], f"loss {r['loss']:.4f}, {r['tokens'] / r['seconds']:.0f} tokens/s"))
    import pyarrow as pa

    if is_main_process():  # a launched run's other ranks trained beside it
        wh.write_table("sft_steps", pa.Table.from_pylist(rows))
        write_marker(out, key)
    return {**result, "n_examples": len(examples), "n_held_out": len(held_out),
            "n_warmup_trajectories": len(trajectories),
            "not_trained_on": len(rejections), "train_s": time.perf_counter() - t0}


def pivot_turns(wh: "Warehouse", pivots) -> list[dict]:
    """The turns of pivot rows (a polars frame of a pivot table), as build_turn_examples dicts (sorted by turn_id)."""
    import polars as pl

    wanted = pivots["trajectory_id"].unique().to_list()
    trajectories = {t["trajectory_id"]: t for t in wh.read("trajectories", ["trajectory_id", "messages", "tools"])
                    .filter(pl.col("trajectory_id").is_in(wanted)).iter_rows(named=True)}
    return [{"turn_id": p["turn_id"], "trajectory_id": p["trajectory_id"], "message_index": p["message_index"],
             "messages": trajectories[p["trajectory_id"]]["messages"], "tools": trajectories[p["trajectory_id"]]["tools"]}
            for p in pivots.sort("turn_id").iter_rows(named=True)]


def train_same_data_sft(model: str, turns: list[dict], options: "SFTSection", out_dir, precision: Precision,
                        log: Callable[[str], None], threads: int | str = "auto", device: str = "cpu",
                        fmt: PromptFormat = PromptFormat(), epochs: float | None = None) -> dict:
    """The ablation's same-data SFT arm: per-turn SFT (state cut from the left, expert action) on exactly the
    given pivot turns; with `epochs`, options.steps is replaced by that many passes over the examples.
    Returns {rows, n_examples, rejections, truncated, steps, turns_trained}; raises with the reasons when no turn
    fits."""
    from .runs import steps_for_pool

    from pivot_assets.core.progress import Progress

    tokenizer = load_tokenizer(model, fmt)
    rejections: list = []
    examples = build_turn_examples(turns, tokenizer, options.max_length, rejections)
    for example_id, why in rejections[:5]:
        log(f"same-data SFT: not trained on {example_id}: {why}")
    if not examples:
        raise ValueError(no_examples_reason(rejections, options.max_length))
    if epochs is not None:
        per_step = options.batch_size * options.gradient_accumulation_steps
        options = options.model_copy(update={"steps": steps_for_pool(len(examples), per_step, epochs)})
    progress = Progress(total=options.steps, unit="sft steps", log=log, every_s=0)
    seen: set[str] = set()
    rows = train_sft(model, examples, options, out_dir, precision, threads=threads, device=device, fmt=fmt,
                     on_step=lambda r: progress.reach(r["step"], f"loss {r['loss']:.4f}"), seen=seen)
    return {"rows": rows, "n_examples": len(examples), "rejections": rejections, "steps": options.steps,
            "truncated": sum(1 for e in examples if e["truncated"]), "turns_trained": seen}
