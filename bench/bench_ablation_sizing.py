"""Sizing the BFCL ablation from small timed pieces, into bench/RESULTS_ablation_bfcl_sizing.md.

    .venv/bin/python bench/bench_ablation_sizing.py [--config configs/ablation_bfcl.yaml] [--turns 16]
                                                    [--backends vllm,transformers]
                                                    [--out bench/RESULTS_ablation_bfcl_sizing.md]

BFCL single-turn items (the config's categories, from the bfcl-eval package) are rendered through the embedded
policy's chat template with their tools (ingest/bfcl.py's mapping), as profiling, GRPO and evaluation render
them. A short SFT warm-up on other items gives a policy that writes calls and stops, as the reference and the
arms do (the base model runs every sample to the token limit). Then, on those prompts, with the config's dtype
and one torch thread per process:
  - the warm-up / same-data SFT: seconds per step (sft.batch_size);
  - sampling (what profiling and evaluation run): seconds per turn at K = policy.k and at eval_k, with the warmed
    policy (and the base model once, which the ablation scores on one draw), at policy.batch_size rows per step;
  - GRPO: seconds per optimizer step (num_generations x max_completion_length; setup timed apart);
  - the OOD probe: seconds per item.
Each sampling piece runs on every engine in --backends (side by side, the same warmed policy and prompts); an
engine in its own processes (vLLM) also records its start, and evaluation on it scores one model at a time, so its
pieces are costed in wall seconds (run it on an idle box). Each piece records wall and CPU seconds: the machine is
shared, so CPU seconds (what a core spends on it) are the estimate's unit for what runs in this process. The
estimate multiplies them by the config's counts (the split computed exactly from the items' ids, pool sizes
from assumed D_adv / D_mixed shares): serial phases (warm-up, profiling) at one core, the arms and the evaluations
on runtime.workers cores at full speed each. CPU seconds measured beside other jobs run slower
than on an idle core, and two busy cores of this box give 1.5-1.6x one (bench/RESULTS_threads.md), which the
loaded measurement already pays: the estimate is an upper bound for an idle box. It also prints the largest pool
(at the config's held-out and warm-up sizes) that fits in --budget-min.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BFCL_DATA = ROOT / ".venv" / "lib" / "python3.11" / "site-packages" / "bfcl_eval" / "data"


def cpu_s() -> float:
    """CPU seconds of this process and its live children (vLLM's engine core runs in a spawned child)."""
    import psutil

    r = resource.getrusage(resource.RUSAGE_SELF)
    children = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            children += t.user + t.system
        except psutil.Error:  # gone between listing and reading
            pass
    return r.ru_utime + r.ru_stime + children


class timed:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), cpu_s()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, cpu_s() - self.cpu


def bfcl_items(categories: list[str]) -> list[dict]:
    """{id, category, messages, tools, action} per BFCL single-turn item (the first user turn); an item whose
    answer does not map (ingest quarantines it) is left out."""
    from pivot_assets.ingest.bfcl import BFCLError, bfcl_tools, expected_action

    items = []
    for cat in categories:
        answers = {}
        for line in (BFCL_DATA / "possible_answer" / f"BFCL_v4_{cat}.json").read_text().splitlines():
            row = json.loads(line)
            answers[row["id"]] = row["ground_truth"]
        for line in (BFCL_DATA / f"BFCL_v4_{cat}.json").read_text().splitlines():
            row = json.loads(line)
            if row["id"] not in answers:
                continue
            messages = [{"role": m["role"], "content": m["content"], "tool_calls": None, "tool_call_id": None}
                        for m in row["question"][0]]
            try:
                items.append({"id": row["id"], "category": cat, "messages": messages,
                              "tools": bfcl_tools(row["function"]), "action": expected_action(answers[row["id"]])})
            except BFCLError:
                continue
    return items


def action_message(action: dict) -> dict:
    calls = action["calls"] if action["type"] == "function_call_batch" else [action]
    return {"role": "assistant", "content": None, "tool_call_id": None,
            "tool_calls": [{"id": f"c{i}", "name": c["name"], "arguments": json.dumps(c["arguments"])}
                           for i, c in enumerate(calls)]}


