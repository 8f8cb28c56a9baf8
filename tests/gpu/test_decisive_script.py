"""bench/gpu/decisive.sh without a GPU: its CPU slice (the built-in sample, the tiny policy, one seed) runs the
decisive runner to its report; invoked again it computes no unit; a slice cut by its time limit ends in one line
with rc 0 and keeps what it finished, and the next invocation completes the run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "decisive.sh"
COUNT = re.compile(r"decisive: computed (\d+) unit\(s\) \(train (\d+), eval (\d+)\); (\d+) already present")

pytestmark = pytest.mark.slow


def _invoke(tmp: Path, model: Path, slice_s: int, name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MODEL": str(model), "SLICE_S": str(slice_s), "WORK": str(tmp / "work"),
           "DATA": str(tmp / name), "OUT": str(tmp / f"{name}.md"), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_the_cpu_slice_runs_to_the_report_and_resumes(tmp_path, tiny_model_dir):
    cut = _invoke(tmp_path, tiny_model_dir, 8, "units")  # phase (a) alone takes longer than 8 s
    assert "slice over after 8 s" in cut.stdout and "run it again to continue" in cut.stdout
    full = _invoke(tmp_path, tiny_model_dir, 600, "units")
    computed, train, ev, present = map(int, COUNT.search(full.stdout).groups())
    assert (train, ev) == (2, 3) and computed + present == 5
    report = (tmp_path / "units.md").read_text()
    assert "## Results" in report and "**Verdict:" in report
    again = _invoke(tmp_path, tiny_model_dir, 600, "units")
    assert COUNT.search(again.stdout).groups() == ("0", "0", "0", "5")
