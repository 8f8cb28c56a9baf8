"""bench/gpu/decisive.sh's GPU config is configs/decisive_bfcl.yaml with the GPU's changes only. (Its CPU slice runs
in tests/training/test_decisive.py, as the decisive runner's resume and kill test.)"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    # every training key kept but dtype, which goes from the CPU design's float32 to auto on every stage
    assert {k: cfg["training"][k] for k in base["training"] if k != "dtype"} == {
        k: v for k, v in base["training"].items() if k != "dtype"}
    assert base["training"]["dtype"] == base["sft"]["dtype"] == base["policy"]["dtype"] == "float32"
    assert cfg["training"]["dtype"] == cfg["sft"]["dtype"] == cfg["policy"]["dtype"] == "auto"

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
