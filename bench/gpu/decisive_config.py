"""The GPU run's config, derived from configs/decisive_bfcl.yaml so that the design has one source.

    python bench/gpu/decisive_config.py --model org/name --warehouse /tmp/dgpu/warehouse > /tmp/dgpu/gpu.yaml

What changes on a GPU, and only this (GPU_CHANGES): the policy is sampled by vLLM on CUDA, GRPO's completions come
from the same engine, every stage's dtype is `auto` (bf16 on the GPU), the warm-up starts from --model, one unit runs at a time (one GPU), and the learning rate is
the one the CPU run's sweep chose (the sweep is not rerun). The inputs point at the installed bfcl-eval data; the
runner's own paths (data, results, curves) come from the script's arguments instead.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "configs" / "decisive_bfcl.yaml"

GPU_CHANGES = {  # dtype auto: bf16 where the GPU has it (the CPU design pins float32 for its mixed CPUs)
    "policy": {"backend": "vllm", "device": "cuda", "engine_args": {"gpu_memory_utilization": 0.3}, "dtype": "auto"},
    "sft": {"dtype": "auto"},
    "training": {"rollout_engine": "vllm", "dtype": "auto"},
    "runtime": {"workers": 1},
    "decisive": {"learning_rate": 1.0e-5},
}
RUNNER_PATHS = ("data", "results", "curves")  # given to bench/decisive.py as --data/--out/--png


def _merge(into: dict, changes: dict) -> None:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def gpu_config(base: dict, *, model: str, warehouse: str, bfcl_data: Path) -> dict:
    """`base` (the CPU design) with GPU_CHANGES, the model, the warehouse and the inputs made absolute."""
    cfg = copy.deepcopy(base)
    _merge(cfg, GPU_CHANGES)
    cfg["warehouse"] = warehouse
    cfg["sft"]["model"] = model
    cfg["inputs"] = [{**spec, "path": str(bfcl_data / Path(spec["path"]).name)} for spec in cfg["inputs"]]
    for key in RUNNER_PATHS:
        cfg["decisive"].pop(key, None)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hub id (in the cache), a local dir, or `embedded`")
    ap.add_argument("--warehouse", required=True)
    args = ap.parse_args()
    import bfcl_eval

    base = yaml.safe_load(BASE.read_text())
    cfg = gpu_config(base, model=args.model, warehouse=args.warehouse,
                     bfcl_data=Path(bfcl_eval.__file__).parent / "data")
    print(f"# derived from {BASE.relative_to(ROOT)} by bench/gpu/decisive_config.py")
    print(yaml.safe_dump(cfg, sort_keys=False), end="")


if __name__ == "__main__":
    main()
