"""bench/gpu/check.sh on a machine without CUDA: its CPU slice (the same chain, transformers on the CPU, one
launched training process) on the tiny test policy runs to the end and reports each step with its device."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.scenario


def test_the_gpu_check_runs_its_cpu_slice(tmp_path, tiny_model_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the script runs its GPU path (run it by hand)")
    env = {**os.environ, "MODEL": str(tiny_model_dir), "WORK": str(tmp_path / "work"), "HF_HUB_OFFLINE": "1"}
    env.pop("DAGSTER_HOME", None)
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "check.sh")], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    out = proc.stdout
    assert "mode cpu, 1 training process(es)" in out and "devices: no CUDA device" in out
    assert ": SUCCESS" in out
    for step, where in (("rollouts", "transformers on cpu"), ("grpo_run", "accelerate launch, TRL GRPO on cpu"),
                        ("pivot_eval", "transformers on cpu")):
        assert any(line.split()[:1] == [step] and line.rstrip().endswith(where) for line in out.splitlines()), step
