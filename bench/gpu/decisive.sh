#!/usr/bin/env bash
# The decisive comparison (bench/decisive.py: GRPO on D_adv against D_cand at equal steps, resumable units) on one
# GPU, in slices: each invocation runs for at most SLICE_S seconds (default 480), then stops; its finished units are
# files in DATA and a training arm cut mid-way resumes from its last checkpoint, so invoking it again continues where
# it stopped. When every unit is there it writes the report (the same tables as bench/RESULTS_decisive_bfcl.md).
#
#   bench/gpu/decisive.sh                         # MODEL=org/name (a Hub id in the cache) or a local dir; default embedded
#   SLICE_S=420 WORK=/tmp/dgpu bench/gpu/decisive.sh
#
# On CUDA: the BFCL single-turn design of configs/decisive_bfcl.yaml itself (3 seeds, 199 held-out items x eval_k 4,
# two passes over D_adv per arm, the CPU sweep's lr 1e-5) with all five rows of the paper's table (the reference,
# grpo_adv, grpo_cand, grpo_adv_exact, sft_same_data with its own rate sweep; every model also on the OOD probe),
# derived by bench/gpu/decisive_config.py: profiling and
# evaluation on vLLM, GRPO's completions from the same vLLM engine (training.rollout_engine vllm), the trainer on the
# GPU. Without CUDA it runs a tiny slice of the same chain
# on the CPU (the built-in sample, transformers, one seed, a two-rate sweep), which
# tests/training/test_decisive.py runs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
MODEL=${MODEL:-embedded}
SLICE_S=${SLICE_S:-480}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} PYTHONUNBUFFERED=1

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$GPUS" -gt 0 ]; then
  NAME=decisive_bfcl_gpu   # the config: configs/decisive_bfcl.yaml with the GPU's changes (bench/gpu/decisive_config.py)
else
  NAME=decisive_cpu_slice
  BODY="sample: {n_trajectories: 12, seed: 3}
sft: {model: $MODEL, steps: 2, batch_size: 2, max_length: 1024}
policy: {backend: transformers, model: sft, k: 2, max_new_tokens: 12, dtype: auto, device: cpu}
verifier: {default: {name: string_similarity, graded: true, facts: ignore}}
pivots: {lambda_diff: 0.95, max_per_trajectory: 1}
training: {set: adv, init: sft, num_generations: 2, max_completion_length: 8, eval_fraction: 0.4,
           warmup_fraction: 0.3, save_steps: 1, grpo: {gradient_checkpointing: false}}
evaluation: {k: 2, max_turns: 6, bootstrap: 200}
ablation: {arms: [grpo_adv, grpo_cand], seeds: [0], epochs: 1, primary: profiled}
runtime: {workers: 1}
decisive: {learning_rate: sweep, half_width: 0.5,
           sweep: {learning_rates: [1.0e-3, 1.0e-2], seed: 5, epochs: 0.5, items: 3, eval_k: 2, tie: 0.0}}"
fi
WORK=${WORK:-/tmp/$NAME}
DATA=${DATA:-$ROOT/bench/data/$NAME}
OUT=${OUT:-$ROOT/bench/RESULTS_$NAME.md}
mkdir -p "$WORK" "$DATA"
CONFIG="$WORK/$NAME.yaml"
if [ "$GPUS" -gt 0 ]; then
  "$PY" "$ROOT/bench/gpu/decisive_config.py" --model "$MODEL" --warehouse "$WORK/warehouse" > "$CONFIG"
  # the paper's table in one block: the first run's arms and the table run's (configs/decisive_bfcl_table.yaml),
  # every model on the OOD probe; phase (a) unpinned (deterministic algorithms need cuBLAS settings vLLM does not take)
  "$PY" - "$CONFIG" "$ROOT/configs/decisive_bfcl_table.yaml" <<'PYEOF'
import sys

import yaml

path, table_path = sys.argv[1], sys.argv[2]
cfg, table = yaml.safe_load(open(path)), yaml.safe_load(open(table_path))
cfg["ablation"]["arms"] = ["grpo_adv", "grpo_cand", "grpo_adv_exact", "sft_same_data"]
cfg["ablation"]["exact_verifier"] = table["ablation"]["exact_verifier"]
cfg["decisive"].update(ood=True, sft_sweep=table["decisive"]["sft_sweep"], table=None, paper_table=True, pinned=False)
with open(path, "w") as f:
    f.write("# configs/decisive_bfcl.yaml on the GPU (bench/gpu/decisive_config.py), all five rows of the paper's table\n")
    yaml.safe_dump(cfg, f, sort_keys=False)
PYEOF
else
  printf 'warehouse: %s/warehouse\n%s\n' "$WORK" "$BODY" > "$CONFIG"
fi

echo "== decisive on $([ "$GPUS" -gt 0 ] && echo "$GPUS GPU(s)" || echo "the CPU (a tiny slice)"): model $MODEL, units $DATA, work $WORK, slice ${SLICE_S} s"
set +e
# INT first (the runner's workers stop and keep their checkpoints), KILL 30 s later if it has not ended
timeout --signal=INT --kill-after=30 "$SLICE_S" "$PY" "$ROOT/bench/decisive.py" --config "$CONFIG" --data "$DATA" \
  --work "$WORK" --out "$OUT" --png "${OUT%.md}_curves.png"
rc=$?
set -e
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  echo "== slice over after ${SLICE_S} s: $(ls "$DATA"/*.parquet 2>/dev/null | wc -l) unit file(s) in $DATA; run it again to continue"
  exit 0
fi
exit $rc
