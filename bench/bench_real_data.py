"""Real agent data through profiling and selection with the embedded policy: BFCL multi-turn and the tau2 airline
run, cold and timed, into bench/RESULTS_real_data.md.

    .venv/bin/python bench/bench_real_data.py [--datasets bfcl_multi_turn,tau2_airline] [--keep DIR]
                                              [--out bench/RESULTS_real_data.md] [--report-only] [--smoke]

For each dataset, `pivot run --config <configs/DATASET.yaml, warehouse moved> --select <ingest .. pivot sets>` in
a fresh warehouse and Dagster home (nothing cached but the converted embedded model): ingest, turns, the SFT
warm-up (the reference policy), rollouts on the config's `limit_turns`, scoring, profiles, D_mixed / D_adv /
D_cand. Then, from the warehouse and the run's events:
  - the funnel (turns, profiled, mixed, adv, cand; per domain) and the reward reasons;
  - the cost: prompt tokens per turn (all turns and the profiled ones), prefill tokens computed vs the unique
    prefix tokens of the profiled prompts (a token trie per trajectory: what a perfect prefix cache prefills),
    generated tokens, samples/s, the wall time of every step, the load average;
  - what the whole dataset would take: here (the measured seconds per profiled turn) and on one GPU under the
    assumptions stated in GPU_ASSUMPTIONS (prefill at a share of peak bf16 FLOP/s, decode bound by reading the
    KV cache and the weights from HBM).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_demo import step_seconds, timed_pivot_run  # noqa: E402

DATASETS = {"bfcl_multi_turn": ROOT / "configs" / "bfcl_multi_turn.yaml",
            "tau2_airline": ROOT / "configs" / "tau2_airline.yaml"}
# Inputs whose prompts are measured but not profiled here (too long for this CPU; the config says why).
MEASURE_ONLY = {"bfcl_multi_turn": ["../../shared/data/bfcl/BFCL_v4_multi_turn_long_context.json"]}
SELECT = ("trajectories,turns,sft_policy,rollouts,rollout_rewards,turn_profiles,"
          "pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log")
# One H100-class GPU, bf16 (an H200 has the same FLOP/s and 4.8 TB/s). Prefill is compute-bound: 2 x params FLOPs a
# token at PREFILL_MFU of peak. Decode is bandwidth-bound: each generated token reads its sequence's KV cache
# (the K samples of a turn do not share reads) plus the weights once per step of a DECODE_BATCH-sequence batch.
PARAMS = 134.5e6  # SmolLM2-135M
# causal prefill attention of an L-token prompt: QK^T and PV, 2 FLOPs a multiply-add, half the square: 2 x L^2 x
# head_dim x heads x layers (SmolLM2-135M: 64 x 9 x 30)
ATTENTION_FLOPS_PER_SQUARED_TOKEN = 2 * 64 * 9 * 30
GPU_ASSUMPTIONS = {"name": "H100 SXM (bf16)", "peak_tflops": 989.0, "prefill_mfu": 0.4, "hbm_tbps": 3.35,
                   "bandwidth_efficiency": 0.6, "decode_batch": 256, "k": 8}


SMOKE = {"policy": {"limit_turns": 2, "k": 2, "max_new_tokens": 8}, "sft": {"steps": 1}}  # --smoke: checks the script


def work_config(dataset: str, work: Path, smoke: bool = False) -> Path:
    """The dataset's config with its warehouse in `work` and its input paths made absolute."""
    source = DATASETS[dataset]
    raw = yaml.safe_load(source.read_text())
    raw["warehouse"] = str(work / "warehouse")
    for section, values in (SMOKE.items() if smoke else ()):
        raw[section] = {**raw[section], **values}
    for spec in raw.get("inputs") or []:
        for key in ("path", "tools", "answers"):
            if spec.get(key):
                spec[key] = str((source.parent / spec[key]).resolve())
    path = work / "pivot.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run(dataset: str, work: Path, smoke: bool = False) -> dict:
    config = work_config(dataset, work, smoke)
    env = {**os.environ, "DAGSTER_HOME": str(work / "dagster_home"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    (work / "dagster_home").mkdir(exist_ok=True)
    load = os.getloadavg()
    print(f"{dataset}:", end=" ", flush=True)
    timing = {**timed_pivot_run(config, SELECT, env, work / "run.log"), "load_start": load,
              "load_end": os.getloadavg()}
    (work / "timing.json").write_text(json.dumps(timing))
    return timing


# ---------------------------------------------------------------------------------------------- measuring


def latest_metadata(asset: str) -> dict:
    import dagster as dg

    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey(asset))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()} if event else {}


