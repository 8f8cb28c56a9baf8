"""The decisive comparison: GRPO on D_adv against GRPO on D_cand at equal GRPO compute, run in resumable
units, reported from the unit files alone. The design is written before the run by bench/decisive_design.py.

    .venv/bin/python bench/decisive.py --config configs/decisive_bfcl.yaml            # run (or resume) every unit
    .venv/bin/python bench/decisive.py --config configs/decisive_bfcl.yaml --report   # the report from the unit files

Phases (thin over the library: pivot run, training/ablation.train_arm, training/evaluation.local_accuracy and its
hierarchical bootstrap):
  (a) prepare: `pivot run --select '*pivots_adv'` (ingest, the SFT warm-up = the reference, profiling, the pivot
      sets) into the work dir (--work: warehouse + Dagster home); its wall time goes to <data>/prepare.json.
  (b) one unit per (arm, seed): train_arm (the ablation's: the arm's pool, D_cand drawn per seed, ablation.epochs passes), its
      per-step curve (step, reward mean, frac_reward_zero_std, useful, loss, tokens, seconds) and run row (pool,
      steps, useful share, D_cand overlap, train seconds) -> <data>/train_<arm>_s<seed>.parquet.
  (c) one unit per (model, draw): the reference and each arm's seed-d model on evaluation draw d (the ablation's
      draws: heldout.eval_seed(cfg, d), per-sample seeds shared by every model), every held-out profiled item x eval_k
      samples -> <data>/eval_<model>_d<draw>.parquet (turn, conversation, sample, reward, in_mixed, in_adv).

An arm's model is evaluated by the same job that trained it, right after (its train unit written first), so no
trained model waits in a work dir that a new machine will not have. Each unit file is written atomically (a temp
file renamed), as soon as its unit finishes, and a unit whose file exists is never computed again: rerun the same
command after a kill, or on a new machine with the data dir and the config. Phase (a) runs only when a unit is
missing. An evaluation whose model the work dir lacks trains the model again first; that second run's curve goes to
<data>/retrain_<arm>_s<seed>.parquet (its train unit stays as it is) and the report shows both. The runner ends with
one line `decisive: computed N unit(s) (train T, eval E); M already present`.

The config is a pivot config with one section of its own, `decisive:` (stripped before pivot reads the config):
    decisive: {learning_rate: null, data: bench/data/decisive_bfcl, results: bench/RESULTS_decisive_bfcl.md,
               curves: bench/RESULTS_decisive_bfcl_curves.png, half_width: 0.058}
`learning_rate` (GRPO's, both arms) must be set before phase (b) runs: it is chosen by a short sweep on a separate
slice; null stops the run after phase (a) with one line. Relative paths are relative to the repository root.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REFERENCE = "reference"
PREPARE_SELECTION = "*pivots_adv"  # ingest .. the pivot sets, with the warm-up the profiling policy needs
RESULTS_MARK = "\n## Results"
SWEEP_MARK = "\n## Learning-rate sweep"
SWEEP = "sweep"  # decisive.learning_rate: sweep = the sweep's choice, computed from its unit files
SWEEP_DEFAULTS = {
    "learning_rates": [1.0e-5, 3.0e-5, 1.0e-4, 3.0e-4],  # GRPO learning rates tried, each one run of grpo_adv
    "seed": 100,        # the sweep runs' seed and evaluation draw: apart from the run's seeds 0, 1, 2
    "epochs": 0.4,      # passes over D_adv's pool per sweep run (the run itself makes ablation.epochs)
    "items": 80,        # the sweep slice: pool turns outside D_adv (never the held-out items), this many
    "eval_k": 4,        # samples per sweep-slice item
    "tie": 0.02,        # accuracies within this of the best count as a tie: the smallest such rate is chosen
}
SFT_SWEEP_DEFAULTS = {
    "learning_rates": [],  # sft_same_data's rates tried on the sweep slice (empty: ablation.sft_learning_rate)
    "epochs": None,        # passes over D_adv's pool per rate; null: ablation.epochs (the run's own budget)
}
# Phase (a)'s environment: what makes its outputs (the block) equal on every x86 CPU these runs meet. oneMKL honours
# its reproducibility branch on AMD CPUs only as COMPATIBLE (AVX2 and AVX512 read back as AUTO there); ATen's and
# oneDNN's kernels are pinned to the AVX2 code paths both vendors have; one thread orders every reduction.
PINNED_ENV = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
              "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PIVOT_TORCH_DETERMINISTIC": "1"}
# Every Python process of phase (a) imports this first (PYTHONPATH): torch's deterministic algorithms, float32 matmuls
SITE_CUSTOMIZE = """import os
if os.environ.get("PIVOT_TORCH_DETERMINISTIC") == "1":
    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_float32_matmul_precision("highest")