def token_stats(items: list[dict], tokenizer) -> dict:
    from pivot_assets.training.sft import turn_example

    prompt, action = [], []
    for it in items:
        example, _ = turn_example(tokenizer, it["messages"] + [action_message(it["action"])], len(it["messages"]),
                                  it["tools"], 1 << 20)
        n_action = sum(1 for t in example["labels"] if t != -100)
        prompt.append(len(example["input_ids"]) - n_action)
        action.append(n_action)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    return {"n": len(items), "prompt_mean": sum(prompt) / len(prompt), "prompt_p90": q(prompt, 0.9),
            "action_mean": sum(action) / len(action), "action_p90": q(action, 0.9), "action_max": max(action)}


def time_sampling(cfg, model: str, items: list[dict], k: int, max_new_tokens: int) -> dict:
    from pivot_assets.policies.base import GenerationRequest, SamplingConfig
    from pivot_assets.policies.factory import build_backend, capabilities
    from pivot_assets.profiling.profiler import sample_seed

    with timed() as start:
        engine = build_backend(cfg.policy, model=model, threads=cfg.runtime.threads)
    requests = [GenerationRequest(it["id"], it["id"], len(it["messages"]), it["messages"], it["tools"]) for it in items]
    # per-row seeds where the engine takes them: the request shape profiling's adaptive rounds and evaluation send
    rows = ({it["id"]: [(i, sample_seed(1, i)) for i in range(k)] for it in items}
            if capabilities(cfg.policy.backend).per_row_seeds else None)
    with timed() as t:
        samples = [s for batch in engine.generate(requests, SamplingConfig(k=k, max_new_tokens=max_new_tokens, seed=1),
                                                  **({"rows": rows} if rows else {}))
                   for s in batch]
    reload_wall_s = None
    if capabilities(cfg.policy.backend).reloads_weights:  # evaluation's next model, loaded into this engine
        with timed() as reload:
            engine.load_model(model)
        reload_wall_s = reload.wall
    if hasattr(engine, "close"):
        engine.close()
    generated = sum(s.n_completion_tokens for s in samples)
    # an engine in its own processes runs one at a time (evaluation_workers): its wall seconds are what the run
    # spends on it (measure on an idle box)
    unit = t.wall if in_own_processes(cfg) else t.cpu
    return {"turns": len(items), "k": k, "wall_s": t.wall, "cpu_s": t.cpu, "generated_tokens": generated,
            "start_wall_s": start.wall, "reload_wall_s": reload_wall_s, "s_per_turn": unit / len(items),
            "length_share": sum(s.finish_reason == "length" for s in samples) / len(samples)}


def time_grpo(cfg, model: str, items: list[dict], steps: int) -> dict:
    from datasets import Dataset

    from pivot_assets.core.hardware import resolve_dtype
    from pivot_assets.training.grpo import run_grpo
    from pivot_assets.verifiers import DomainVerifiers

    data = Dataset.from_dict({
        "prompt": [it["messages"] for it in items], "tools": [json.dumps(it["tools"]) for it in items],
        "expert_action": [json.dumps(it["action"]) for it in items], "turn_id": [it["id"] for it in items],
        "trajectory_id": [it["id"] for it in items], "domain": ["bfcl"] * len(items)})
    options = cfg.training.model_copy(update={"steps": steps, "seed": 0})
    seconds: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, timed() as t:
        run = run_grpo(model, data, DomainVerifiers(cfg.verifier), options, Path(tmp) / "m", cpu_smoke=False,
                       precision=resolve_dtype(cfg.training.dtype, "cpu"), threads=1, held_out=set(),
                       on_step=lambda r: seconds.append(r["seconds"] or 0.0))
    per_step = [r["seconds"] for r in run.steps if r.get("seconds")]
    lengths = [r["completion_mean_length"] for r in run.steps if r.get("completion_mean_length")]
    return {"steps": steps, "wall_s": t.wall, "cpu_s": t.cpu, "s_per_step_wall": sum(per_step) / len(per_step),
            "setup_wall_s": t.wall - sum(per_step), "completion_mean_length": sum(lengths) / len(lengths) if lengths else None,
            "cpu_per_wall": t.cpu / t.wall}