def percentiles(values: list[float]) -> dict:
    v = sorted(values)
    if not v:
        return {}
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"n": len(v), "min": v[0], "p50": pick(0.5), "p90": pick(0.9), "max": v[-1], "mean": statistics.fmean(v)}


def measure(dataset: str, work: Path) -> dict:
    import polars as pl

    from pivot_assets.core.config import load_config
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.policies.models import PromptFormat, load_tokenizer
    from pivot_assets.policies.transformers_backend import common_prefix_len

    os.environ["DAGSTER_HOME"] = str(work / "dagster_home")
    cfg = load_config(work / "pivot.yaml")
    wh = Warehouse(cfg.warehouse_dir)
    tok = load_tokenizer("embedded", PromptFormat.from_policy(cfg.policy))
    from pivot_assets.training.runs import SFT_DIR

    context = json.loads((Path(wh.model_dir(SFT_DIR)) / "config.json").read_text())["max_position_embeddings"]
    trajectories = {t["trajectory_id"]: t for t in wh.read("trajectories").iter_rows(named=True)}
    turns = wh.read("turns").sort(["trajectory_id", "message_index"])
    profiles = wh.read("turn_profiles")
    profiled = set(profiles["turn_id"].to_list())

    prompt_ids, action_tokens, unique_all = prompt_stats(tok, trajectories, turns.to_dicts())
    unique_profiled = attention_flops = 0
    for _, group in turns.filter(pl.col("turn_id").is_in(sorted(profiled))).group_by("trajectory_id", maintain_order=True):
        previous = []
        for turn_id in group["turn_id"].to_list():
            ids, shared = prompt_ids[turn_id], common_prefix_len(previous, prompt_ids[turn_id])
            unique_profiled += len(ids) - shared
            attention_flops += ATTENTION_FLOPS_PER_SQUARED_TOKEN * (len(ids) ** 2 - shared ** 2)
            previous = ids

    rollouts = wh.read("rollouts")
    rewards = Counter(wh.read("rollout_rewards")["reason"].to_list()).most_common()
    sets = {name: wh.read(f"pivots_{name}") for name in ("mixed", "adv", "cand")}
    by_domain = defaultdict(Counter)
    domain_of = dict(zip(turns["turn_id"].to_list(), turns["domain"].to_list()))
    for t in turns["turn_id"].to_list():
        by_domain[domain_of[t]]["turns"] += 1
    for t in profiles["turn_id"].to_list():
        by_domain[domain_of[t]]["profiled"] += 1
    for name, table in sets.items():
        for t in table["turn_id"].to_list():
            by_domain[domain_of[t]][name] += 1
    means = profiles["reward_mean"].to_list()
    meta = latest_metadata("rollouts")
    timing = json.loads((work / "timing.json").read_text()) if (work / "timing.json").exists() else {}
    return {
        "dataset": dataset, "config": str(DATASETS[dataset].relative_to(ROOT)), "policy": cfg.policy.model_dump(),
        "sft": cfg.sft.model_dump(), "context": context,
        "ingest": {k: latest_metadata("trajectories").get(k) for k in ("read", "ingested", "quarantined", "duplicates",
                                                                       "skipped_files")},
        "funnel": {"trajectories": len(trajectories), "turns": turns.height, "profiled": profiles.height,
                   **{name: t.height for name, t in sets.items()}},
        "by_domain": {d: dict(c) for d, c in sorted(by_domain.items())},
        "reward_mean": {"zero": sum(m == 0 for m in means), "one": sum(m == 1 for m in means),
                        "between": sum(0 < m < 1 for m in means)},
        "reasons": rewards,
        "prompt_tokens_all": percentiles([len(v) for v in prompt_ids.values()]),
        "prompt_tokens_profiled": percentiles([len(prompt_ids[t]) for t in profiled]),
        "over_context": sum(len(v) > context for v in prompt_ids.values()),
        "over_context_profiled": sum(len(prompt_ids[t]) > context for t in profiled),
        "action_tokens": percentiles(action_tokens),
        "actions_over_max_new": sum(a > cfg.policy.max_new_tokens for a in action_tokens),
        "unique_prefix_all": unique_all, "unique_prefix_profiled": unique_profiled,
        "prompt_tokens_profiled_sum": sum(len(prompt_ids[t]) for t in profiled),
        "prompt_tokens_all_sum": sum(len(v) for v in prompt_ids.values()),
        "prefill_attention_flops": attention_flops, "matmul_gflops_bf16": matmul_gflops(),
        "rollouts": {"rows": rollouts.height, "completion_tokens": int(rollouts["n_completion_tokens"].sum()),
                     "finish": dict(Counter(rollouts["finish_reason"].to_list()))},
        "rollouts_meta": {k: v for k, v in meta.items() if isinstance(v, (int, float, str))},
        "steps": step_seconds(), "timing": timing,
        "measure_only": [measure_only(tok, DATASETS[dataset].parent / path, context)
                         for path in MEASURE_ONLY.get(dataset, [])],
    }