"""


# -- config ------------------------------------------------------------------------------------------
def read_raw(config: Path) -> tuple[dict, dict]:
    """(the pivot config without `decisive:`, the `decisive:` section with its defaults)."""
    import yaml

    raw = yaml.safe_load(config.read_text()) or {}
    section = dict(raw.pop("decisive", None) or {})
    stem = config.stem
    section.setdefault("learning_rate", None)
    section.setdefault("data", f"bench/data/{stem}")
    section.setdefault("results", f"bench/RESULTS_{stem}.md")
    section.setdefault("curves", f"bench/RESULTS_{stem}_curves.png")
    section.setdefault("half_width", None)
    section["sweep"] = {**SWEEP_DEFAULTS, **(section.get("sweep") or {})}
    section["sft_sweep"] = {**SFT_SWEEP_DEFAULTS, **(section.get("sft_sweep") or {})}
    section.setdefault("ood", False)  # true: every model of the run also answers the OOD probe (ood_<model>_d<draw>)
    section.setdefault("pinned", True)  # phase (a) in PINNED_ENV
    section.setdefault("table", None)  # a companion config whose units join this run's in the paper's table
    section.setdefault("paper_table", bool(section["table"]))  # the paper's table from this run (and `table`'s)
    if section["learning_rate"] not in (None, SWEEP):
        raw.setdefault("training", {})["learning_rate"] = float(section["learning_rate"])
    return raw, section


def repo_path(value: str | None, base: Path = ROOT) -> Path | None:
    if value is None:
        return None
    p = Path(value)
    return p if p.is_absolute() else base / p


def write_work_config(config: Path, raw: dict, work: Path) -> Path:
    """The config pivot runs (bench_ablation.work_config's rules): `decisive:` stripped, the warehouse in the work
    dir, the inputs' and the probe's relative paths made absolute against the config's directory."""
    import copy

    import yaml

    fixed = copy.deepcopy(raw)
    fixed["warehouse"] = str(work / "warehouse")
    base = config.resolve().parent
    for spec in fixed.get("inputs") or []:
        for key in ("path", "tools"):
            if spec.get(key) and not Path(spec[key]).is_absolute():
                spec[key] = str((base / spec[key]).resolve())
    probe = (fixed.get("evaluation") or {}).get("ood_probe")
    if probe and not Path(probe).is_absolute():
        fixed["evaluation"]["ood_probe"] = str((base / probe).resolve())
    work.mkdir(parents=True, exist_ok=True)
    out = work / "pivot.yaml"
    out.write_text(yaml.safe_dump(fixed, sort_keys=False))
    return out


def load_cfg(path: Path):
    from pivot_assets.core.config import load_config

    return load_config(path)


# -- units -------------------------------------------------------------------------------------------
def train_name(arm: str, seed: int) -> str:
    return f"train_{arm}_s{seed}.parquet"


def eval_name(model: str, draw: int) -> str:
    return f"eval_{model}_d{draw}.parquet"


def ood_name(model: str, draw: int) -> str:
    return f"ood_{model}_d{draw}.parquet"


def unit_plan(arms: list[str], seeds: list[int]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    return ([(a, s) for s in seeds for a in arms], [(m, d) for d in seeds for m in (REFERENCE, *arms)])


def write_parquet_atomic(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp, compression="zstd")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json_atomic(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def arm_learning_rate(cfg, arm: str) -> float:
    """The rate an arm trained at: same-data SFT's own (ablation.sft_learning_rate, else sft's), GRPO's otherwise."""
    if arm == SFT_ARM:
        return cfg.ablation.sft_learning_rate or cfg.sft.learning_rate
    return cfg.training.learning_rate


def _train_unit_job(root: str, cfg, arm: str, seed: int, out: str | None, block: str | None = None) -> dict:
    """train_arm in a worker (training/ablation._train_arm_job); writes the unit file when `out` is given."""
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.evaluation.ablation import _train_arm_job
    from pivot_assets.training.runs import arm_dir

    t0 = time.time()
    run = _train_arm_job(root, cfg, arm, seed)
    if out is not None:
        steps = json.loads((Warehouse(root).model_dir(arm_dir(arm, seed)) / "ablation_steps.json").read_text())
        const = {"arm": arm, "seed": seed, "pool": run["pool"], "steps_total": run["steps"],
                 "turns_trained": run["turns_trained"], "useful_share": run["useful_share"],
                 "cand_overlap_adv": run["cand_overlap_adv"], "train_s": run["train_s"],
                 "learning_rate": arm_learning_rate(cfg, arm), "num_generations": cfg.training.num_generations,
                 "key": run["key"], "host": socket.gethostname(), "machine": machine(),
                 "finished_at": time.time(),
                 "unit_wall_s": round(time.time() - t0, 1), "retrained_from_cache": bool(run.get("skipped")),
                 "block": block, "turn_ids_trained": run.get("turn_ids_trained")}
        rows = [{"step": int(r["step"]), "reward_mean": r.get("reward_mean"),
                 "frac_reward_zero_std": r.get("frac_reward_zero_std"),
                 "useful": (None if r.get("frac_reward_zero_std") is None else 1.0 - r["frac_reward_zero_std"]),
                 "loss": r.get("loss"), "num_tokens": r.get("num_tokens"), "seconds": r.get("seconds"), **const}
                for r in steps] or [{"step": 0, "reward_mean": None, "frac_reward_zero_std": None, "useful": None,
                                     "loss": None, "num_tokens": None, "seconds": None, **const}]
        write_parquet_atomic(rows, Path(out))
    return run


def eval_rows_and_sets(wh, cfg) -> tuple[list[dict], dict[str, str], dict[str, set]]:
    """The held-out rows of the primary set, {turn: conversation}, and the secondary sets' members."""
    from pivot_assets.evaluation.heldout import evaluation_sets, turn_conversations, turn_rows

    sets = evaluation_sets(wh, cfg)
    primary = cfg.ablation.primary if cfg.ablation else "profiled"
    ids = sets[primary]
    return turn_rows(wh, ids), turn_conversations(wh, ids), {k: set(v) for k, v in sets.items()}


def model_path(wh, cfg, model: str, draw: int) -> str:
    from pivot_assets.training.runs import arm_dir, reference_model

    return reference_model(wh, cfg) if model == REFERENCE else str(wh.model_dir(arm_dir(model, draw)))


def _eval_unit_job(root: str, cfg, model: str, draw: int, rows: list[dict], groups: dict, sets: dict, out: str,
                   block: str | None = None) -> int:
    """local_accuracy of one model on one draw (the ablation's draw seeds and engine), per sample -> the unit file."""
    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.evaluation.heldout import evaluation_engine, local_accuracy
    from pivot_assets.evaluation.heldout import eval_seed
    from pivot_assets.training.runs import model_fingerprint
    from pivot_assets.verifiers import VerifierSets

    configure_torch(cfg.runtime.threads)
    wh = Warehouse(root)
    path = model_path(wh, cfg, model, draw)
    engine = evaluation_engine(cfg)
    t0 = time.time()
    result = local_accuracy(path, rows, VerifierSets.from_config(cfg).profiling, k=cfg.evaluation.k,
                            max_new_tokens=cfg.training.max_completion_length, seed=eval_seed(cfg, draw),
                            temperature=engine.temperature, top_p=engine.top_p, policy=engine)
    seconds = round(time.time() - t0, 1)
    const = {"model": model, "draw": draw, "model_fp": model_fingerprint(path, cfg), "eval_k": cfg.evaluation.k,
             "eval_seed": eval_seed(cfg, draw), "backend": engine.backend, "seconds": seconds,
             "generated_tokens": result.get("generated_tokens"), "host": socket.gethostname(),
             "machine": machine(), "finished_at": time.time(), "block": block}
    out_rows = [{"turn_id": t["turn_id"], "conversation_id": groups.get(t["turn_id"], t["turn_id"]), "sample": i,
                 "reward": float(r), "in_mixed": t["turn_id"] in sets.get("mixed", ()),
                 "in_adv": t["turn_id"] in sets.get("adv", ()), **const}
                for t in result["per_turn"] for i, r in enumerate(t["rewards"])]
    write_parquet_atomic(out_rows, Path(out))
    return len(out_rows)


def _ood_unit_job(root: str, cfg, model: str, draw: int, out: str, block: str | None = None) -> int:
    """The OOD probe (every item, greedy: evaluation/ood_probe.ood_accuracy) for one model -> the unit file, one row
    per item (its family, its answer, the completion, correct)."""
    from pivot_assets.core import hardware
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.evaluation.heldout import evaluation_engine
    from pivot_assets.evaluation.ood_probe import (
        CATEGORY_MATCH,
        FAMILY,
        ood_accuracy,
        probe_items,
    )
    from pivot_assets.policies.models import PromptFormat
    from pivot_assets.training.runs import model_fingerprint

    hardware.configure_torch(cfg.runtime.threads)
    path = model_path(Warehouse(root), cfg, model, draw)
    items = probe_items(cfg.evaluation.ood_probe, cfg.evaluation.ood_max_items)
    engine, details = evaluation_engine(cfg), []
    t0 = time.time()
    ood_accuracy(path, items, seed=cfg.evaluation.seed, dtype=hardware.policy_precision(engine).dtype,
                 device=engine.device, details=details, fmt=PromptFormat.from_policy(engine))  # as pivot_eval's
    const = {"model": model, "draw": draw, "model_fp": model_fingerprint(path, cfg), "seconds": round(time.time() - t0, 1),
             "host": socket.gethostname(), "machine": machine(), "finished_at": time.time(), "block": block}
    rows = [{"item": i, "kind": d["kind"], "family": FAMILY.get(d["kind"], d["kind"]),
             "match": CATEGORY_MATCH[d["kind"]], "prompt": d["prompt"], "answer": d["answer"],
             "completion": d["completion"], "reward": float(d["correct"]), **const} for i, d in enumerate(details)]
    write_parquet_atomic(rows, Path(out))
    return len(rows)


SUPERSEDED = "superseded"  # <data>/superseded/: units of a seed left incomplete by another phase (a)


def block_id(wh, cfg) -> str:
    """What every unit of one seed must share: the reference's weights, the pivot sets and the held-out split
    (phase (a)'s outputs). Phase (a) on another machine or in another precision gives another block. The pivot
    sets count by their members (turn ids), not their files' bytes: a later version of the code that writes the same
    sets with another column keeps the block, so a run resumed in a later checkout keeps its seeds."""
    from pivot_assets.core.identity import fingerprint
    from pivot_assets.core.split import ConversationSplit
    from pivot_assets.training.runs import model_fingerprint, reference_model

    return fingerprint({"reference": model_fingerprint(reference_model(wh, cfg), cfg),
                        "adv": set_members(wh, "pivots_adv"), "cand": set_members(wh, "pivots_cand"),
                        "split": ConversationSplit.from_config(cfg).fingerprint(wh)})[:16]


def set_members(wh, table: str) -> str:
    from pivot_assets.core.identity import fingerprint

    return fingerprint(sorted(wh.read_arrow(table, ["turn_id"]).column("turn_id").to_pylist()))


def unit_block(path: Path) -> str | None:
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    return pq.read_table(path, columns=["block"]).column("block")[0].as_py() if "block" in names else None


def supersede_other_blocks(data: Path, seeds: list[int], arms: list[str], block: str, ood: bool = False) -> list[str]:
    """A seed's units are compared with each other (adv - cand on its draw, against its reference), so they must
    come from one phase (a): the units of a seed that is not complete and that another block wrote (or that
    predate blocks) move to <data>/superseded/ and are computed again. A complete seed is kept whatever its block."""
    moved = []
    for seed in seeds:
        names = [train_name(a, seed) for a in arms] + [eval_name(m, seed) for m in (REFERENCE, *arms)]
        names += [ood_name(m, seed) for m in (REFERENCE, *arms)] if ood else []
        names += [retrain_name(a, seed) for a in arms]
        present = [n for n in names if (data / n).is_file()]
        if all((data / n).is_file() for n in names if not n.startswith("retrain_")):
            continue
        for name in present:
            if unit_block(data / name) != block:
                (data / SUPERSEDED).mkdir(exist_ok=True)
                os.replace(data / name, data / SUPERSEDED / name)
                moved.append(name)
    return moved


def retrain_name(arm: str, seed: int) -> str:
    return f"retrain_{arm}_s{seed}.parquet"


def unit_tasks(train_units, eval_units, missing_train, missing_eval, data: Path, has_model,
               missing_ood=()) -> list[dict]:
    """The jobs for the missing units, seed by seed (so that a slice of the run completes whole seeds): train (and
    evaluate, when its evaluation is missing) each arm whose train unit is missing or whose model an evaluation needs
    and the work dir lacks; evaluate the arms' models that are there; then the seed's reference evaluation. An
    evaluation is the held-out one (eval_out) and, where missing_ood names the unit, the OOD probe (ood_out)."""
    tasks = []
    for seed in dict.fromkeys(s for _, s in [*train_units, *eval_units]):
        for a, s in [u for u in train_units if u[1] == seed]:
            outs = {"eval_out": str(data / eval_name(a, s)) if (a, s) in missing_eval else None,
                    "ood_out": str(data / ood_name(a, s)) if (a, s) in missing_ood else None}
            needs_model = any(outs.values())
            if (a, s) in missing_train or (needs_model and not has_model(a, s)):
                name = train_name(a, s) if (a, s) in missing_train else retrain_name(a, s)
                tasks.append({"model": a, "seed": s, "train_out": str(data / name), **outs})
            elif needs_model:
                tasks.append({"model": a, "seed": s, "train_out": None, **outs})
        outs = {"eval_out": str(data / eval_name(REFERENCE, seed)) if (REFERENCE, seed) in missing_eval else None,
                "ood_out": str(data / ood_name(REFERENCE, seed)) if (REFERENCE, seed) in missing_ood else None}
        if any(outs.values()):
            tasks.append({"model": REFERENCE, "seed": seed, "train_out": None, **outs})
    return tasks


def _unit_job(root: str, cfg, task: dict, rows: list[dict], groups: dict, sets: dict) -> dict:
    """One job in a worker: train the arm (its unit file written at once), then evaluate its model."""
    result = {}
    if task["train_out"]:
        result["train"] = _train_unit_job(root, cfg, task["model"], task["seed"], task["train_out"], task["block"])
    if task["eval_out"]:
        result["eval"] = _eval_unit_job(root, cfg, task["model"], task["seed"], rows, groups, sets, task["eval_out"],
                                        task["block"])
    if task.get("ood_out"):
        result["ood"] = _ood_unit_job(root, cfg, task["model"], task["seed"], task["ood_out"], task["block"])
    return result


def _pool(workers: int) -> cf.ProcessPoolExecutor:
    from pivot_assets.core.parallel import _die_with_parent

    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_die_with_parent)


def run_jobs_as_done(fn, jobs: list[tuple], workers: int, on_done) -> None:
    """fn(*job) for every job, `workers` at a time in spawned processes (here when 1); on_done(job, result) as each
    finishes (so a kill loses only the units running)."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            on_done(job, fn(*job))
        return
    pool = _pool(min(workers, len(jobs)))
    try:
        futures = {pool.submit(fn, *job): job for job in jobs}
        for f in cf.as_completed(futures):
            on_done(futures[f], f.result())
    except BaseException:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            if proc.is_alive():
                proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def machine() -> str:
    """The CPU a unit ran on (model, cores, bf16 flags): hostnames of lent machines say nothing."""
    from pivot_assets.core.hardware import describe_cpu

    return describe_cpu()


def log(message: str) -> None:
    print(f"[decisive] {message}", file=sys.stderr, flush=True)


def pinned_env(work: Path, base: dict) -> dict:
    """`base` with PINNED_ENV, and SITE_CUSTOMIZE (written under the work dir) first on PYTHONPATH."""
    site = work / "pinned_site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE_CUSTOMIZE)
    path = os.pathsep.join(p for p in (str(site), base.get("PYTHONPATH", "")) if p)
    return {**base, **PINNED_ENV, "PYTHONPATH": path}


def precisions(raw: dict) -> dict:
    """The dtypes phase (a) ran in (the warm-up's and the profiling policy's), as prepare.json records them."""
    return {"sft": (raw.get("sft") or {}).get("dtype", "auto"), "policy": (raw.get("policy") or {}).get("dtype", "auto")}


def prepare(config: Path, raw: dict, work: Path, data: Path, pinned: bool = True) -> tuple[Path, str]:
    """Phase (a): pivot run up to the pivot sets (cached in the work dir's warehouse when already there); returns the
    work config and the block of its outputs (block_id, recorded in prepare.json with the CPU and the pinned
    settings, so that two CPU kinds' blocks can be compared)."""
    cfg_path = write_work_config(config, raw, work)
    env = {**os.environ, "DAGSTER_HOME": str(work / "dagster_home"), "HF_HUB_OFFLINE": "1"}
    env = pinned_env(work, env) if pinned else env
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    pivot = Path(sys.executable).parent / "pivot"
    t0 = time.time()
    log(f"phase (a): pivot run --select '{PREPARE_SELECTION}' in {work}")
    proc = subprocess.run([str(pivot), "run", "--config", str(cfg_path), "--select", PREPARE_SELECTION], env=env,
                          capture_output=True, text=True)
    (work / "prepare.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-3000:])
        raise SystemExit(f"decisive: phase (a) failed (rc {proc.returncode}); log: {work / 'prepare.log'}")
    wall = round(time.time() - t0, 1)
    from pivot_assets.core.warehouse import Warehouse

    cfg = load_cfg(cfg_path)
    block = block_id(Warehouse(cfg.warehouse), cfg)
    record = json.loads((data / "prepare.json").read_text()) if (data / "prepare.json").is_file() else {"runs": []}
    import torch

    record["runs"].append({"wall_s": wall, "host": socket.gethostname(), "machine": machine(),
                           "finished_at": time.time(), "block": block, "torch": torch.__version__,
                           "pinned": ({k: env[k] for k in PINNED_ENV} if pinned else None),
                           "deterministic_algorithms": pinned, "dtype": precisions(raw)})
    write_json_atomic(record, data / "prepare.json")
    log(f"phase (a): {wall:.0f} s")
    return cfg_path, block


def run(config: Path, work: Path, data: Path, workers: int | None) -> dict:
    raw, section = read_raw(config)
    arms, seeds = list(raw["ablation"]["arms"]), [int(s) for s in raw["ablation"]["seeds"]]
    train_units, eval_units = unit_plan(arms, seeds)
    ood_units = eval_units if section["ood"] else []
    missing_train = [u for u in train_units if not (data / train_name(*u)).is_file()]
    missing_eval = [u for u in eval_units if not (data / eval_name(*u)).is_file()]
    missing_ood = [u for u in ood_units if not (data / ood_name(*u)).is_file()]
    present = (len(train_units) + len(eval_units) + len(ood_units) - len(missing_train) - len(missing_eval)
               - len(missing_ood))
    computed = {"train": 0, "eval": 0}
    if not missing_train and not missing_eval and not missing_ood:
        print(f"decisive: computed 0 unit(s) (train 0, eval 0); {present} already present", flush=True)
        return computed
    data.mkdir(parents=True, exist_ok=True)
    cfg_path, block = prepare(config, raw, work, data, section["pinned"])
    cfg = load_cfg(cfg_path)
    from pivot_assets.core.parallel import resolve_workers
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.training.runs import arm_dir, read_marker

    wh = Warehouse(cfg.warehouse)
    # a model lives only in the work dir: it is evaluated by the job that trained it, so a machine change never
    # strands a trained model without its evaluation; one whose evaluation is missing and whose model the work dir
    # lacks (a new machine) is trained again, its curve kept apart (retrain_<arm>_s<seed>), its train unit as it is
    moved = supersede_other_blocks(data, seeds, arms, block, bool(section["ood"]))
    if moved:
        log(f"{len(moved)} unit(s) of incomplete seeds came from another phase (a) (another machine or precision): "
            f"moved to {data / SUPERSEDED} and computed again ({', '.join(moved)})")
        missing_train = [u for u in train_units if not (data / train_name(*u)).is_file()]
        missing_eval = [u for u in eval_units if not (data / eval_name(*u)).is_file()]
        missing_ood = [u for u in ood_units if not (data / ood_name(*u)).is_file()]
        present -= len(moved)
    rows, groups, sets = eval_rows_and_sets(wh, cfg) if missing_eval else ([], {}, {})
    if missing_eval and not rows:
        raise SystemExit("decisive: no held-out profiled turn to evaluate")
    tasks = unit_tasks(train_units, eval_units, missing_train, missing_eval, data,
                       lambda a, s: read_marker(wh.model_dir(arm_dir(a, s))) is not None, missing_ood)
    trains = [t for t in tasks if t["train_out"]]
    if trains and section["learning_rate"] is None:
        raise SystemExit("decisive: decisive.learning_rate is null: set a rate, or `sweep` to choose it by the "
                         f"learning-rate sweep, in {config} before phase (b) (phase (a) is done: {work})")
    if trains and section["learning_rate"] == SWEEP:
        lr = run_sweep(wh, cfg, section["sweep"], data, workers)["chosen"]
        cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"learning_rate": lr})})
        log(f"learning rate {lr:g}, the sweep's choice")
    if (any(t["model"] == SFT_ARM for t in trains) and cfg.ablation.sft_learning_rate is None
            and section["sft_sweep"]["learning_rates"]):
        lr = run_sweep(wh, cfg, section["sweep"], data, workers, SFT_ARM, section["sft_sweep"])["chosen"]
        cfg = cfg.model_copy(update={"ablation": cfg.ablation.model_copy(update={"sft_learning_rate": lr})})
        log(f"{SFT_ARM} learning rate {lr:g}, its sweep's choice")
    n = resolve_workers(cfg.runtime.workers, cfg.runtime.threads, len(tasks)) if workers is None else workers
    log(f"phases (b) and (c): {len(missing_train)} train unit(s), {len(trains) - len(missing_train)} model(s) to "
        f"train again for their evaluation, {len(missing_eval)} evaluation unit(s) of {len(rows)} held-out turns x "
        f"eval_k {cfg.evaluation.k}, {len(missing_ood)} OOD unit(s); {len(tasks)} job(s), {n} at a time")

    def done(job, result):
        task = job[2]
        if "train" in result:
            computed["train"] += task["train_out"].startswith(str(data / "train_"))
            log(f"train {task['model']} s{task['seed']}: {result['train']['steps']} steps, useful share "
                f"{result['train']['useful_share']}, {result['train']['train_s']} s -> {Path(task['train_out']).name}")
        if "eval" in result:
            computed["eval"] += 1
            log(f"eval {task['model']} d{task['seed']}: {result['eval']} samples")
        if "ood" in result:
            computed["eval"] += 1
            log(f"ood {task['model']} d{task['seed']}: {result['ood']} probe items")

    run_jobs_as_done(_unit_job, [(str(wh.root), cfg, {**t, "block": block}, rows, groups, sets) for t in tasks], n,
                     done)
    print(f"decisive: computed {computed['train'] + computed['eval']} unit(s) (train {computed['train']}, eval "
          f"{computed['eval']}); {present} already present", flush=True)
    return computed


# -- the learning-rate sweep (before phase (b); its own unit files) -----------------------------------
def rate_tag(lr: float) -> str:
    """A rate as a name part (model folders take [a-z0-9_]): 1e-05 -> 1em05, 0.001 -> 0p001."""
    return f"{lr:g}".replace(".", "p").replace("-", "m").replace("+", "")


SFT_ARM = "sft_same_data"


def sweep_train_name(lr: float, arm: str = "grpo_adv") -> str:
    return f"sweep_train_{'sft_' if arm == SFT_ARM else ''}lr_{rate_tag(lr)}.parquet"


def sweep_eval_name(model: str) -> str:
    return f"sweep_eval_{model}.parquet"


def sweep_model(lr: float, arm: str = "grpo_adv") -> str:
    return f"sweep_{'sft_' if arm == SFT_ARM else ''}lr_{rate_tag(lr)}"


def sweep_slice(wh, cfg, seed: int, n: int) -> list[str]:
    """The sweep's evaluation items: profiled pool turns outside D_adv's pool (the sweep trains on D_adv; the
    held-out items are never touched), in a fixed hash order, the first n."""
    import polars as pl

    from pivot_assets.core.ids import short_hash
    from pivot_assets.evaluation.ablation import arm_pool, pool_trajectories

    pool = pool_trajectories(wh, cfg)
    adv = set(arm_pool(wh, cfg, "grpo_adv", seed, pool)["turn_id"].to_list())
    turns = wh.read("turns", ["turn_id", "trajectory_id"]).filter(pl.col("trajectory_id").is_in(sorted(pool)))
    profiled = set(wh.read("turn_profiles", ["turn_id"])["turn_id"].to_list())
    ids = [t for t in turns["turn_id"].to_list() if t in profiled and t not in adv]
    return sorted(ids, key=lambda t: short_hash(f"sweep:{seed}:{t}"))[:n]


def _sweep_eval(wh, cfg, model_dir: str, rows: list[dict], sweep: dict, model: str, out: Path) -> float:
    from pivot_assets.evaluation.heldout import evaluation_engine, local_accuracy
    from pivot_assets.evaluation.heldout import eval_seed
    from pivot_assets.verifiers import VerifierSets

    engine, t0 = evaluation_engine(cfg), time.time()
    result = local_accuracy(model_dir, rows, VerifierSets.from_config(cfg).profiling, k=int(sweep["eval_k"]),
                            max_new_tokens=cfg.training.max_completion_length, seed=eval_seed(cfg, int(sweep["seed"])),
                            temperature=engine.temperature, top_p=engine.top_p, policy=engine)
    seconds = round(time.time() - t0, 1)
    write_parquet_atomic([{"model": model, "turn_id": t["turn_id"], "sample": i, "reward": float(r),
                           "seconds": seconds, "host": socket.gethostname()}
                          for t in result["per_turn"] for i, r in enumerate(t["rewards"])], out)
    return seconds


def _sweep_unit_job(root: str, cfg, lr: float | None, sweep: dict, rows: list[dict], data: str,
                    arm: str = "grpo_adv", epochs: float | None = None) -> str:
    """One sweep unit: `arm` (grpo_adv, or sft_same_data on the same D_adv turns) at rate `lr` for `epochs` passes
    (default sweep.epochs; its curve -> sweep_train_[sft_]lr<lr>.parquet), then its sweep-slice samples
    (-> sweep_eval_sweep_[sft_]lr<lr>.parquet); lr None: the reference's samples only."""
    from pivot_assets.core.hardware import configure_torch
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.evaluation.ablation import train_arm
    from pivot_assets.training.runs import reference_model
    from pivot_assets.verifiers import VerifierSets

    configure_torch(cfg.runtime.threads)
    wh, data = Warehouse(root), Path(data)
    if lr is None:
        _sweep_eval(wh, cfg, reference_model(wh, cfg), rows, sweep, REFERENCE, data / sweep_eval_name(REFERENCE))
        return REFERENCE
    rate = {"training": cfg.training.model_copy(update={"learning_rate": lr})} if arm != SFT_ARM else {}
    ablation = {"epochs": float(epochs or sweep["epochs"]), **({"sft_learning_rate": lr} if arm == SFT_ARM else {})}
    cfg = cfg.model_copy(update={**rate, "ablation": cfg.ablation.model_copy(update=ablation)})
    name, seed = sweep_model(lr, arm), int(sweep["seed"])
    train_out = data / sweep_train_name(lr, arm)
    run = train_arm(wh, cfg, arm, seed, VerifierSets.from_config(cfg),
                    lambda m: print(f"[sweep {arm} {lr:g}] {m}", file=sys.stderr, flush=True), model_name=name)
    if not train_out.is_file():
        steps = json.loads((wh.model_dir(name) / "ablation_steps.json").read_text())
        write_parquet_atomic([{"step": int(r["step"]), "reward_mean": r.get("reward_mean"),
                               "useful": (None if r.get("frac_reward_zero_std") is None
                                          else 1.0 - r["frac_reward_zero_std"]),
                               "loss": r.get("loss"), "seconds": r.get("seconds"), "learning_rate": lr, "seed": seed,
                               "pool": run["pool"], "steps_total": run["steps"], "train_s": run["train_s"],
                               "host": socket.gethostname()} for r in steps], train_out)
    _sweep_eval(wh, cfg, str(wh.model_dir(name)), rows, sweep, name, data / sweep_eval_name(name))
    return name


def sweep_table(data: Path, sweep: dict, arm: str = "grpo_adv", rates: list | None = None) -> dict:
    """Per rate: steps, training reward in the first and last third of the steps, useful share, sweep-slice accuracy
    and its paired difference to the reference (mean of per-item differences, 1.96 standard errors); the choice by
    the rule (the highest accuracy; within `tie` of it, the smallest rate). From the sweep unit files alone."""
    import polars as pl

    ref_path = data / sweep_eval_name(REFERENCE)
    if not ref_path.is_file():
        return {"rows": [], "chosen": None, "missing": True}
    ref = pl.read_parquet(ref_path).group_by("turn_id").agg(pl.col("reward").mean().alias("ref"))
    rows, missing = [], False
    for lr in sorted(float(x) for x in (sweep["learning_rates"] if rates is None else rates)):
        tp, ep = data / sweep_train_name(lr, arm), data / sweep_eval_name(sweep_model(lr, arm))
        if not (tp.is_file() and ep.is_file()):
            missing = True
            continue
        tr = pl.read_parquet(tp).sort("step")
        third = max(1, tr.height // 3)
        per_item = (pl.read_parquet(ep).group_by("turn_id").agg(pl.col("reward").mean().alias("acc"))
                    .join(ref, on="turn_id"))
        diff = (per_item["acc"] - per_item["ref"])
        se = float(diff.std() or 0.0) / max(1, per_item.height) ** 0.5
        curve = "loss" if arm == SFT_ARM else "reward_mean"  # SFT has a loss, no reward
        rows.append({"learning_rate": lr, "steps": tr.height, "reward_first": tr[curve].head(third).mean(),
                     "reward_last": tr[curve].tail(third).mean(),
                     "useful": tr["useful"].mean() if "useful" in tr.columns else None,
                     "accuracy": float(per_item["acc"].mean()), "delta": float(diff.mean()), "delta_hw": 1.96 * se,
                     "items": per_item.height, "train_s": float(tr["train_s"][0])})
    chosen = choose_rate(rows, float(sweep["tie"])) if rows and not missing else None
    return {"rows": rows, "chosen": chosen, "missing": missing, "reference": float(ref["ref"].mean())}


def choose_rate(rows: list[dict], tie: float) -> float:
    """The rule, fixed before the sweep ran: the highest sweep-slice accuracy; among rates within `tie` of it,
    the smallest (the run trains longer than the sweep: the smaller step is the safer one)."""
    best = max(r["accuracy"] for r in rows)
    return min(r["learning_rate"] for r in rows if r["accuracy"] >= best - tie)


def sweep_markdown(table: dict, sweep: dict, epochs: float | None = None) -> str:
    n_items = table["rows"][0]["items"] if table["rows"] else None
    lines = [SWEEP_MARK.strip(), "",
             f"Before phase (b), on a slice apart from the held-out items: GRPO on D_adv (seed {sweep['seed']}, "
             f"{sweep['epochs']} of a pass over D_adv's pool) at each rate, then {sweep['eval_k']} samples on each of "
             f"{n_items or sweep['items']} profiled pool turns outside D_adv (evaluation draw {sweep['seed']}), "
             "paired with the reference on the same draw. Rule, fixed before the sweep ran: the highest slice "
             f"accuracy; among rates within {sweep['tie']} of it, the smallest. Both arms of the run use the choice.",
             "", f"Reference on the slice: {table.get('reference', float('nan')):.3f}.", "",
             "| learning rate | steps | train reward, first third | last third | useful share | slice accuracy | "
             "Δ vs reference (±1.96 se) | train s |", "|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        lines.append(f"| {r['learning_rate']:g} | {r['steps']} | {r['reward_first']:.3f} | {r['reward_last']:.3f} | "
                     f"{r['useful']:.2f} | {r['accuracy']:.3f} | {r['delta']:+.3f} ± {r['delta_hw']:.3f} | "
                     f"{r['train_s']:.0f} |")
    lines += ["", (f"**Chosen: {table['chosen']:g}.**" if table["chosen"] is not None
                   else "**Not chosen yet: sweep units missing.**")]
    chosen = next((r for r in table["rows"] if r["learning_rate"] == table["chosen"]), None)
    if chosen is not None and epochs is not None:
        rose = chosen["reward_last"] > chosen["reward_first"]
        lines += ["", f"At the chosen rate the training reward {'rose' if rose else 'did not rise'} within the sweep's "
                  f"{sweep['epochs']} of a pass ({chosen['reward_first']:.3f} in the first third, "
                  f"{chosen['reward_last']:.3f} in the last); the design's rule (one pass, more where the reward does "
                  f"not rise in the sweep) gives the run **{epochs:g} pass(es)** over each arm's pool "
                  "(`ablation.epochs`)."]
    return "\n".join(lines) + "\n"


def sft_sweep_markdown(table: dict, sweep: dict, sft_sweep: dict, epochs: float) -> str:
    """sft_same_data's sweep: per rate its SFT loss (first and last third of the steps) and its slice accuracy
    against the reference's, and the choice by the GRPO sweep's rule."""
    n_items = table["rows"][0]["items"] if table["rows"] else sweep["items"]
    lines = [SWEEP_MARK.strip() + " (sft_same_data)", "",
             (f"Before phase (b), on the sweep slice ({n_items} profiled pool turns outside D_adv, never a held-out "
              f"item; evaluation draw {sweep['seed']}, {sweep['eval_k']} samples each): same-data SFT on D_adv's pool "
              f"turns at each rate for {sft_sweep.get('epochs') or epochs:g} passes (the run's budget), paired with "
              f"the reference on the same draw. Rule: the highest slice accuracy; among rates within {sweep['tie']} "
              "of it, the smallest. sft_same_data trains at the choice; the GRPO arms at the first run's 1e-5."),
             "", f"Reference on the slice: {table.get('reference', float('nan')):.3f}.", "",
             "| learning rate | steps | SFT loss, first third | last third | slice accuracy | Δ vs reference (±1.96 se) "
             "| train s |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['learning_rate']:g} | {r['steps']} | {r['reward_first']:.4f} | {r['reward_last']:.4f} | "
              f"{r['accuracy']:.3f} | {r['delta']:+.3f} ± {r['delta_hw']:.3f} | {r['train_s']:.0f} |"
              for r in table["rows"]]
    lines += ["", (f"**Chosen: {table['chosen']:g}.**" if table["chosen"] is not None
                   else "**Not chosen yet: sweep units missing.**")]
    return "\n".join(lines) + "\n"


def write_sweep_section(out: Path, text: str) -> None:
    """Put the sweep section between the design head and the results (both kept)."""
    whole = out.read_text() if out.is_file() else ""
    head, _, results = ("\n" + whole).partition(RESULTS_MARK)
    head = head.split(SWEEP_MARK, 1)[0].strip("\n")
    out.write_text(head + "\n\n" + text + ((RESULTS_MARK + results) if results else ""))


def run_sweep(wh, cfg, sweep: dict, data: Path, workers: int | None, arm: str = "grpo_adv",
              sft_sweep: dict | None = None) -> dict:
    """Compute the missing sweep units (the reference's slice samples, one unit per rate), then the choice. `arm`
    sft_same_data: the rates of `sft_sweep` at its epochs (default: ablation.epochs, the run's budget), on the same
    slice and draw, paired with the same reference unit."""
    from pivot_assets.core.parallel import resolve_workers
    from pivot_assets.evaluation.heldout import turn_rows

    data.mkdir(parents=True, exist_ok=True)
    rates = [float(x) for x in (sft_sweep if arm == SFT_ARM else sweep)["learning_rates"]]
    epochs = (sft_sweep.get("epochs") or cfg.ablation.epochs) if arm == SFT_ARM else None
    jobs = [None] if not (data / sweep_eval_name(REFERENCE)).is_file() else []
    jobs += [lr for lr in rates if not (data / sweep_eval_name(sweep_model(lr, arm))).is_file()]
    if jobs:
        ids = sweep_slice(wh, cfg, int(sweep["seed"]), int(sweep["items"]))
        if not ids:
            raise SystemExit("decisive: the sweep slice is empty (no profiled pool turn outside D_adv)")
        rows = turn_rows(wh, ids)
        n = resolve_workers(cfg.runtime.workers, cfg.runtime.threads, len(jobs)) if workers is None else workers
        log(f"sweep ({arm}): {len(jobs)} unit(s) ({len(rows)} slice items x {sweep['eval_k']}), {n} at a time")
        order = [j for j in jobs if j is not None] + [j for j in jobs if j is None]  # the short unit last
        run_jobs_as_done(_sweep_unit_job, [(str(wh.root), cfg, lr, sweep, rows, str(data), arm, epochs)
                                           for lr in order], n, lambda job, name: log(f"sweep: {name} done"))
    table = sweep_table(data, sweep, arm, rates)
    if table["chosen"] is None:
        raise SystemExit("decisive: the sweep did not finish (a unit is missing)")
    return table


def sweep_phase(config: Path, work: Path, data: Path, workers: int | None, out: Path | None) -> dict:
    """--sweep-only: phase (a) and the sweep, its section written to the results file; no training unit."""
    raw, section = read_raw(config)
    cfg_path, _ = prepare(config, raw, work, data)
    from pivot_assets.core.warehouse import Warehouse

    cfg = load_cfg(cfg_path)
    table = run_sweep(Warehouse(cfg.warehouse), cfg, section["sweep"], data, workers)
    text = sweep_markdown(table, section["sweep"])
    if out is not None:
        write_sweep_section(out, text)
    print(text)
    return table


# -- the report (unit files and the config only) ------------------------------------------------------
def pass_lines(train, arms: list[str]) -> list[str]:
    """Mean training reward per pass over the arm's pool (steps 1..pool = pass 1, ...), each run's passes paired:
    every pass samples the same prompts, so a rise from pass 1 to pass 2 is the policy learning them."""
    import polars as pl

    runs = train.filter(pl.col("pool") > 0).with_columns(((pl.col("step") - 1) // pl.col("pool") + 1).alias("pass"))
    if runs.is_empty() or runs["pass"].max() < 2:
        return []
    per = runs.group_by("arm", "seed", "pass").agg(pl.col("reward_mean").mean()).sort("arm", "seed", "pass")
    top = int(per["pass"].max())
    lines = ["", "Training reward per pass over the pool (each pass samples the same prompts: a paired look at "
             "whether training moved the policy on them)", "",
             "| arm | seed | " + " | ".join(f"pass {i}" for i in range(1, top + 1)) + " | last - first |",
             "|---|---|" + "---|" * (top + 1)]
    for (arm, seed), g in per.group_by("arm", "seed", maintain_order=True):
        if arm not in arms:
            continue
        r = dict(zip(g["pass"].to_list(), g["reward_mean"].to_list()))
        cells = [f"{r[i]:.3f}" if r.get(i) is not None else "" for i in range(1, top + 1)]
        delta = (r.get(top) - r[1]) if r.get(top) is not None and r.get(1) is not None else None
        lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + f" | {'' if delta is None else f'{delta:+.3f}'} |")
    return lines


def retrain_lines(data: Path, train, arms: list[str], seeds: list[int]) -> list[str]:
    """The runs trained again for their evaluation (their first model was lost with its machine): the evaluated
    model's own curve beside the recorded one, per pass, and whether both ran from the same inputs (the run key)."""
    import polars as pl

    runs = [(a, s, pl.read_parquet(data / retrain_name(a, s))) for s in seeds for a in arms
            if (data / retrain_name(a, s)).is_file()]
    if not runs:
        return []
    lines = ["", "Runs trained again for their evaluation (the first run's model was lost with its machine; the "
             "evaluated model is the second run's): training reward per pass, recorded run / second run", "",
             "| arm | seed | same inputs (run key) | recorded: pass means | evaluated model: pass means | host |",
             "|---|---|---|---|---|---|"]
    for arm, seed, again in runs:
        first = train.filter((pl.col("arm") == arm) & (pl.col("seed") == seed))
        cells = []
        for g in (first, again):
            pool = int(g["pool"][0]) or 1
            per = g.with_columns(((pl.col("step") - 1) // pool + 1).alias("pass")).group_by("pass").agg(
                pl.col("reward_mean").mean()).sort("pass")
            cells.append(" → ".join(f"{v:.3f}" for v in per["reward_mean"].to_list()))
        same = first.height > 0 and first["key"][0] == again["key"][0]
        lines.append(f"| {arm} | {seed} | {'yes' if same else 'no'} | {cells[0]} | {cells[1]} | {again['host'][0]} |")
    return lines


def load_units(data: Path, arms: list[str], seeds: list[int]):
    import polars as pl

    train_units, eval_units = unit_plan(arms, seeds)
    missing = [train_name(*u) for u in train_units if not (data / train_name(*u)).is_file()]
    missing += [eval_name(*u) for u in eval_units if not (data / eval_name(*u)).is_file()]
    train = [pl.read_parquet(data / train_name(*u)) for u in train_units if (data / train_name(*u)).is_file()]
    evals = [pl.read_parquet(data / eval_name(*u)) for u in eval_units if (data / eval_name(*u)).is_file()]
    return (pl.concat(train, how="diagonal_relaxed") if train else None,
            pl.concat(evals, how="diagonal_relaxed") if evals else None, missing)


def arm_pairs(arms: list[str]) -> tuple[tuple[str, str], ...]:
    """The pairs a run reports: its first arm (grpo_adv) against each other arm."""
    return tuple((arms[0], b) for b in arms[1:])


def load_ood(data: Path, models: list[str], seeds: list[int]) -> dict[tuple[str, int], list[float]]:
    """{(model, draw): 0/1 per probe item, in item order} for the OOD unit files present."""
    import polars as pl

    return {(m, d): pl.read_parquet(data / ood_name(m, d)).sort("item")["reward"].to_list()
            for m in models for d in seeds if (data / ood_name(m, d)).is_file()}


def ood_numbers(cfg, ood: dict, arms: list[str], seeds: list[int], pairs) -> tuple[list[dict], list[dict]]:
    """OOD rows (each model pooled over its draws, delta vs the reference) and pairs, through compare / pair_rows on
    the probe items (greedy: one answer per item and model)."""
    from pivot_assets.evaluation.heldout import Policy, compare, pair_rows

    ref_draws = tuple(d for d in seeds if (REFERENCE, d) in ood)
    if not ref_draws:
        return [], []
    policies = [(Policy(REFERENCE, "", None, None, ref_draws),
                 {"turns": {}, "ood": ood[(REFERENCE, ref_draws[0])],
                  "ood_by_draw": {d: ood[(REFERENCE, d)] for d in ref_draws}, "seconds": 0.0})]
    pooled = {}
    for arm in arms:
        for d in (d for d in ref_draws if (arm, d) in ood):
            policies.append((Policy(f"{arm}/s{d}", "", arm, d, (d,)), {"turns": {}, "ood": ood[(arm, d)],
                                                                        "seconds": 0.0}))
            pooled.setdefault(arm, []).append(f"{arm}/s{d}")
    rows = [r for r in compare(cfg, policies, {}, "units", reference=REFERENCE, pooled=pooled) if r["eval_set"] == "ood"]
    pair = [p for p in pair_rows(cfg, policies, {}, "units", pooled, pairs, {}) if p["eval_set"] == "ood"]
    return rows, pair


def report_numbers(data: Path, arms: list[str], seeds: list[int], bootstrap: int, primary: str = "profiled",
                   ood_expected: bool = False) -> dict:
    """Accuracy with intervals (reference, each arm pooled over its seeds), paired deltas against the reference and
    between the run's pairs (arm_pairs), from the eval unit files through the project's compare / pair_rows
    (hierarchical bootstrap); the same on the OOD probe where its unit files exist; each pair's per-seed, per-item
    differences on the primary set (diffs: what pair_components reads)."""
    import polars as pl

    from pivot_assets.evaluation.heldout import Policy, _matrix, compare, pair_rows

    train, ev, missing = load_units(data, arms, seeds)
    if ev is None:
        return {"missing": missing, "rows": [], "pairs": [], "train": train, "eval": None, "diffs": {},
                "ood_missing": [ood_name(m, d) for m in (REFERENCE, *arms) for d in seeds] if ood_expected else []}
    per_turn = ev.group_by("model", "draw", "turn_id").agg(pl.col("reward").mean().alias("score"),
                                                           pl.col("conversation_id").first())
    groups = dict(per_turn.select("turn_id", "conversation_id").unique().iter_rows())
    ids_by = {(m, d): set(g["turn_id"].to_list()) for (m, d), g in per_turn.group_by("model", "draw")}
    common = sorted(set.intersection(*ids_by.values()))
    flags = ev.select("turn_id", "in_mixed", "in_adv").unique()
    sets = {primary: common,
            "mixed": sorted(t for t, f in zip(flags["turn_id"], flags["in_mixed"]) if f and t in set(common)),
            "adv": sorted(t for t, f in zip(flags["turn_id"], flags["in_adv"]) if f and t in set(common))}
    if primary != "profiled":
        sets["profiled"] = common
    scores: dict[tuple[str, int], dict[str, float]] = {}
    for (m, d), g in per_turn.group_by("model", "draw"):
        scores[(m, d)] = dict(zip(g["turn_id"].to_list(), g["score"].to_list()))
    draws_of = lambda m: tuple(d for d in seeds if (m, d) in scores)  # noqa: E731
    policies = []
    ref_draws = draws_of(REFERENCE)
    policies.append((Policy(REFERENCE, "", None, None, ref_draws),
                     {"turns": {d: scores[(REFERENCE, d)] for d in ref_draws}, "ood": [], "seconds": 0.0}))
    pooled = {}
    for arm in arms:
        for d in draws_of(arm):
            name = f"{arm}/s{d}"
            policies.append((Policy(name, "", arm, d, (d,)), {"turns": {d: scores[(arm, d)]}, "ood": [],
                                                               "seconds": 0.0}))
            pooled.setdefault(arm, []).append(name)

    cfg = load_report_cfg(bootstrap)
    rows = [r for r in compare(cfg, policies, sets, "units", reference=REFERENCE, pooled=pooled, groups=groups)
            if r["eval_set"] != "ood"]
    pairs = [p for p in pair_rows(cfg, policies, sets, "units", pooled, arm_pairs(arms), groups, primary)
             if p["eval_set"] != "ood"]
    diffs: dict[tuple[str, str], dict[int, list[float]]] = {}
    for a, b in arm_pairs(arms):
        for d in seeds:
            if (a, d) in scores and (b, d) in scores:
                xa = _matrix({"turns": {d: scores[(a, d)]}}, common, (d,))[0]
                xb = _matrix({"turns": {d: scores[(b, d)]}}, common, (d,))[0]
                diffs.setdefault((a, b), {})[d] = [x - y for x, y in zip(xa, xb)]
    first = diffs.get(arm_pairs(arms)[0], {}) if len(arms) > 1 else {}
    per_seed = [{"seed": d, "delta": sum(v) / len(common)} for d, v in first.items()]
    ood = load_ood(data, [REFERENCE, *arms], seeds)
    ood_rows, ood_pairs = ood_numbers(cfg, ood, arms, seeds, arm_pairs(arms))
    ood_missing = [ood_name(m, d) for m in (REFERENCE, *arms) for d in seeds
                   if (ood or ood_expected) and (m, d) not in ood]
    return {"missing": missing, "rows": rows, "pairs": pairs, "train": train, "eval": ev, "sets": sets,
            "per_seed": per_seed, "n_turns": len(common), "n_conversations": len({groups[t] for t in common}),
            "diffs": diffs, "ood_rows": ood_rows, "ood_pairs": ood_pairs, "ood_missing": ood_missing,
            "n_ood": len(next(iter(ood.values()))) if ood else 0}


# -- the paper's table (this run's units and a companion run's, each pair within one block) -------------------------
# The paper's tau2-bench ablation (accuracy, %) and its OOD change (points vs its base model), beside each row
PAPER = {"grpo_adv": ("63.81", "+0.21"), "grpo_cand": ("59.68", ""), "sft_same_data": ("58.44", "-9.83"),
         "grpo_adv_exact": ("57.34", "")}
TABLE_ROWS = (REFERENCE, "grpo_adv", "grpo_cand", "sft_same_data", "grpo_adv_exact")
Z95 = 1.96


def pair_components(diffs: dict[int, list[float]]) -> dict | None:
    """The variance of a paired difference from its per-seed, per-item differences (bench/decisive_design.py's
    table design reads the same): w (item variance within a seed), sd2 (its part common to the seeds), the seed SD
    of the per-seed means and tau2 (their variance less their item noise); None below 2 seeds."""
    import statistics

    seeds = sorted(diffs)
    if len(seeds) < 2:
        return None
    n_items = len(diffs[seeds[0]])
    means = [statistics.fmean(diffs[s]) for s in seeds]
    w = statistics.fmean(statistics.variance(diffs[s]) for s in seeds)
    averaged = statistics.variance([statistics.fmean(diffs[s][i] for s in seeds) for i in range(n_items)])
    sd2 = max(0.0, (len(seeds) * averaged - w) / (len(seeds) - 1))
    s_seed = statistics.stdev(means)
    return {"w": w, "sd2": sd2, "I": n_items, "s_seed": s_seed, "tau2": max(0.0, s_seed ** 2 - w / n_items),
            "seed_means": means}


def pair_half_width(c: dict, n_seeds: int, tau2: float) -> float:
    """1.96 sqrt(V), V = (sd2 + (w - sd2) / S) / I + tau2 / S: a paired difference pooled over S seeds."""
    return Z95 * ((c["sd2"] + (c["w"] - c["sd2"]) / n_seeds) / c["I"] + tau2 / n_seeds) ** 0.5


def seeds_to_decide(c: dict, delta: float, most: int = 100) -> int | None:
    """The fewest seeds whose expected half-width (measured variance) is below |delta|; None: not within `most`."""
    return next((n for n in range(1, most + 1) if pair_half_width(c, n, c["tau2"]) < abs(delta)), None)


def verdict_words(p: dict | None, c: dict | None) -> str:
    """better / worse / not decided at this size (with the seeds the measured variance asks for)."""
    from pivot_assets.evaluation.heldout import fmt_interval

    if p is None or p["delta_low"] is None:
        return "not run yet"
    text = fmt_interval(p, "delta")
    if p["delta_low"] > 0:
        return f"better, {text} excludes 0"
    if p["delta_high"] < 0:
        return f"worse, {text} excludes 0"
    need = seeds_to_decide(c, p["delta"]) if c else None
    more = ("" if c is None else f"; at this difference the measured variance asks for {need} seeds"
            if need else "; no seed count within 100 decides a difference this small")
    return f"not decided at this size, {text} contains 0{more}"


def ood_lines(nums: dict) -> list[str]:
    """The OOD probe's rows and pairs of one run (where its units exist)."""
    from pivot_assets.evaluation.heldout import fmt_interval

    if not nums.get("ood_rows"):
        return []
    pooled = {r["policy"] for r in nums["ood_rows"] if r["seed"] is None}
    lines = ["", f"### Out of domain (the OOD probe: {nums['n_ood']} items, greedy)", "",
             "| policy | draws | accuracy [95% CI] | Δ vs reference [95% CI] |", "|---|---|---|---|"]
    lines += [f"| {r['policy']} | {r['n_seeds']} | {fmt_interval(r)} | "
              f"{'' if r['policy'] == REFERENCE else fmt_interval(r, 'delta')} |"
              for r in nums["ood_rows"] if r["seed"] is None or r["arm"] not in pooled]
    lines += [f"| {p['arm_a']} − {p['arm_b']} (ood) | {p['n_seeds']} | | {fmt_interval(p, 'delta')} |"
              for p in nums["ood_pairs"]]
    if nums["ood_missing"]:
        lines += ["", f"OOD units missing: {', '.join(nums['ood_missing'])}."]
    return lines


def _best_row(rows: list[dict], model: str, eval_set: str) -> dict | None:
    """A model's pooled row on a set where it has one, else its single seed's."""
    mine = [r for r in rows if r["eval_set"] == eval_set and (r["policy"] == model or r["arm"] == model)]
    return next((r for r in mine if r["seed"] is None), mine[0] if mine else None)


def paper_table_lines(first: dict, table_config: Path | None, bootstrap: int, primary: str) -> list[str]:
    """The paper's layout: rows reference, grpo_adv, grpo_cand, sft_same_data, grpo_adv_exact, each from the block
    that ran it (this run's units, then the companion config's), held-out and OOD accuracy with intervals and deltas
    vs that block's reference, the paper's numbers beside; then the pairs (each within one block) and a verdict
    line per pair."""
    from pivot_assets.evaluation.heldout import fmt_interval

    if table_config is None:  # every arm in this run (bench/gpu/decisive.sh)
        second, section2, blocks = None, {"data": "(this run)"}, [(first, "this run")]
        intro = "Rows as in the paper's ablation, every arm from this run's one block."
    else:
        raw2, section2 = read_raw(table_config)
        data2 = repo_path(section2["data"])
        arms2, seeds2 = list(raw2["ablation"]["arms"]), [int(x) for x in raw2["ablation"]["seeds"]]
        second = report_numbers(data2, arms2, seeds2, bootstrap, primary, bool(section2["ood"]))
        blocks = [(first, "first run"), (second, "table run")]
        intro = (f"Rows as in the paper's ablation; each from the run that trained it: the first run "
                 f"(`{section2['data'].rsplit('/', 1)[0]}/`, grpo_adv and grpo_cand) and the table run "
                 f"(`{section2['data']}/`, grpo_adv again, sft_same_data, grpo_adv_exact, and the OOD probe).")
    lines = ["", "## The paper's table", "",
             f"{intro} Deltas are against the reference of the same block; pairs never cross blocks. Paper: "
             "tau2-bench accuracy (%) and its OOD change (points vs the base model).", "",
             "| row | run | seeds | held-out accuracy [95% CI] | Δ vs reference | OOD accuracy [95% CI] | OOD Δ vs "
             "reference | paper | paper OOD Δ |", "|---|---|---|---|---|---|---|---|---|"]
    for model in TABLE_ROWS:
        for nums, run in blocks:
            r = _best_row(nums["rows"], model, primary)
            o = _best_row(nums.get("ood_rows") or [], model, "ood")
            if r is None and o is None:
                continue
            paper, paper_ood = PAPER.get(model, ("", ""))
            ref = model == REFERENCE
            lines.append(f"| {model} | {run} | {(r or o)['n_seeds']} | {fmt_interval(r) if r else ''} | "
                         f"{'' if ref or r is None else fmt_interval(r, 'delta')} | {fmt_interval(o) if o else ''} | "
                         f"{'' if ref or o is None else fmt_interval(o, 'delta')} | {paper} | {paper_ood} |")
    lines += ["", "| pair | run | held-out Δ [95% CI] | OOD Δ [95% CI] |", "|---|---|---|---|"]
    verdicts = []
    for nums, run in blocks:
        for pair in dict.fromkeys((p["arm_a"], p["arm_b"]) for p in nums["pairs"]):
            held = next((p for p in nums["pairs"] if (p["arm_a"], p["arm_b"]) == pair and p["eval_set"] == primary),
                        None)
            ood = next((p for p in nums.get("ood_pairs") or [] if (p["arm_a"], p["arm_b"]) == pair), None)
            lines.append(f"| {pair[0]} − {pair[1]} | {run} | {fmt_interval(held, 'delta') if held else ''} | "
                         f"{fmt_interval(ood, 'delta') if ood else ''} |")
            c = pair_components(nums["diffs"].get(pair, {}))
            words = f"held-out: {verdict_words(held, c)}"
            words += f"; OOD: {verdict_words(ood, None)}" if ood else ""
            verdicts.append(f"**Verdict (grpo_adv - {pair[1]}):** {words}.")
    for arm in ("grpo_adv_exact", "sft_same_data"):
        if not any(v.startswith(f"**Verdict (grpo_adv - {arm}):**") for v in verdicts):
            where = f" (its units: `{section2['data']}/`)" if second is not None else ""
            verdicts.append(f"**Verdict (grpo_adv - {arm}):** not run yet{where}.")
    lines += ["", *[x for v in verdicts for x in (v, "")]][:-1] if verdicts else []
    lines += [] if second is None else ["", "Caveats stated with the table:", "",
              "- Learning rate: both GRPO arms of both runs train at 1e-5, the choice of the first run's sweep, which "
              "trained D_adv only, on an earlier bf16 phase (a) (D_adv's pool 75 turns, not 76), and the 2 passes were "
              "not re-derived on the float32 blocks. A rate tuned on grpo_adv's own arm can only favour grpo_adv in "
              "its pairs with grpo_cand and grpo_adv_exact (their best rate may differ); sft_same_data's rate comes "
              "from its own sweep on the table run's block (`sweep_*_sft_*` units).",
              "- Resumed runs: in the first run, seeds 1 and 2 resumed from checkpoints (their steps before the resume "
              "carry no `seconds`; bench/data/decisive_bfcl/README.md); a GRPO run cut after step n and resumed "
              "equals an uninterrupted one on the tiny policy (tests/training/test_grpo_resume.py: loss and reward "
              "per step and the weights within 1e-6).",
              "- Blocks: the table run's phase (a) is pinned (PINNED_ENV) on another CPU than the first run's "
              "unpinned one, so its grpo_adv is a second measurement, not a copy; each block's prepare.json names "
              "its CPU and block."]
    if second is not None:
        missing = second["missing"] + second.get("ood_missing", [])
        lines += ["", f"Table run: {len(missing)} unit file(s) missing." if missing else "Table run: every unit present."]
    return lines


def load_report_cfg(bootstrap: int):
    """A PivotConfig with the bootstrap count (compare reads evaluation.bootstrap and the evaluation engine's labels)."""
    from pivot_assets.core.config import PivotConfig

    return PivotConfig.model_validate({"base_dir": str(ROOT), "evaluation": {"bootstrap": bootstrap}})


def curves_png(train, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import polars as pl

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=100)
    colors = {"grpo_adv": "#c44e52", "grpo_cand": "#4c72b0"}
    for (arm, seed), g in sorted(train.group_by("arm", "seed"), key=lambda kv: (kv[0][0], kv[0][1])):
        g = g.sort("step")
        for ax, col in zip(axes, ("reward_mean", "useful")):
            ys = g[col].cast(pl.Float64).fill_null(float("nan")).to_list()
            window = max(1, len(ys) // 10)
            smooth = [sum(v for v in ys[max(0, i - window + 1): i + 1] if v == v)
                      / max(1, sum(1 for v in ys[max(0, i - window + 1): i + 1] if v == v)) for i in range(len(ys))]
            ax.plot(g["step"].to_list(), smooth, color=colors.get(arm, "#555555"), alpha=0.8,
                    label=f"{arm} s{seed}", lw=1.2)
    axes[0].set_title("training reward mean (running mean over ~10% of the steps)", fontsize=9)
    axes[1].set_title("useful share (groups with reward variance), running mean", fontsize=9)
    for ax in axes:
        ax.set_xlabel("GRPO step")
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)


def report(config: Path, data: Path, out: Path | None, png: Path | None) -> str:
    """The results section, from the unit files in `data` and the config alone; written below the design head of
    `out` (everything above RESULTS_MARK is kept)."""
    import polars as pl

    from pivot_assets.evaluation.heldout import fmt_interval

    raw, section = read_raw(config)
    arms, seeds = list(raw["ablation"]["arms"]), [int(s) for s in raw["ablation"]["seeds"]]
    bootstrap = int((raw.get("evaluation") or {}).get("bootstrap", 1000))
    primary = (raw.get("ablation") or {}).get("primary", "profiled")
    nums = report_numbers(data, arms, seeds, bootstrap, primary)
    half = section.get("half_width")
    lines = [RESULTS_MARK.strip(), "", f"Built by `bench/decisive.py --report` from the unit files in "
             f"`{data.relative_to(ROOT) if data.is_relative_to(ROOT) else data}` and `{config.name}` alone."]
    if nums["missing"]:
        lines += ["", f"**Incomplete: {len(nums['missing'])} unit file(s) missing** ({', '.join(nums['missing'])}); "
                  "the numbers below use the units present."]
    train, ev = nums["train"], nums["eval"]
    prim = [r for r in nums["rows"] if r["eval_set"] == primary]
    pair = next((p for p in nums["pairs"] if p["eval_set"] == primary), None)
    if prim:
        lines += ["", f"### Held-out accuracy (`{primary}`: {nums['n_turns']} items, {nums['n_conversations']} "
                  f"conversations; eval_k {int(ev['eval_k'][0])}, sampled)", "",
                  "| policy | draws | accuracy [95% CI] | Δ vs reference [95% CI] |", "|---|---|---|---|"]
        pooled_arms = {r["policy"] for r in prim if r["seed"] is None}
        for r in prim:  # an arm's pooled row where it has one, else its single seed's row
            if r["seed"] is None or r["arm"] not in pooled_arms:
                lines.append(f"| {r['policy']} | {r['n_seeds']} | {fmt_interval(r)} | "
                             f"{'' if r['policy'] == REFERENCE else fmt_interval(r, 'delta')} |")
    if pair is not None:
        lines += ["", "### The paired difference", "", "| pair | seeds | Δ [95% CI] | excludes 0 |", "|---|---|---|---|"]
        for p in nums["pairs"]:
            lines.append(f"| {p['arm_a']} − {p['arm_b']} ({p['eval_set']}{', primary' if p['primary'] else ''}, n {p['n']}) | "
                         f"{p['n_seeds']} | {fmt_interval(p, 'delta')} | {p['excludes_zero']} |")
        if nums["per_seed"]:
            lines += ["", "Per seed (point estimates, primary set): " + ", ".join(
                f"s{r['seed']} {r['delta']:+.3f}" for r in nums["per_seed"]) + "."]
        hw = None if pair["delta_low"] is None else (pair["delta_high"] - pair["delta_low"]) / 2
        if (pair["arm_a"], pair["arm_b"]) != ("grpo_adv", "grpo_cand"):
            verdict = None  # the table's pairs: their verdicts are in the paper's table (bench/RESULTS_decisive_bfcl.md)
        elif pair["delta_low"] is None:
            verdict = "no verdict: the pair has no interval"
        elif pair["delta_low"] > 0:
            verdict = f"GRPO on D_adv is better than GRPO on D_cand: {fmt_interval(pair, 'delta')} excludes 0"
        elif pair["delta_high"] < 0:
            verdict = f"GRPO on D_cand is better than GRPO on D_adv: {fmt_interval(pair, 'delta')} excludes 0"
        else:
            verdict = (f"no difference larger than the half-width: adv - cand {fmt_interval(pair, 'delta')} "
                       f"(half-width {hw:.3f}) contains 0")
        done = len(nums["per_seed"])
        label = "Verdict" if not nums["missing"] else f"Interim, {done} of {len(seeds)} seeds (not the verdict)"
        lines += [] if verdict is None else ["", f"**{label}: {verdict}.** (Designed half-width: {half}; measured: "
                                             f"{'n/a' if hw is None else f'{hw:.3f}'}.)"]
    lines += ood_lines(nums)
    if train is not None:
        runs = train.group_by("arm", "seed").agg(pl.col("pool").first(), pl.col("steps_total").first(),
                                                 pl.col("turns_trained").first(), pl.col("useful_share").first(),
                                                 pl.col("cand_overlap_adv").first(), pl.col("train_s").first(),
                                                 pl.col("learning_rate").first()).sort("arm", "seed")
        lines += ["", "### Training", "", "| arm | seed | pool turns | steps | turns trained on | useful share | "
                  "D_cand ∩ D_adv | learning rate | train s |", "|---|---|---|---|---|---|---|---|---|"]
        for r in runs.iter_rows(named=True):
            lines.append(f"| {r['arm']} | {r['seed']} | {r['pool']} | {r['steps_total']} | {r['turns_trained']} | "
                         f"{r['useful_share']} | {'' if r['cand_overlap_adv'] is None else r['cand_overlap_adv']} | "
                         f"{r['learning_rate']} | {r['train_s']} |")
        share = train.group_by("arm").agg(pl.col("useful").mean()).sort("arm")
        lines += ["", "Useful share per arm (all steps of all seeds): " + ", ".join(
            f"{a} {'n/a' if u is None else f'{u:.3f}'}" for a, u in share.iter_rows()) + "."]
        n_bins = 5
        lines += ["", f"Training curve: mean reward over all seeds, the steps cut in {n_bins} equal parts "
                  "(useful share in parentheses)", "", "| arm | " + " | ".join(f"part {i + 1}" for i in range(n_bins))
                  + " |", "|---|" + "---|" * n_bins]
        for arm in arms:
            g = train.filter(pl.col("arm") == arm)
            if not g.height:
                continue
            top = int(g["step"].max()) or 1
            g = g.with_columns(((pl.col("step") - 1).clip(0) * n_bins // top).clip(0, n_bins - 1).alias("part"))
            agg = g.group_by("part").agg(pl.col("reward_mean").mean(), pl.col("useful").mean()).sort("part")
            cells = {p: (rw, u) for p, rw, u in agg.iter_rows()}
            lines.append(f"| {arm} | " + " | ".join(
                "" if p not in cells or cells[p][0] is None else
                f"{cells[p][0]:.3f} ({'n/a' if cells[p][1] is None else f'{cells[p][1]:.2f}'})" for p in range(n_bins))
                + " |")
        lines += pass_lines(train, arms)
        lines += retrain_lines(data, train, arms, seeds)
        if png is not None:
            curves_png(train, png)
            lines += ["", f"Per-step curves of every run: `{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}`."]
    prep = json.loads((data / "prepare.json").read_text()) if (data / "prepare.json").is_file() else {"runs": []}
    lines += ["", "### Wall time per phase (from the unit files)", "", "| phase | units | seconds (sum over units) | machines (or hosts) |",
              "|---|---|---|---|",
              f"| (a) prepare: ingest, warm-up, profiling, pivot sets | {len(prep['runs'])} run(s) | "
              f"{sum(r['wall_s'] for r in prep['runs']):.0f} | "
              f"{'; '.join(sorted({machine_or_host(r.get('machine'), r['host']) for r in prep['runs']}))} |"]
    if train is not None:
        t = train.with_columns(where(train)).group_by("arm", "seed").agg(pl.col("train_s").first(), pl.col("where").first())
        lines.append(f"| (b) GRPO runs | {t.height} | {t['train_s'].sum():.0f} | {'; '.join(sorted(set(t['where'])))} |")
    if ev is not None:
        e = ev.with_columns(where(ev)).group_by("model", "draw").agg(pl.col("seconds").first(), pl.col("where").first())
        lines.append(f"| (c) evaluation | {e.height} | {e['seconds'].sum():.0f} | {'; '.join(sorted(set(e['where'])))} |")
    lines += seed_lines(train, ev, seeds, prep)
    if section["paper_table"]:
        lines += paper_table_lines(nums, repo_path(section["table"]), bootstrap, primary)
    lines.append("")
    text = "\n".join(lines)
    if out is not None and (data / sweep_eval_name(REFERENCE)).is_file():
        epochs = float((raw.get("ablation") or {}).get("epochs", 1))
        if section["sft_sweep"]["learning_rates"]:  # the table run: only same-data SFT's rate is swept
            write_sweep_section(out, sft_sweep_markdown(sweep_table(data, section["sweep"], SFT_ARM,
                                                                    section["sft_sweep"]["learning_rates"]),
                                                        section["sweep"], section["sft_sweep"], epochs))
        else:
            write_sweep_section(out, sweep_markdown(sweep_table(data, section["sweep"]), section["sweep"], epochs))
    if out is not None:
        head = out.read_text() if out.is_file() else ""
        head = ("\n" + head).split(RESULTS_MARK, 1)[0].strip("\n")
        out.write_text((head + "\n\n" if head else "") + text)
    return text


def machine_or_host(machine: str | None, host: str) -> str:
    """How a unit or a phase (a) run names where it ran: its machine, or its hostname where it predates the column."""
    return machine or f"host {host}"


def where(frame):
    """A unit's machine_or_host, as a column (the unit files are small: row by row)."""
    import polars as pl

    machines = frame["machine"] if "machine" in frame.columns else [None] * frame.height
    return pl.Series("where", [machine_or_host(m, h) for m, h in zip(machines, frame["host"])], pl.String)


def seed_lines(train, ev, seeds: list[int], prep: dict) -> list[str]:
    """Where each seed's units came from: their phase (a) block and the machine that computed them (a unit without
    a `machine` column names the block's phase (a) machine from prepare.json, or its hostname)."""
    import polars as pl

    block_machine = {r["block"]: r["machine"] for r in prep["runs"] if r.get("block") and r.get("machine")}
    parts = [f for f in (train, ev) if f is not None]
    if not parts:
        return []
    units = pl.concat([f.select([c for c in ("seed", "draw", "block", "machine", "host") if c in f.columns])
                       .rename({"draw": "seed"} if "draw" in f.columns else {}) for f in parts], how="diagonal_relaxed")
    for col in ("block", "machine", "host"):
        if col not in units.columns:
            units = units.with_columns(pl.lit(None, pl.String).alias(col))
    lines = ["", "### Per seed: the phase (a) block and the machine of its units", "",
             "| seed | block | machine |", "|---|---|---|"]
    for seed in seeds:
        g = units.filter(pl.col("seed") == seed).unique()
        if not g.height:
            lines.append(f"| {seed} | (not run) | |")
            continue
        blocks = sorted({b or "(none recorded)" for b in g["block"].to_list()})
        machines = sorted({machine_or_host(m or block_machine.get(b), h)
                           for b, m, h in g.select("block", "machine", "host").iter_rows()})
        lines.append(f"| {seed} | {', '.join(blocks)} | {'; '.join(machines)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--data", default=None, help="unit files (default: decisive.data)")
    ap.add_argument("--work", default=None, help="warehouse and Dagster home (default: /tmp/decisive-<config stem>)")
    ap.add_argument("--report", action="store_true", help="only build the report from the unit files")
    ap.add_argument("--out", default=None, help="results file (default: decisive.results)")
    ap.add_argument("--png", default=None, help="training curves plot (default: decisive.curves)")
    ap.add_argument("--workers", type=int, default=None, help="units at a time (default: runtime.workers)")
    ap.add_argument("--sweep-only", action="store_true",
                    help="stop after the learning-rate sweep (decisive.learning_rate: sweep) and write its section")
    args = ap.parse_args()
    config = Path(args.config).resolve()
    _, section = read_raw(config)
    data = repo_path(args.data) if args.data else repo_path(section["data"])
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / f"decisive-{config.stem}"
    out = repo_path(args.out) if args.out else repo_path(section["results"])
    png = repo_path(args.png) if args.png else repo_path(section["curves"])
    if args.sweep_only:
        sweep_phase(config, work.resolve(), data, args.workers, out)
        return
    if not args.report:
        run(config, work.resolve(), data, args.workers)
    print(report(config, data, out, png))


if __name__ == "__main__":
    main()