def warm_up(cfg, items: list[dict], steps: int, out: Path) -> dict:
    """A short SFT warm-up of the embedded model on `items` (per turn, as the same-data SFT arm trains): the policy
    the other pieces sample from, and the seconds an SFT step takes."""
    from pivot_assets.core.hardware import resolve_dtype
    from pivot_assets.training.sft import train_same_data_sft

    turns = [{"turn_id": it["id"], "trajectory_id": it["id"], "message_index": len(it["messages"]),
              "messages": it["messages"] + [action_message(it["action"])], "tools": it["tools"]} for it in items]
    options = cfg.sft.model_copy(update={"steps": steps})
    with timed() as t:
        result = train_same_data_sft("embedded", turns, options, out, resolve_dtype(cfg.sft.dtype, "cpu"),
                                     lambda m: None, threads=1)
    per_step = sum(r["seconds"] for r in result["rows"]) / len(result["rows"])
    return {"steps": steps, "wall_s": t.wall, "cpu_s": t.cpu, "s_per_step_wall": per_step,
            "setup_wall_s": t.wall - per_step * steps, "cpu_per_wall": t.cpu / t.wall,
            "final_loss": result["rows"][-1]["loss"]}


def time_ood(cfg, model: str, n_items: int) -> dict:
    from pivot_assets.core.hardware import resolve_dtype
    from pivot_assets.evaluation.ood_probe import ood_accuracy, probe_items

    probe = probe_items(None, n_items)
    with timed() as t:
        ood_accuracy(model, probe, dtype=resolve_dtype(cfg.policy.dtype, "cpu").dtype)
    return {"items": len(probe), "wall_s": t.wall, "cpu_s": t.cpu}


def config_categories(path: Path) -> list[str]:
    """The BFCL categories of a config's `format: bfcl` inputs (BFCL_v4_<category>.json)."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    return [Path(spec["path"]).stem.removeprefix("BFCL_v4_") for spec in raw.get("inputs") or []
            if spec.get("format") == "bfcl"]


def split_sizes(cfg, ids: list[str]) -> dict[str, int]:
    """The exact split of the items (conversation_id = the BFCL item id)."""
    from collections import Counter

    from pivot_assets.core.split import ConversationSplit

    return dict(Counter(ConversationSplit.from_config(cfg).role(i) for i in ids))


def estimate(cfg, sizes: dict[str, int], m: dict, assumed: dict) -> list[tuple[str, float, str]]:
    """(phase, CPU seconds, how) of the whole run, from the measured pieces and the config's counts."""
    from pivot_assets.training.runs import prompts_per_step, steps_for_pool

    a = cfg.ablation
    held, warm, pool = sizes.get("held_out", 0), sizes.get("warmup", 0), sizes.get("pool", 0)
    adv, mixed = pool * assumed["adv_share"], pool * assumed["mixed_share"]
    seeds = len(a.seeds)
    grpo_step = m["grpo"]["s_per_step_wall"] * m["grpo"]["cpu_per_wall"]
    sft_step = m["sft"]["s_per_step_wall"] * m["sft"]["cpu_per_wall"] / cfg.sft.batch_size  # per example
    per_turn = lambda key: m["sampling"][key]["s_per_turn"]  # noqa: E731
    grpo_steps = {s: steps_for_pool(max(1, round(n)), prompts_per_step(cfg, "grpo"), a.epochs)
                  for s, n in (("adv", adv), ("cand", adv), ("mixed", mixed))}
    arms = {"grpo_adv": grpo_steps["adv"], "grpo_cand": grpo_steps["cand"], "grpo_mixed": grpo_steps["mixed"],
            "grpo_adv_exact": grpo_steps["adv"]}
    arms = {arm: n for arm, n in arms.items() if arm in a.arms}
    setup = 15.0 * (len(arms) + ("sft_same_data" in a.arms)) * seeds  # load + save a model per run (4-9 s + a save)
    sft_arm = steps_for_pool(max(1, round(adv)), 1, a.epochs) * sft_step * seeds if "sft_same_data" in a.arms else 0.0
    scorings = len(a.arms) * seeds + seeds  # arm/s on draw s, the reference on every draw
    models = len(a.arms) * seeds + 2
    probe = cfg.evaluation.ood_max_items or 424
    # an engine in its own process starts once for profiling; evaluation starts one more and loads each next model
    # into it where the engine reloads weights (EngineSlot), else starts one per model
    starts = m["sampling"]["eval"]["start_wall_s"] if in_own_processes(cfg) else 0.0
    reload = m["sampling"]["eval"].get("reload_wall_s")
    switches = (starts + (models - 1) * reload) if starts and reload is not None else models * starts
    return [
        ("SFT warm-up", cfg.sft.steps * cfg.sft.batch_size * sft_step, f"{cfg.sft.steps} steps x {cfg.sft.batch_size} "
                                                                       f"of the {warm} warm-up items"),
        ("profiling", (held + pool) * per_turn("profile") + starts, f"{held + pool} turns (pool {pool} + held out "
                                                                    f"{held}) x K={cfg.policy.k}, the warmed policy"
                                                                    + (", one engine start" if starts else "")),
        ("GRPO arms", sum(arms.values()) * grpo_step * seeds,
         f"{seeds} seeds x steps {arms} (D_adv ~{adv:.0f}, D_mixed ~{mixed:.0f} of the pool)"),
        ("same-data SFT arm", sft_arm, f"{seeds} seeds x one pass over D_adv's pool"),
        ("model load/save per arm run", setup, "~15 s per run"),
        ("evaluation", scorings * held * per_turn("eval") + held * per_turn("base") + switches
         + models * probe * m["ood"]["cpu_s"] / m["ood"]["items"],
         f"{scorings} (model, draw) scorings x {held} held-out turns x eval_k={cfg.evaluation.k} (the warmed policy's cost), "
         f"the base model on one draw, {models} models x {probe} probe items"
         + (f", one engine start of {starts:.0f} s and {models - 1} weight reloads of {reload:.1f} s, one model at a "
            "time" if starts and reload is not None else
            f", {models} engine starts of {starts:.0f} s, one model at a time" if starts else "")),
    ]