def prompt_stats(tok, trajectories: dict, turns: list[dict]) -> tuple[dict, list[int], int]:
    """(turn_id -> prompt token ids, expert action tokens, unique prefix tokens) of turns in trajectory order: the
    unique prefix of a trajectory's prompts is its first prompt plus what each next prompt adds."""
    from pivot_assets.policies.models import render_action, render_prompt
    from pivot_assets.policies.transformers_backend import common_prefix_len

    prompt_ids: dict[str, list[int]] = {}
    action_tokens, unique, previous, current = [], 0, [], None
    for turn in sorted(turns, key=lambda t: (t["trajectory_id"], t["message_index"])):
        traj = trajectories[turn["trajectory_id"]]
        if turn["trajectory_id"] != current:
            current, previous = turn["trajectory_id"], []
        ids = tok(render_prompt(tok, traj["messages"][: turn["message_index"]], json.loads(traj["tools"])),
                  add_special_tokens=False)["input_ids"]
        prompt_ids[turn["turn_id"]] = ids
        unique += len(ids) - common_prefix_len(previous, ids)
        previous = ids
        action = render_action(json.loads(turn["expert_action"]))
        action_tokens.append(len(tok(action, add_special_tokens=False)["input_ids"]) + 1)
    return prompt_ids, action_tokens, unique


def measure_only(tok, path: Path, context: int) -> dict:
    """Prompt lengths of an input that is not profiled (ingested here in memory by the reference path)."""
    from pivot_assets.ingest.turn_extraction import extract_turns
    from tests.ingest.reference import ingest_to_tables

    table, _, counts = ingest_to_tables([{"path": str(path.resolve())}])
    trajectories = {t["trajectory_id"]: t for t in table.to_pylist()}
    turns = [turn for t in trajectories.values() for turn in extract_turns(t)]
    prompt_ids, action_tokens, unique = prompt_stats(tok, trajectories, turns)
    lengths = [len(v) for v in prompt_ids.values()]
    over = {t["trajectory_id"] for t in turns if len(prompt_ids[t["turn_id"]]) > context}
    return {"path": path.name, "trajectories": len(trajectories), "turns": len(turns), "read": counts["read"],
            "prompt_tokens": percentiles(lengths), "over_context": sum(n > context for n in lengths),
            "trajectories_over_context": len(over), "unique_prefix": unique, "action_tokens": percentiles(action_tokens)}


