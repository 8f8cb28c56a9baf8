#!/usr/bin/env bash
# The GPU path in one run of a few minutes: profiling on vLLM (CUDA), GRPO under `accelerate launch` (one process
# per GPU) with TRL generating through vLLM colocated, evaluation; then what ran on which device, with the seconds
# of each step. Where no CUDA device is visible it runs the same chain as a CPU slice (transformers backend, one
# CPU training process, no vLLM), which is what tests/gpu/test_check_script.py runs.
#
#   bench/gpu/check.sh                 # the embedded policy; MODEL=org/name or a local dir for another
#   WORK=/tmp/gpucheck bench/gpu/check.sh    # keep the work folder (default: a new temp folder)
#
# Sized for one H100 in under 8 minutes: 24 turns x K=8 profiled, 8 GRPO steps of 8 completions, 12 held-out turns.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
PIVOT=$(dirname "$PY")/pivot
WORK=${WORK:-$(mktemp -d /tmp/pivot-gpu-check.XXXXXX)}
MODEL=${MODEL:-embedded}
mkdir -p "$WORK"
export DAGSTER_HOME="$WORK/dagster_home" HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$GPUS" -gt 0 ]; then
  MODE=cuda
  POLICY="backend: vllm, device: cuda, engine_args: {gpu_memory_utilization: 0.3}"
  GRPO="{use_vllm: true, vllm_mode: colocate, vllm_gpu_memory_utilization: 0.3}"
  SIZES=(24 8 8 8 12 64)          # turns, K, GRPO steps, generations, held-out turns, max new tokens
  PROCS=$GPUS
else
  MODE=cpu
  POLICY="backend: transformers, device: cpu"
  GRPO="{}"
  SIZES=(${CPU_SIZES:-4 2 1 2 2 16})
  PROCS=1
fi
read -r TURNS K STEPS GENS HELD TOKENS <<<"${SIZES[*]}"

cat > "$WORK/pivot.yaml" <<YAML
warehouse: $WORK/warehouse
sample: {n_trajectories: 12, seed: 0}
sft: {steps: 2}   # built by the full run (a warm-up of policy.model); GRPO starts from the reference (training.init)
policy: {model: $MODEL, $POLICY, k: $K, max_new_tokens: $TOKENS, limit_turns: $TURNS, dtype: auto}
training: {init: reference, steps: $STEPS, num_generations: $GENS, max_completion_length: $TOKENS,
           eval_fraction: 0.3, launcher: accelerate, num_processes: $PROCS, save_steps: 1000, grpo: $GRPO}
evaluation: {k: 2, max_turns: $HELD, ood_max_items: 4}
# A graded string verifier gives every turn a continuous reward, so any policy yields pivots: the check is of the
# path (engines, devices, launch), not of the model.
verifier: {default: {name: string_similarity, graded: true, facts: ignore}}
pivots: {lambda_diff: 0.95}
YAML

echo "== pivot-curation GPU check: mode $MODE, $PROCS training process(es), model $MODEL, work $WORK"
start=$(date +%s)
"$PIVOT" run --config "$WORK/pivot.yaml"
echo "== $(( $(date +%s) - start )) s in all"
"$PY" - "$MODE" "$ROOT" <<'PY'
import platform, sys
import torch
import dagster as dg

sys.path.insert(0, sys.argv[2])
from bench.bench_demo import step_seconds  # noqa: E402

mode = sys.argv[1]
if torch.cuda.is_available():
    devices = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
else:
    devices = f"no CUDA device; CPU {platform.processor() or platform.machine()}"
print(f"devices: {devices}; torch {torch.__version__}")
try:
    import vllm
    print(f"vllm {vllm.__version__}")
except ImportError:
    print("vllm not installed")
where = {"rollouts": "vLLM on cuda" if mode == "cuda" else "transformers on cpu",
         "grpo_run": "accelerate launch, TRL GRPO" + (" with vLLM colocated" if mode == "cuda" else " on cpu"),
         "pivot_eval": "transformers on " + mode}
run = dg.DagsterInstance.get().get_runs(limit=1)[0]
print(f"run {run.run_id}: {run.status.value}")
for step, s in sorted(step_seconds().items(), key=lambda kv: -kv[1]):
    print(f"  {step:<22} {s:8.1f} s   {where.get(step, '')}")
PY
