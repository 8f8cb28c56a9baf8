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


def test_the_gpu_config_is_the_cpu_design_with_the_gpu_changes_only(tmp_path):
    """bench/gpu/decisive_config.py: every key of configs/decisive_bfcl.yaml kept except the listed GPU changes, the
    model, the warehouse and the inputs' directory; the result passes the project's config validation."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("decisive_config", ROOT / "bench" / "gpu" / "decisive_config.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    base = yaml.safe_load(mod.BASE.read_text())
    cfg = mod.gpu_config(base, model="org/name", warehouse=str(tmp_path / "wh"), bfcl_data=tmp_path / "bfcl")

    assert cfg["policy"]["backend"] == "vllm" and cfg["policy"]["device"] == "cuda"
    assert cfg["training"]["rollout_engine"] == "vllm" and cfg["sft"]["model"] == "org/name"
    assert [Path(i["path"]).parent for i in cfg["inputs"]] == [tmp_path / "bfcl"] * len(base["inputs"])
    assert cfg["ablation"] == base["ablation"] and cfg["pivots"] == base["pivots"]
    assert cfg["decisive"]["sweep"] == base["decisive"]["sweep"] and "data" not in cfg["decisive"]
    assert {k: cfg["training"][k] for k in base["training"]} == base["training"]

    from pivot_assets.core.config import load_config

    for spec_ in cfg["inputs"]:
        Path(spec_["path"]).parent.mkdir(parents=True, exist_ok=True)
        Path(spec_["path"]).write_text("[]")
    decisive = cfg.pop("decisive")
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    loaded = load_config(path)
    assert loaded.policy.backend == "vllm" and loaded.training.rollout_engine == "vllm"
    assert decisive["learning_rate"] == 1.0e-5
