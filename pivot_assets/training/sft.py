"""Same-data SFT (issue 7): the paper's baseline and the warm-up reference policy (Dagster-free).

Each canonical trajectory is rendered with the project's tool chat template (the same one profiling
and GRPO prompt with), and only assistant tokens carry loss: the assistant message body and its
`<|im_end|>`. The `<|im_start|>assistant\\n` header, including the newline after the role, belongs to
the prompt (it is what `add_generation_prompt=True` emits at sampling time), so it is masked.

The text is tokenized segment by segment (prompt, assistant, prompt, ...), never as one string: at
sampling time the model sees the prompt tokenized up to the header's newline and generates from
there, so a BPE merge across the header/body boundary would train on token sequences the policy
never produces. Segment boundaries also make the mask exact by construction.

Training is a plain torch loop (AdamW, constant learning rate; bf16 autocast only where the resolved
precision says so, see core/hardware.py); the result is a normal Hugging Face model dir written atomically (tmp dir + rename).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from pivot_assets.core.hardware import Precision, configure_torch, resolve_dtype
from pivot_assets.core.shapes import as_canonical_messages, as_list, to_template_messages
from pivot_assets.policies.models import TOOL_CHAT_TEMPLATE, load_model

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label value torch's cross-entropy skips

if TYPE_CHECKING:
    from pivot_assets.core.config import SFTSection


# -- rendering and the assistant-token mask --------------------------------------------------


def _render(tokenizer, template_messages: list[dict], tools: list | None, gen_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        template_messages, tools=tools or None, tokenize=False, add_generation_prompt=gen_prompt
    )


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


# -- training ---------------------------------------------------------------------------------


def _collate(batch: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(e["input_ids"]) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for row, e in enumerate(batch):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        labels[row, :n] = torch.tensor(e["labels"])
        attn[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": attn}


def _batches(examples: list[dict], batch_size: int, seed: int):
    """Endless shuffled batches: a fresh deterministic permutation per epoch."""
    rng = random.Random(seed)
    epoch = 0
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            yield [examples[j] for j in order[i : i + batch_size]]
        epoch += 1


def save_model_atomic(model, tokenizer, out_dir: str | os.PathLike) -> Path:
    """save_pretrained model + tokenizer (with the tool chat template) into out_dir via tmp dir + rename."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def train_sft(
    model_dir_or_name: str,
    examples: list[dict],
    options: "SFTSection",
    out_dir: str | os.PathLike,
    precision: Precision,
    on_step: Callable[[dict], None] | None = None,
    threads: int | str = "auto",
) -> list[dict]:
    """Fine-tune on `examples` for options.steps AdamW steps; save an HF model dir to out_dir.

    `options` is the `sft:` config section (steps, learning_rate, batch_size, seed); `precision` the
    resolved dtype (bf16 autocast only when it says bfloat16). Returns one row per step: {step, loss,
    lr, tokens (non-pad input tokens), loss_tokens, seconds}. `on_step(row)` is called after every step.
    """
    if not examples:
        raise ValueError("train_sft: no examples to train on")
    configure_torch(threads)
    torch.manual_seed(options.seed)
    model, tokenizer = load_model(model_dir_or_name, dtype="float32", device="cpu")
    model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.learning_rate)
    batches = _batches(examples, options.batch_size, options.seed)
    rows = []
    for step in range(1, options.steps + 1):
        t0 = time.perf_counter()
        batch = _collate(next(batches), pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.bf16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        row = {
            "step": step,
            "loss": float(loss.detach()),
            "lr": options.learning_rate,
            "tokens": int(batch["attention_mask"].sum()),
            "loss_tokens": int((batch["labels"] != IGNORE_INDEX).sum()),
            "seconds": time.perf_counter() - t0,
        }
        rows.append(row)
        if on_step is not None:
            on_step(row)
    model.eval()
    save_model_atomic(model, tokenizer, out_dir)
    return rows


# -- the sft_policy stage -------------------------------------------------------------------------


def no_examples_reason(rejections: list[tuple[str, str]], max_length: int) -> str:
    """One line a user can act on when nothing is left to train on."""
    n = len(rejections)
    too_long = sum(1 for _, why in rejections if why.startswith("no assistant token"))
    if n and too_long == n:
        return (f"sft_policy: {too_long} of {n} trajectories have no assistant token within sft.max_length="
                f"{max_length}; raise sft.max_length or shorten the inputs' system prompts")
    if n:
        return f"sft_policy: none of {n} trajectories can be trained on (first: {rejections[0][0]}: {rejections[0][1]})"
    return "sft_policy: no trajectories outside the held-out split (lower training.eval_fraction or add inputs)"


def train_sft_policy(wh: "Warehouse", cfg: "PivotConfig", log: Callable[[str], None]) -> dict:
    """The sft_policy stage: train on the expert turns of every trajectory outside the held-out split and save
    an HF dir under the warehouse, unless a model with the same key is already there (then nothing runs).

    Returns {skipped, key, model_dir, precision, rows?, n_examples?, n_held_out?, not_trained_on?, train_s?}.
    """
    from pivot_assets.core.progress import Progress

    from .runs import SFT_DIR, base_model, is_done, sft_key, write_marker
    from .split import held_out_trajectories

    out, key = wh.model_dir(SFT_DIR), sft_key(wh, cfg)
    precision = resolve_dtype(cfg.sft.dtype)
    result = {"key": key, "model_dir": str(out), "precision": precision}
    if is_done(out, key) and wh.exists("sft_steps"):
        log(f"sft_policy is up to date ({key}): not retraining")
        return {**result, "skipped": True}
    held_out = held_out_trajectories(wh, cfg.training.eval_fraction, cfg.training.seed)
    trajectories = [t for t in wh.read("trajectories").iter_rows(named=True) if t["trajectory_id"] not in held_out]
    _, tokenizer = load_model(base_model(cfg))
    rejections: list = []
    examples = build_sft_examples(trajectories, tokenizer, cfg.sft.max_length, rejections)
    if not examples:
        raise ValueError(no_examples_reason(rejections, cfg.sft.max_length))
    log(f"sft_policy: {len(examples)} trajectories, {cfg.sft.steps} steps, {precision.dtype} ({precision.reason})")
    progress = Progress(total=cfg.sft.steps, unit="sft steps", log=log, every_s=0)
    t0 = time.perf_counter()
    rows = train_sft(base_model(cfg), examples, cfg.sft, out, precision, threads=cfg.runtime.threads,
                     on_step=lambda r: progress.update(1, f"loss {r['loss']:.4f}, {r['tokens'] / r['seconds']:.0f} tokens/s"))
    import pyarrow as pa

    wh.write_table("sft_steps", pa.Table.from_pylist(rows))
    write_marker(out, key)
    return {**result, "skipped": False, "n_examples": len(examples), "n_held_out": len(held_out),
            "not_trained_on": len(rejections), "train_s": time.perf_counter() - t0}
