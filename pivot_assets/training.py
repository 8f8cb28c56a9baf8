"""Stage 5: same-data SFT (`sft_policy`: warm-up reference policy and the paper's baseline), local GRPO on
the pivot set (`grpo_run`), and local accuracy before/after plus an OOD probe (`pivot_eval`).

Each stage writes a completion marker keyed by everything its output depends on, so a rerun with the
same inputs skips the work (a second `pivot run` trains nothing).
"""

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa

from pivot_assets.config import PivotConfig
from pivot_assets.plots import lines_png, markdown_image, save_png
from pivot_assets.resources import PivotSettings, publish, timed
from pivot_assets.schema import canonical_json, short_hash
from pivot_assets.warehouse import Warehouse
from pivot_assets.warehouse_ops import SET_TABLES

MARKER = ".pivot_key"
EMBEDDED = "embedded"


def base_model(cfg: PivotConfig) -> str:
    """The pretrained policy everything starts from: `policy.model`, or the embedded model when the
    reference policy is the SFT warm-up itself (`policy.model: sft`)."""
    return EMBEDDED if cfg.policy.model == "sft" else cfg.policy.model


def model_dir(wh: Warehouse, name: str) -> Path:
    return wh.root / "models" / name


def read_marker(path: Path) -> str | None:
    marker = path / MARKER
    return marker.read_text().strip() if marker.is_file() else None


def write_marker(path: Path, key: str) -> None:
    (path / MARKER).write_text(key + "\n")


def held_out_trajectories(wh: Warehouse, cfg: PivotConfig) -> set[str]:
    from pivot_assets.grpo import split_by_trajectory

    ids = wh.read("trajectories", ["trajectory_id"])["trajectory_id"].to_list()
    return split_by_trajectory(ids, cfg.training.eval_fraction, cfg.training.seed)


def steps_plot(wh: Warehouse, name: str, rows: list[dict], series: list[str]) -> str:
    png = lines_png({s: [(r["step"], r.get(s)) for r in rows] for s in series}, title=name)
    save_png(png, wh.root / "plots" / f"{name}.png")
    return markdown_image(png, name)


# -- SFT ----------------------------------------------------------------------------------------
def sft_key(wh: Warehouse, cfg: PivotConfig) -> str:
    from pivot_assets.policies.models import policy_fingerprint

    return short_hash(canonical_json({
        "sft": cfg.section("sft"), "data": wh.data_version("trajectories"),
        "base": policy_fingerprint(base_model(cfg)), "eval_fraction": cfg.training.eval_fraction,
        "split_seed": cfg.training.seed,
    }))


def train_sft_policy(wh: Warehouse, cfg: PivotConfig, log) -> dict:
    """Train on the expert turns of every trajectory outside the held-out split; save an HF dir."""
    from pivot_assets.policies.models import load_model
    from pivot_assets.sft import SFTOptions, build_sft_examples, train_sft

    held_out = held_out_trajectories(wh, cfg)
    trajectories = [t for t in wh.read("trajectories").iter_rows(named=True) if t["trajectory_id"] not in held_out]
    _, tokenizer = load_model(base_model(cfg))
    rejections: list = []
    examples = build_sft_examples(trajectories, tokenizer, cfg.sft.max_length, rejections)
    rows = train_sft(base_model(cfg), examples, SFTOptions(**cfg.section("sft")), model_dir(wh, "sft_policy"),
                     on_step=lambda r: log(f"sft step {r['step']}: loss {r['loss']:.4f}"))
    return {"rows": rows, "n_examples": len(examples), "n_held_out": len(held_out), "rejections": rejections}


# -- GRPO ---------------------------------------------------------------------------------------
def init_model(wh: Warehouse, cfg: PivotConfig) -> str:
    return str(model_dir(wh, "sft_policy")) if cfg.training.init == "sft" else base_model(cfg)


def training_identity(cfg: PivotConfig) -> dict:
    """The training section minus evaluation-only keys (changing eval_k must not retrain)."""
    return {k: v for k, v in cfg.section("training").items() if k != "eval_k"}


def grpo_key(wh: Warehouse, cfg: PivotConfig, verifier_fp: str) -> str:
    from pivot_assets.policies.models import policy_fingerprint

    return short_hash(canonical_json({
        "training": training_identity(cfg), "pivots": wh.data_version(SET_TABLES[cfg.training.set]),
        "init": policy_fingerprint(init_model(wh, cfg)), "verifier": verifier_fp, "cpu_smoke": not _has_cuda(),
    }))