# ---------------------------------------------------------------------------------------------- estimates


def gpu_estimate(turns: int, unique_prefix: int, mean_prompt: float, mean_completion: float) -> dict:
    """Seconds one GPU would take to profile `turns` turns at K=GPU_ASSUMPTIONS['k'] (module docstring)."""
    g = GPU_ASSUMPTIONS
    params = PARAMS
    kv_bytes_per_token = 30 * 2 * 3 * 64 * 2  # layers x (K, V) x KV heads x head dim x bf16
    decode_tokens = turns * g["k"] * mean_completion
    prefill_s = 2 * params * unique_prefix / (g["peak_tflops"] * 1e12 * g["prefill_mfu"])
    bytes_per_token = kv_bytes_per_token * (mean_prompt + mean_completion / 2) + 2 * params / g["decode_batch"]
    decode_s = decode_tokens * bytes_per_token / (g["hbm_tbps"] * 1e12 * g["bandwidth_efficiency"])
    return {"decode_tokens": decode_tokens, "mean_completion": mean_completion, "prefill_s": prefill_s,
            "decode_s": decode_s, "total_s": prefill_s + decode_s}


def matmul_gflops(n: int = 1024, reps: int = 8) -> float:
    """bf16 matmul GFLOP/s on one torch thread, measured now (what the FLOP floor divides by)."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(n, n, dtype=torch.bfloat16), torch.randn(n, n, dtype=torch.bfloat16)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def cpu_estimate(m: dict) -> dict:
    """Prefill here: the prefill tokens computed per second of the rollouts step (decode included, so a floor on
    the time), applied to the unique prefix tokens of every turn (prefix reuse across a trajectory's turns)."""
    wall = m["rollouts_meta"].get("wall_s") or m["steps"].get("rollouts", 0.0)
    rate = m["rollouts_meta"].get("prefill_tokens_computed", 0) / max(wall, 1e-9)
    return {"s_per_turn": wall / max(m["funnel"]["profiled"], 1), "prefill_tokens_per_s": rate,
            "all_prefill_s": m["unique_prefix_all"] / max(rate, 1e-9)}


# ---------------------------------------------------------------------------------------------- report


def fmt_p(p: dict) -> str:
    return f"{p['min']:,} / {p['p50']:,} / {p['p90']:,} / {p['max']:,} (mean {p['mean']:,.0f}, n {p['n']:,})"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def section(m: dict) -> list[str]:
    f, meta, steps = m["funnel"], m["rollouts_meta"], m["steps"]
    t = m["timing"]
    samples = m["rollouts"]["rows"]
    wall = meta.get("wall_s") or steps.get("rollouts", 0.0)
    mean_completion = m["action_tokens"]["mean"]  # what an accurate policy writes (the expert action's length)
    floor_tflop = (2 * PARAMS * (meta.get("prefill_tokens_computed", 0) + m["rollouts"]["completion_tokens"])
                   + m["prefill_attention_flops"]) / 1e12
    floor_s = floor_tflop * 1e3 / max(m["matmul_gflops_bf16"], 1e-9)
    cpu = cpu_estimate(m)
    gpu = gpu_estimate(f["turns"], m["unique_prefix_all"], m["prompt_tokens_all"]["mean"], mean_completion)
    p = m["policy"]
    lines = [
        f"## {m['dataset']} (`{m['config']}`)", "",
        f"Reference: `model: {p['model']}` (SFT warm-up: {m['sft']['steps']} steps, batch {m['sft']['batch_size']}, "
        f"max_length {m['sft']['max_length']}, examples `{m['sft']['examples']}`), K={p['k']}, temperature "
        f"{p['temperature']}, max_new_tokens {p['max_new_tokens']}, limit_turns {p['limit_turns']}, dtype "
        f"{meta.get('dtype', p['dtype'])}.",
        f"Ingest: read {m['ingest']['read']}, ingested {m['ingest']['ingested']}, quarantined "
        f"{m['ingest']['quarantined']}, duplicates {m['ingest']['duplicates']}, skipped files {m['ingest']['skipped_files']}.",
        "",
        "| funnel | trajectories | turns | profiled | D_mixed | D_adv | D_cand |", "|---|---|---|---|---|---|---|",
        f"| all | {f['trajectories']:,} | {f['turns']:,} | {f['profiled']} | {f['mixed']} | {f['adv']} | {f['cand']} |",
    ]
    for domain, c in m["by_domain"].items():
        lines.append(f"| {domain} | | {c.get('turns', 0):,} | {c.get('profiled', 0)} | {c.get('mixed', 0)} | "
                     f"{c.get('adv', 0)} | {c.get('cand', 0)} |")
    rm = m["reward_mean"]
    lines += ["", f"Profiled turns by reward mean: {rm['zero']} at 0, {rm['between']} in (0, 1), {rm['one']} at 1.", "",
              "| reward reason | samples |", "|---|---|"]
    lines += [f"| {reason} | {n} |" for reason, n in m["reasons"]]
    over = m["prompt_tokens_all"]
    lines += [
        "", "| cost | value |", "|---|---|",
        f"| prompt tokens per turn, all turns (min / p50 / p90 / max) | {fmt_p(over)} |",
        f"| prompt tokens per turn, profiled turns | {fmt_p(m['prompt_tokens_profiled'])} |",
        f"| turns over the model's context ({m['context']:,} tokens) | {m['over_context']} of {f['turns']:,} "
        f"({m['over_context_profiled']} profiled) |",
        f"| expert action tokens (min / p50 / p90 / max) | {fmt_p(m['action_tokens'])}; "
        f"{m['actions_over_max_new']} longer than max_new_tokens |",
        f"| prompt tokens of the profiled turns, summed | {m['prompt_tokens_profiled_sum']:,} |",
        f"| unique prefix tokens of the profiled turns | {m['unique_prefix_profiled']:,} |",
        f"| prefill tokens computed | {meta.get('prefill_tokens_computed', 0):,} "
        f"({meta.get('prefill_tokens_computed', 0) / max(m['unique_prefix_profiled'], 1):.2f}x unique) |",
        f"| generated tokens | {m['rollouts']['completion_tokens']:,} (finish: {m['rollouts']['finish']}) |",
        f"| samples | {samples} ({samples / max(wall, 1e-9):.2f} samples/s, {wall / max(f['profiled'], 1):.1f} s a turn) |",
        f"| FLOP floor of the rollouts (2 x params x (prefill + generated) + prefill attention) | {floor_tflop:.1f} TFLOP: "
        f"{floor_s:.0f} s at the {m['matmul_gflops_bf16']:.0f} GFLOP/s bf16 matmul measured at report time, vs "
        f"{wall:.0f} s measured |",
        f"| prompt tokens of every turn (whole dataset), summed / unique prefix | {m['prompt_tokens_all_sum']:,} / "
        f"{m['unique_prefix_all']:,} ({m['prompt_tokens_all_sum'] / max(m['unique_prefix_all'], 1):.1f}x: what prefix "
        "reuse saves on a full run) |",
        "", "| step | seconds |", "|---|---|",
    ]
    lines += [f"| {k} | {v:.0f} |" for k, v in sorted(steps.items(), key=lambda kv: -kv[1]) if v >= 0.5]
    if t:
        lines.append(f"| **`pivot run` wall (CPU s)** | **{t['total_s']:.0f}** ({t['cpu_s']:.0f}) |")
        lines += ["", f"Load average at the start {t['load_start'][0]:.2f} / {t['load_start'][1]:.2f} / "
                      f"{t['load_start'][2]:.2f}, at the end {t['load_end'][0]:.2f} (2 cores, shared with other jobs)."]
    g = GPU_ASSUMPTIONS
    lines += [
        "", f"Every turn of the dataset ({f['turns']:,}): here, at the measured {cpu['prefill_tokens_per_s']:.0f} prefill "
        f"tokens/s (decode included), its {m['unique_prefix_all']:,} unique prefix tokens alone take at least "
        f"{hours(cpu['all_prefill_s'])}. On one "
        f"{g['name']} at K={g['k']} (assumed: prefill at {g['prefill_mfu']:.0%} of {g['peak_tflops']:.0f} TFLOP/s on "
        f"those unique prefix tokens; decode of {gpu['decode_tokens']:,.0f} tokens "
        f"({gpu['mean_completion']:.0f} a sample: the expert actions' mean) reading each sample's KV cache and the weights per "
        f"{g['decode_batch']}-sequence step at {g['bandwidth_efficiency']:.0%} of {g['hbm_tbps']} TB/s): prefill "
        f"{gpu['prefill_s']:.1f} s + decode {gpu['decode_s']:.0f} s = about {hours(gpu['total_s'])}, before model load "
        "and scoring" + (f" ({m['over_context']} turns are longer than the embedded model's context: a longer-context "
                         "model assumed for them)." if m["over_context"] else "."),
    ]
    for x in m["measure_only"]:
        gx = gpu_estimate(x["turns"], x["unique_prefix"], x["prompt_tokens"]["mean"], mean_completion)
        lines += [
            "", f"Not profiled here: `{x['path']}` ({x['read']} items, {x['trajectories']} trajectories, "
            f"{x['turns']:,} turns). Prompt tokens per turn (min / p50 / p90 / max): {fmt_p(x['prompt_tokens'])}; "
            f"{x['over_context']:,} turns in {x['trajectories_over_context']} trajectories are longer than the model's "
            f"{m['context']:,}-token context; unique prefix tokens {x['unique_prefix']:,}. On the GPU above: prefill "
            f"{gx['prefill_s']:.1f} s + decode {gx['decode_s']:.0f} s = about {hours(gx['total_s'])} (a model with a "
            "context that long assumed).",
        ]
    return lines


def report(results: list[dict], out: Path) -> None:
    from pivot_assets.core.hardware import describe_cpu

    lines = ["# Real data through profiling and selection (bench/bench_real_data.py)", "",
             f"CPU: {describe_cpu()}. The embedded SmolLM2-135M-Instruct after a short SFT warm-up on the dataset "
             "is the reference (`model: sft`): zero-shot it almost never writes a correct call, so it would profile "
             "every turn at 0 and select nothing. The warm-up trains on the trajectories outside the held-out split "
             "and profiling samples turns from all of them (limit_turns): on trained conversations, as in the demo.",
             "Timings are from a shared 2-core machine (other jobs running: see each load average).", "",
             "What the configs trade for a CPU: the SFT window (`sft.max_length` 1024) is shorter than every prompt here, "
             "so the warm-up learns each expert action from the last 1k tokens of its state, without the tool list at "
             "the start, while profiling shows the whole prompt; `limit_turns` takes turns by turn_id, which spreads "
             "them over many trajectories, so the profiled prompts share no prefix (prefill = unique, and each turn "
             "pays its whole prompt); the whole-dataset lines show what prefix reuse saves on a full run.", ""]
    for m in results:
        lines += section(m) + [""]
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_real_data.md"))
    ap.add_argument("--keep", default=None, help="work dir to keep (a folder per dataset); default: a temp dir")
    ap.add_argument("--report-only", action="store_true", help="no run: report from the warehouses in --keep DIR")
    ap.add_argument("--smoke", action="store_true", help=f"a tiny pass that checks the script: {SMOKE}")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="real-data-"))
    results = []
    for dataset in args.datasets.split(","):
        work = root / dataset
        if not args.report_only:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            run(dataset, work, args.smoke)
        results.append(measure(dataset, work))
        (work / "measured.json").write_text(json.dumps(results[-1], indent=1, default=str))
    report(results, Path(args.out))


if __name__ == "__main__":
    main()
