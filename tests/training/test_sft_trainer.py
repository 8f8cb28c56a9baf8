"""SFT on trl.SFTTrainer: the loss is the assistant-only loss of the examples, the `sft.trl` passthrough and the
device are checked up front, and a killed run resumes from its last complete checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from pivot_assets.core.config import SFTSection
from pivot_assets.core.hardware import Precision
from pivot_assets.policies.models import load_model, load_tokenizer
from pivot_assets.training.sft import (
    _collate,
    build_sft_examples,
    last_complete_checkpoint,
    sft_config_kwargs,
    train_sft,
    trainer_device,
)

from .test_sft import shop_trajectory

FP32 = Precision("float32", "float32", "cpu", "explicit")
# The Trainer logs the loss rounded to 4 decimals; the rest is float noise of the same fp32 forward.
LOSS_TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def examples(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    return build_sft_examples([shop_trajectory("E5", "shipped"), shop_trajectory("F6", "late")], tokenizer, 256)


def test_first_step_loss_is_the_assistant_only_loss_of_the_batch(tiny_model_dir, examples, tmp_path):
    model, tokenizer = load_model(str(tiny_model_dir), dtype="float32")
    with torch.no_grad():  # the reference: the model's mean CE over exactly the assistant tokens (labels != -100)
        reference = float(model(**_collate(examples, tokenizer.eos_token_id)).loss)
    rows = train_sft(str(tiny_model_dir), examples, SFTSection(steps=1, batch_size=2), tmp_path / "sft", FP32,
                     threads=1)
    assert len(rows) == 1 and rows[0]["loss_tokens"] == sum(sum(t != -100 for t in e["labels"]) for e in examples)
    assert abs(rows[0]["loss"] - reference) < LOSS_TOLERANCE, (rows[0]["loss"], reference)


class Killed(Exception):
    pass


def test_a_killed_run_resumes_from_its_last_complete_checkpoint(tiny_model_dir, examples, tmp_path):
    options = SFTSection(steps=4, batch_size=1, save_steps=2, learning_rate=1e-5, lr_scheduler="linear",
                         warmup_ratio=0.5)
    out = tmp_path / "sft"
    before_kill: list[dict] = []

    def kill_in_step_3(row: dict) -> None:  # step 3 is logged before any checkpoint-4 could be written
        before_kill.append(row)
        if row["step"] == 3:
            raise Killed

    with pytest.raises(Killed):
        train_sft(str(tiny_model_dir), examples, options, out, FP32, threads=1, on_step=kill_in_step_3)
    work_dirs = list(tmp_path.glob(".sft.trainer-*"))
    assert len(work_dirs) == 1 and not out.exists()
    checkpoint = last_complete_checkpoint(work_dirs[0])
    assert checkpoint and checkpoint.endswith("checkpoint-2")
    assert json.loads((work_dirs[0] / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2

    rows = train_sft(str(tiny_model_dir), examples, options, out, FP32, threads=1)
    assert [r["step"] for r in rows] == [3, 4]  # only the steps after the checkpoint ran
    # the schedule resumes too: linear warm-up over steps 1-2, then linear decay
    assert before_kill[0]["lr"] < before_kill[1]["lr"] and rows[1]["lr"] < rows[0]["lr"]
    assert out.exists() and not list(tmp_path.glob(".sft.trainer-*"))


def test_sft_trl_passthrough_is_checked_against_sft_config(tmp_path):
    kwargs = sft_config_kwargs(SFTSection(trl={"weight_decay": 0.1, "optim": "adamw_torch"}), str(tmp_path), FP32, on_cpu=True)
    assert kwargs["weight_decay"] == 0.1 and kwargs["gradient_checkpointing"] is True
    with pytest.raises(ValueError, match="unknown trl.SFTConfig key 'not_an_option'"):
        sft_config_kwargs(SFTSection(trl={"not_an_option": 1}), str(tmp_path), FP32, on_cpu=True)
    with pytest.raises(ValueError, match="duplicates sft.learning_rate"):
        sft_config_kwargs(SFTSection(trl={"learning_rate": 0.5}), str(tmp_path), FP32, on_cpu=True)


def test_a_gpu_other_than_the_first_visible_one_is_refused():
    assert trainer_device("cpu") and not trainer_device("cuda:0")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=1"):
        trainer_device("cuda:1")
