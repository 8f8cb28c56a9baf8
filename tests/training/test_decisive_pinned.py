"""bench/decisive.py's phase (a) in its pinned environment (one thread, oneMKL COMPATIBLE, ATen and oneDNN on AVX2,
torch's deterministic algorithms, float32) gives the same block twice on one machine: the same warm-up weights,
profiles and pivot sets, computed from scratch in two work dirs. prepare.json records each run's block, CPU and
settings, so that blocks computed on two CPU kinds can be compared (equality across CPU kinds needs both machines:
this test cannot show it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.scenario  # two phase (a) runs of the tiny policy on the built-in sample: ~1-2 min


def _config(path: Path, model: Path) -> Path:
    path.write_text(f"""sample: {{n_trajectories: 12, seed: 3}}
sft: {{model: {model}, steps: 3, batch_size: 2, max_length: 1024, dtype: float32}}
policy: {{backend: transformers, model: sft, k: 2, max_new_tokens: 12, dtype: float32, device: cpu}}
verifier: {{default: {{name: string_similarity, graded: true, facts: ignore}}}}
pivots: {{lambda_diff: 0.95, max_per_trajectory: 1}}
training: {{set: adv, init: sft, num_generations: 2, max_completion_length: 8, eval_fraction: 0.4,
           warmup_fraction: 0.3, dtype: float32}}
ablation: {{arms: [grpo_adv], seeds: [0], epochs: 1}}
runtime: {{threads: 1, workers: 1}}
""")
    return path


def _weights_digest(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(model_dir.glob("*.safetensors")):
        digest.update(f.read_bytes())
    return digest.hexdigest()


def test_pinned_phase_a_gives_the_same_block_and_weights_twice(decisive, tmp_path, tiny_model_dir):
    from pivot_assets.core.hardware import describe_cpu
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.training.runs import reference_model

    config, data = _config(tmp_path / "pinned.yaml", tiny_model_dir), tmp_path / "data"
    raw, _ = decisive.read_raw(config)
    runs = []
    for name in ("first", "second"):
        cfg_path, block = decisive.prepare(config, raw, tmp_path / name, data, pinned=True)
        cfg = decisive.load_cfg(cfg_path)
        reference = Path(reference_model(Warehouse(cfg.warehouse), cfg))
        runs.append((block, _weights_digest(reference)))
    assert runs[0][1] and runs[0] == runs[1]  # equal weights, and so equal profiles, pivot sets and block
    record = json.loads((data / "prepare.json").read_text())["runs"]
    assert [r["block"] for r in record] == [runs[0][0]] * 2
    for r in record:
        assert r["pinned"] == decisive.PINNED_ENV and r["deterministic_algorithms"] is True
        assert r["machine"] == describe_cpu()
        assert r["dtype"] == {"sft": "float32", "policy": "float32"}
    site = (tmp_path / "first" / "pinned_site" / "sitecustomize.py").read_text()
    assert "use_deterministic_algorithms(True)" in site