def run_local_grpo(wh: Warehouse, cfg: PivotConfig, verifiers):
    import datasets

    from pivot_assets.grpo import GRPOOptions, run_grpo

    dataset = datasets.load_from_disk(str(wh.root / "exports" / f"{SET_TABLES[cfg.training.set]}_hf"))
    if len(dataset) == 0:
        raise ValueError(f"the {SET_TABLES[cfg.training.set]} pivot set is empty: nothing to train on")
    return run_grpo(init_model(wh, cfg), dataset, verifiers, GRPOOptions(**cfg.section("training")),
                    model_dir(wh, "grpo_policy"), cpu_smoke=not _has_cuda())


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def build_sft_assets(cfg: PivotConfig) -> list:
    @dg.asset(deps=["trajectories"], group_name="training", kinds={"pytorch"},
              code_version=short_hash(canonical_json({"sft": cfg.section("sft"), "split": [cfg.training.eval_fraction, cfg.training.seed]})))
    def sft_policy(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """SmolLM2 fine-tuned on the expert turns (assistant tokens only), held-out trajectories excluded:
        the warm-up reference policy and the same-data SFT baseline."""
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        out, key = model_dir(wh, "sft_policy"), sft_key(wh, cfg)
        if read_marker(out) == key and wh.exists("sft_steps"):
            context.log.info(f"sft_policy is up to date ({key}): not retraining")
            meta = {"skipped": True}
        else:
            with timed() as t:
                result = train_sft_policy(wh, cfg, context.log.info)
            wh.write_table("sft_steps", pa.Table.from_pylist(result["rows"]))
            write_marker(out, key)  # last: a crash before it means "not done", never stale steps
            meta = {"skipped": False, "train_s": round(t["seconds"], 1), "examples": result["n_examples"],
                    "held_out_trajectories": result["n_held_out"], "not_trained_on": len(result["rejections"])}
        rows = wh.read("sft_steps").to_dicts()
        return publish(wh, "sft_steps", {
            **meta, "model_dir": dg.MetadataValue.path(str(out)), "key": key, "final_loss": rows[-1]["loss"],
            "loss": dg.MetadataValue.md(steps_plot(wh, "sft_loss", rows, ["loss"])),
        }, preview=False, asset="sft_policy", data_version=key)

    return [sft_policy]


def build_training_assets(cfg: PivotConfig) -> list:
    from pivot_assets.pivots import HF_EXPORT

    init_deps = ["sft_policy"] if cfg.training.init == "sft" else []
    train_table = SET_TABLES[cfg.training.set]

    @dg.asset(deps=[HF_EXPORT, *init_deps], group_name="training", kinds={"pytorch"},
              code_version=short_hash(canonical_json(training_identity(cfg))))
    def grpo_run(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """TRL GRPOTrainer on the pivot set, one short turn per sample, rewarded by the local verifier."""
        from pivot_assets.profiling import verifier_set

        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        verifiers = verifier_set(cfg)
        out, key = model_dir(wh, "grpo_policy"), grpo_key(wh, cfg, verifiers.fingerprint)
        if read_marker(out) == key and wh.exists("grpo_steps"):
            context.log.info(f"grpo_run is up to date ({key}): not retraining")
            meta = {"skipped": True}
        else:
            with timed() as t:
                result = run_local_grpo(wh, cfg, verifiers)
            wh.write_table("grpo_steps", pa.Table.from_pylist([{**r, "run_key": key} for r in result.steps]))
            wh.write_table("grpo_completions", pa.Table.from_pylist(
                [{**{k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in r.items()}, "run_key": key}
                 for r in result.completions_log]))
            write_marker(out, key)  # last: a crash before it means "not done", never stale steps
            meta = {"skipped": False, "train_s": round(t["seconds"], 1), "train_prompts": result.n_train_prompts,
                    "verifier_fingerprints": dg.MetadataValue.json(result.verifier_fingerprints),
                    "grpo_config": dg.MetadataValue.json({k: str(v) for k, v in result.grpo_config.items()})}
        rows = wh.read("grpo_steps").to_dicts()
        plot = steps_plot(wh, "grpo_steps", rows, ["reward_mean", "reward_std", "frac_reward_zero_std", "loss"])
        return publish(wh, "grpo_steps", {
            **meta, "model_dir": dg.MetadataValue.path(str(out)), "key": key, "steps": len(rows),
            "final_reward_mean": rows[-1].get("reward_mean") if rows else None,
            "metrics": dg.MetadataValue.md(plot),
        }, preview=False, asset="grpo_run", data_version=key)

    @dg.asset(deps=["grpo_run", train_table, *init_deps], group_name="training", kinds={"duckdb"},
              code_version=short_hash(canonical_json([cfg.training.eval_k, cfg.training.max_completion_length])))
    def pivot_eval(context: dg.AssetExecutionContext, settings: PivotSettings) -> dg.MaterializeResult:
        """Local accuracy (mean verifier reward over K samples) on held-out pivots and OOD-probe accuracy,
        for the reference, SFT and GRPO policies side by side."""
        cfg = settings.load()
        wh = Warehouse(cfg.warehouse_dir)
        rows = evaluate_policies(wh, cfg, context.log.info)
        wh.write_table("pivot_eval", pa.Table.from_pylist(rows))
        table = "\n".join(
            ["| policy | n_pivots | k | local_accuracy | ood_accuracy |", "|---|---|---|---|---|"]
            + [f"| {r['policy']} | {r['n_pivots']} | {r['k']} | {_fmt(r['local_accuracy'])} | {_fmt(r['ood_accuracy'])} |"
               for r in rows]
        )
        return publish(wh, "pivot_eval", {"comparison": dg.MetadataValue.md(table)}, preview=False)

    return [grpo_run, pivot_eval]


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


# -- evaluation -----------------------------------------------------------------------------------
def held_out_pivots(wh: Warehouse, cfg: PivotConfig) -> list[dict]:
    """Pivots of the training set whose trajectory is held out (never trained on by SFT or GRPO)."""
    held_out = held_out_trajectories(wh, cfg)
    in_held_out = pl.col("trajectory_id").is_in(sorted(held_out))
    pivots = wh.read(SET_TABLES[cfg.training.set]).filter(in_held_out)
    trajectories = {t["trajectory_id"]: t for t in wh.read("trajectories").filter(in_held_out).iter_rows(named=True)}
    out = []
    for p in pivots.sort("turn_id").iter_rows(named=True):
        traj = trajectories[p["trajectory_id"]]
        out.append({"turn_id": p["turn_id"], "domain": p["domain"], "expert_action": p["expert_action"],
                    "messages": list(traj["messages"][: p["message_index"]]), "tools": json.loads(traj["tools"] or "[]")})
    return out


def evaluation_policies(wh: Warehouse, cfg: PivotConfig) -> list[tuple[str, str]]:
    policies = [("reference", base_model(cfg))]
    for name, folder in (("sft", "sft_policy"), ("grpo", "grpo_policy")):
        if read_marker(model_dir(wh, folder)):
            policies.append((name, str(model_dir(wh, folder))))
    return policies


def evaluate_policies(wh: Warehouse, cfg: PivotConfig, log) -> list[dict]:
    """One row per policy; rows already computed for the same model and held-out set are reused."""
    from pivot_assets.evaluation import local_accuracy, ood_accuracy
    from pivot_assets.ood_probe import ood_probe_items
    from pivot_assets.policies.models import policy_fingerprint
    from pivot_assets.profiling import verifier_set

    verifiers = verifier_set(cfg)
    pivots = held_out_pivots(wh, cfg)
    eval_key = short_hash(canonical_json({
        "turns": [p["turn_id"] for p in pivots], "k": cfg.training.eval_k, "verifier": verifiers.fingerprint,
        "max_new_tokens": cfg.training.max_completion_length, "seed": cfg.training.seed,
    }))
    cached = {}
    if wh.exists("pivot_eval"):
        cached = {(r["policy"], r["model_fp"], r["eval_key"]): r for r in wh.read("pivot_eval").iter_rows(named=True)}
    rows = []
    for policy, model in evaluation_policies(wh, cfg):
        model_fp = policy_fingerprint(model)
        if (policy, model_fp, eval_key) in cached:
            log(f"pivot_eval: {policy} unchanged, reusing its row")
            rows.append(cached[(policy, model_fp, eval_key)])
            continue
        with timed() as t:
            local = (local_accuracy(model, pivots, verifiers, k=cfg.training.eval_k,
                                    max_new_tokens=cfg.training.max_completion_length, seed=cfg.training.seed)
                     if pivots else {"n_pivots": 0, "k": cfg.training.eval_k, "local_accuracy": None})
            ood = ood_accuracy(model, ood_probe_items(), seed=cfg.training.seed)
        log(f"pivot_eval: {policy}: local {_fmt(local['local_accuracy'])} on {local['n_pivots']} pivots, ood {ood:.3f}")
        rows.append({"policy": policy, "model_fp": model_fp, "eval_key": eval_key, "n_pivots": local["n_pivots"],
                     "k": local["k"], "local_accuracy": local["local_accuracy"], "ood_accuracy": ood,
                     "seconds": round(t["seconds"], 1)})
    return rows