PARALLEL = {"GRPO arms", "same-data SFT arm", "model load/save per arm run", "evaluation"}


def in_own_processes(cfg) -> bool:
    """Whether the policy's engine runs in processes of its own (vLLM: evaluation then scores one model at a time,
    training/evaluation.evaluation_workers)."""
    from pivot_assets.policies.factory import capabilities

    return not capabilities(cfg.policy.backend).torch_in_process


def wall_s(phases: list[tuple[str, float, str]], workers: int, serial: set[str] = frozenset()) -> float:
    """Serial phases on one core, the parallel ones on `workers` cores (+ ~1 min of ingest, contracts, exports);
    `serial`: parallel phases that run one at a time here (evaluation on an engine in its own process)."""
    return 60.0 + sum(sec / (workers if p in PARALLEL - serial else 1) for p, sec, _ in phases)


def largest_fitting(part: str, cfg, sizes: dict[str, int], m: dict, args, workers: int, serial: set[str]) -> int:
    """The largest size of one part of the split ("pool" or "held_out"; the others kept) whose estimate fits in
    args.budget_min."""
    assumed = {"adv_share": args.adv_share, "mixed_share": args.mixed_share}
    n = 0
    while n < 5000 and wall_s(estimate(cfg, {**sizes, part: n + 1}, m, assumed), workers,
                              serial) <= args.budget_min * 60:
        n += 1
    return n


def engine_estimate(cfg, sizes: dict, measured: dict, args) -> dict:
    """One engine's estimate: its phases, wall minutes, the largest pool that fits and the run without training."""
    phases = estimate(cfg, sizes, measured, {"adv_share": args.adv_share, "mixed_share": args.mixed_share})
    workers = min(2, cfg.runtime.workers if cfg.runtime.workers != "auto" else 2)
    serial = {"evaluation"} if in_own_processes(cfg) else set()
    return {"phases": phases, "workers": workers, "wall": wall_s(phases, workers, serial),
            "fits": largest_fitting("pool", cfg, sizes, measured, args, workers, serial),
            "held_fits": largest_fitting("held_out", cfg, sizes, measured, args, workers, serial),
            "floor": wall_s([p for p in phases if p[0] in ("SFT warm-up", "profiling", "evaluation")], workers, serial)}


