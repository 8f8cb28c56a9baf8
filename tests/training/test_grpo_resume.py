"""A keyed GRPO run stopped after step n and run again resumes from its checkpoint and ends where one uninterrupted
run ends: the same loss and reward trace for the steps after the resume, and the same weights. This is what the
decisive run's resumed seeds rest on (bench/data/decisive_bfcl/README.md: seeds 1 and 2 resumed mid-run)."""

from __future__ import annotations

import pytest
import torch

from pivot_assets.core.config import TrainingSection
from pivot_assets.core.hardware import Precision
from pivot_assets.verifiers import DomainVerifiers
from tests.training.test_grpo import VERIFIERS, tiny_dataset

FP32 = Precision("float32", "float32", "cpu", "explicit")
STEPS, STOP_AFTER, SAVE_STEPS = 4, 2, 2  # checkpoint-2 is the last complete one when step 3 is cut
# The tolerance the comparison allows: float32 on one thread repeats bit for bit, so it is tight; it absorbs only
# a different summation order, never a different sample (one flipped token moves the loss by far more).
ATOL = 1e-6


class Stop(Exception):
    """Raised from the step callback: the run is cut as a kill would cut it, after checkpoint STOP_AFTER."""


def _run(model_dir, out, stop_at: int | None = None):
    from pivot_assets.training.grpo import run_grpo

    def on_step(row):
        if stop_at is not None and row["step"] == stop_at:
            raise Stop(row["step"])

    options = TrainingSection(steps=STEPS, num_generations=2, max_completion_length=12, eval_fraction=0.0,
                              save_steps=SAVE_STEPS, learning_rate=1e-3, seed=7)
    return run_grpo(str(model_dir), tiny_dataset(), DomainVerifiers(VERIFIERS), options, out, cpu_smoke=False,
                    precision=FP32, threads=1, run_key="resume-test", on_step=on_step, log_line=lambda m: None)


def _weights(model_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next(iter(sorted(model_dir.glob("*.safetensors"))))))


@pytest.mark.scenario  # three short GRPO runs of the tiny policy
def test_a_grpo_run_resumed_after_step_n_equals_an_uninterrupted_one(tiny_model_dir, tmp_path):
    whole = _run(tiny_model_dir, tmp_path / "whole" / "model")
    with pytest.raises(Stop):
        _run(tiny_model_dir, tmp_path / "cut" / "model", stop_at=STOP_AFTER + 1)
    kept = sorted(p.name for p in (tmp_path / "cut").glob(".model.trainer-*/checkpoint-*"))
    assert kept == [f"checkpoint-{STOP_AFTER}"]  # the cut run left the checkpoint it resumes from
    resumed = _run(tiny_model_dir, tmp_path / "cut" / "model")

    # the resumed run's trace: steps 1..n read back from the checkpoint (no `seconds`: this process did not time
    # them, as in the decisive units of the resumed seeds), the rest trained here; all match the uninterrupted run's
    assert [r["step"] for r in resumed.steps] == list(range(1, STEPS + 1))
    assert [r["seconds"] is None for r in resumed.steps] == [r["step"] <= STOP_AFTER for r in resumed.steps]
    same = {r["step"]: r for r in whole.steps}
    for row in resumed.steps:
        for key in ("loss", "reward_mean", "frac_reward_zero_std"):
            assert row[key] == pytest.approx(same[row["step"]][key], abs=ATOL), (row["step"], key)
    assert [(e["step"], e["completion"]) for e in resumed.completions_log] == \
        [(e["step"], e["completion"]) for e in whole.completions_log if e["step"] > STOP_AFTER]

    a, b = _weights(tmp_path / "whole" / "model"), _weights(tmp_path / "cut" / "model")
    assert a.keys() == b.keys()
    moved = _weights(tiny_model_dir)
    assert any(not torch.equal(a[k], moved[k]) for k in a if k in moved)  # training moved the weights at all
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= ATOL, f"resumed weights differ from the uninterrupted run's by {worst:.3g}"