def main() -> None:
    from pivot_assets.core.config import load_config
    from pivot_assets.core.hardware import configure_torch, describe_cpu, native_bf16
    from pivot_assets.policies.models import load_tokenizer

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "ablation_bfcl.yaml"))
    ap.add_argument("--categories", default=None, help="BFCL categories (default: the config's bfcl inputs)")
    ap.add_argument("--warmup-steps", type=int, default=24, help="SFT steps of the warmed policy the pieces sample")
    ap.add_argument("--turns", type=int, default=16, help="turns per timed sampling piece")
    ap.add_argument("--grpo-steps", type=int, default=4)
    ap.add_argument("--adv-share", type=float, default=0.25, help="assumed share of pool turns in D_adv")
    ap.add_argument("--mixed-share", type=float, default=0.45, help="assumed share of pool turns in D_mixed")
    ap.add_argument("--budget-min", type=float, default=150.0)
    ap.add_argument("--backends", default=None, help="sampling engines timed side by side, comma-separated "
                                                      "(default: the config's policy.backend)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "RESULTS_ablation_bfcl_sizing.md"))
    args = ap.parse_args()
    configure_torch(1)
    cfg = load_config(args.config, overrides={"inputs": None})  # the BFCL input is not needed to time the pieces
    engines = {b: load_config(args.config, overrides={"inputs": None, "policy": {"backend": b}})
               for b in (args.backends.split(",") if args.backends else [cfg.policy.backend])}
    load_start = os.getloadavg()
    args.categories = args.categories or ",".join(config_categories(Path(args.config)))
    items = bfcl_items(args.categories.split(","))
    sizes = split_sizes(cfg, [it["id"] for it in items])
    tokenizer = load_tokenizer("embedded")
    stats = {cat: token_stats([it for it in items if it["category"] == cat], tokenizer)
             for cat in args.categories.split(",")}
    # every category in turn: one timed piece covers the prompt lengths the run sees; the warm-up takes other items
    step = max(1, len(items) // args.turns)
    sample = [items[i] for i in range(0, len(items), step)][: args.turns]
    others = [it for i, it in enumerate(items) if i % step][: args.warmup_steps * cfg.sft.batch_size]
    measured: dict = {}
    sampling: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        warmed = str(Path(tmp) / "warmed")
        measured["sft"] = warm_up(cfg, others, args.warmup_steps, Path(warmed))
        length = cfg.training.max_completion_length
        for backend, ecfg in engines.items():
            sampling[backend] = {
                "profile": time_sampling(ecfg, warmed, sample, cfg.policy.k, length),
                "eval": time_sampling(ecfg, warmed, sample, cfg.evaluation.k, length),
                "base": time_sampling(ecfg, "embedded", sample, cfg.evaluation.k, length)}
        measured["grpo"] = time_grpo(cfg, warmed, sample[:8], args.grpo_steps)
        measured["ood"] = time_ood(cfg, warmed, 48)
    load_end = os.getloadavg()
    results = {b: engine_estimate(ecfg, sizes, {**measured, "sampling": sampling[b]}, args) for b, ecfg in engines.items()}
    native, why = native_bf16("cpu")
    rel = Path(args.config).resolve()
    lines = [
        "# Sizing the BFCL ablation (bench/bench_ablation_sizing.py)", "",
        f"Date: {time.strftime('%Y-%m-%d')}. Command: `.venv/bin/python bench/bench_ablation_sizing.py"
        + (f" --backends {args.backends}" if args.backends else "") + "`.", "",
        f"Config: `{rel.relative_to(ROOT) if rel.is_relative_to(ROOT) else rel}`; sampling engines: "
        f"{', '.join(engines)}; CPU: {describe_cpu()}; native bf16: {native} ({why}); one torch thread per process.",
        f"Load average at start {load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f}, at end "
        f"{load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f}. Units: CPU seconds for what runs in this "
        "process (the transformers backend, SFT, GRPO: runtime.workers of them at once); wall seconds for an engine "
        "in its own processes (vLLM: one at a time, its engine core and this process both busy).", "",
        f"BFCL items: {len(items)} ({args.categories}); split (conversation = item): {sizes.get('held_out', 0)} held "
        f"out ({cfg.training.eval_fraction}), {sizes.get('warmup', 0)} warm-up ({cfg.training.warmup_fraction}), "
        f"{sizes.get('pool', 0)} pool.", "",
        "## Prompt and action lengths (tokens, the embedded template with tools)", "",
        "| category | items | prompt mean | prompt p90 | expert action mean | p90 | max |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {c} | {s['n']} | {s['prompt_mean']:.0f} | {s['prompt_p90']} | {s['action_mean']:.0f} | "
              f"{s['action_p90']} | {s['action_max']} |" for c, s in stats.items()]
    lines += ["", "## Timed pieces", "", "| piece | engine | what | wall s | CPU s | per unit | engine start (wall) |",
              "|---|---|---|---|---|---|---|"]
    for backend in engines:
        unit = "wall" if in_own_processes(engines[backend]) else "CPU"
        for name, key, who in (("profiling sampling", "profile", "warmed"), ("evaluation sampling", "eval", "warmed"),
                               ("evaluation sampling", "base", "base model")):
            r = sampling[backend][key]
            lines.append(f"| {name} ({who}) | {backend} | {r['turns']} turns x K={r['k']}, <= "
                         f"{cfg.training.max_completion_length} new tokens ({r['generated_tokens']} generated, "
                         f"{r['length_share']:.0%} hit the limit), {cfg.policy.batch_size} rows a step | "
                         f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['s_per_turn']:.2f} s/turn ({unit}) | "
                         f"{r['start_wall_s']:.0f} s |")
    g, s, o = measured["grpo"], measured["sft"], measured["ood"]
    lines += [f"| SFT warm-up (per turn) | torch | {s['steps']} steps x batch {cfg.sft.batch_size} (final loss "
              f"{s['final_loss']:.3f}) | {s['wall_s']:.1f} | {s['cpu_s']:.1f} | "
              f"{s['s_per_step_wall'] * s['cpu_per_wall']:.2f} s/step (CPU) | setup {s['setup_wall_s']:.0f} s |",
              f"| GRPO (warmed) | TRL | {g['steps']} steps x {cfg.training.num_generations} completions <= "
              f"{cfg.training.max_completion_length} tokens (mean {g['completion_mean_length'] or 0:.0f}) | "
              f"{g['wall_s']:.1f} | {g['cpu_s']:.1f} | {g['s_per_step_wall'] * g['cpu_per_wall']:.2f} s/step (CPU) | "
              f"setup {g['setup_wall_s']:.0f} s |",
              f"| OOD probe (warmed) | torch | {o['items']} items, greedy | {o['wall_s']:.1f} | {o['cpu_s']:.1f} | "
              f"{o['cpu_s'] / o['items']:.2f} s/item (CPU) | |"]
    names = list(engines)
    lines += ["", f"## Estimate (assumed: D_adv {args.adv_share:.0%}, D_mixed {args.mixed_share:.0%} of the pool)", "",
              "| phase | " + " | ".join(f"min ({b})" for b in names) + " | how |", "|---|" + "---|" * len(names) + "---|"]
    for i, (phase, _, _) in enumerate(results[names[0]]["phases"]):
        lines.append(f"| {phase} | " + " | ".join(f"{results[b]['phases'][i][1] / 60:.1f}" for b in names)
                     + f" | {results[names[0]]['phases'][i][2]} |")
    lines.append("")
    for b in names:
        r = results[b]
        total = sum(sec for _, sec, _ in r["phases"])
        lines.append(f"**{b}: {total / 60:.0f} min of core time; with runtime.workers {r['workers']} "
                     f"({'arms 2 at a time, evaluations one engine at a time' if in_own_processes(engines[b]) else 'arms and evaluations 2 at a time'}, "
                     f"the rest on one core) about {r['wall'] / 60:.0f} min wall on an idle 2-core box.** The largest "
                     f"pool that fits in {args.budget_min:.0f} min at this held-out and warm-up size: {r['fits']} items "
                     f"(the config's: {sizes.get('pool', 0)}); the most held-out items that fit at the config's pool: "
                     f"{r['held_fits']} (the config's: {sizes.get('held_out', 0)}). Without any training (the warm-up, profiling and the "
                     f"evaluation alone): {r['floor'] / 60:.0f} min.")
        lines.append("")
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
