"""The training stage through Dagster: sft_policy -> grpo_run -> pivot_eval and the ablation on a tiny config.

A graded, fact-blind string verifier gives every profiled turn a continuous reward, so the tiny warm-up
policy yields pivots; the point here is the wiring: the configured backend, dtype and device reach
evaluation (the policies are sampled and probed with them), every ablation arm gets its own model and rows,
the ablation_table and ablation_pairs_table views read them, the three-way split keeps the warm-up's
conversations out of profiling, every arm makes one pass over its pool, and a second run trains and samples
nothing.
"""

from __future__ import annotations

import pytest

from pivot_jobs.cli import main as pivot

CONFIG = """
warehouse: ./wh
sample: {n_trajectories: 12, seed: 3}
sft: {model: MODEL, steps: 2, batch_size: 2, max_length: 1024}
policy: {backend: transformers, model: sft, k: 2, max_new_tokens: 12, dtype: bfloat16, device: cpu}
verifier:
  default: {name: string_similarity, graded: true, facts: ignore}
pivots: {lambda_diff: 0.95, max_per_trajectory: 1}   # one pivot per trajectory: tiny pools, short arm runs
training: {set: adv, init: sft, steps: 1, num_generations: 2, max_completion_length: 8, eval_fraction: 0.4,
           warmup_fraction: 0.5}
evaluation: {k: 2, max_turns: 6, ood_max_items: 12, bootstrap: 200}
ablation: {arms: [grpo_adv, sft_same_data], seeds: [0], epochs: 1, primary: profiled}   # several: test_ablation_pools
runtime: {workers: 1}   # the spies below see this process only; the workers' path is checked at the end
"""


def config(model_dir) -> str:
    """CONFIG warming up from `model_dir` (the tiny test policy: the wiring, not the model, is under test)."""
    return CONFIG.replace("MODEL", str(model_dir))


@pytest.mark.scenario
def test_sft_grpo_eval_materialize_and_evaluation_uses_the_configured_engine(tmp_path, monkeypatch,
                                                                             tiny_model_dir, capsys):
    import pivot_assets.policies.factory as factory
    import pivot_assets.policies.models as models

    engines, loads = [], []
    real_build, real_load = factory.build_backend, models.load_model

    def spy_build(policy, *, model=None, **kw):  # kw: the engine's threads
        engines.append((factory.policy_section(policy).backend, factory.policy_section(policy).dtype,
                        factory.policy_section(policy).device, model))
        return real_build(policy, model=model, **kw)

    def spy_load(model="embedded", dtype="float32", device="cpu", **kw):  # kw: the prompt format (fmt)
        loads.append((str(model), dtype, device))
        return real_load(model, dtype=dtype, device=device, **kw)

    monkeypatch.setattr(factory, "build_backend", spy_build)
    monkeypatch.setattr(models, "load_model", spy_load)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pivot.yaml").write_text(config(tiny_model_dir))

    assert pivot(["run"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert "materialized" in out.out and "pivot_eval" in out.out

    import duckdb

    con = duckdb.connect(str(tmp_path / "wh" / "pivot.duckdb"), read_only=True)
    rows = con.sql("select policy, backend, dtype, device, n, k from pivot_eval where eval_set = 'adv' "
                   "order by policy").fetchall()
    assert [r[0] for r in rows] == ["base", "grpo_adv", "reference"]  # policy.model: sft -> the warm-up is the reference
    assert {r[1:4] for r in rows} == {("transformers", "bfloat16", "cpu")}
    assert all(r[5] == 2 for r in rows)
    assert {r[0] for r in con.sql("select distinct eval_set from pivot_eval").fetchall()} == {"profiled", "mixed", "adv", "ood"}
    ref = con.sql("select delta, delta_low, delta_high from pivot_eval where policy = 'reference'").fetchall()
    assert all(r == (0.0, 0.0, 0.0) for r in ref if r[0] is not None)
    assert con.sql("select count(*) from policy_comparison").fetchone()[0] == 3 * 4

    # the three-way split: the warm-up trained on its own conversations, which profiling never saw
    from pivot_assets.core.split import HELD_OUT, WARMUP, ConversationSplit
    from pivot_assets.core.warehouse import Warehouse

    wh = Warehouse(tmp_path / "wh")
    split = ConversationSplit(0.4, 0.5, 0)
    warmup, held_out = split.trajectories(wh, WARMUP), split.trajectories(wh, HELD_OUT)
    profiled = set(con.sql("select u.trajectory_id from turn_profiles p join turns u using (turn_id)")
                   .fetchnumpy()["trajectory_id"])
    assert warmup and held_out and profiled and not profiled & warmup and held_out <= profiled

    # the ablation: one model dir per arm and seed, rows keyed by arm and seed, the named views
    arms = con.sql("select distinct arm, seed from ablation_results where arm is not null order by arm").fetchall()
    assert arms == [("grpo_adv", 0), ("sft_same_data", 0)]
    models = sorted(p.name for p in (tmp_path / "wh" / "models").iterdir() if p.name.startswith("ablation_"))
    assert models == ["ablation_grpo_adv_s0", "ablation_sft_same_data_s0"]
    table = con.sql("select arm, seeds, n_seeds, primary_set, n, n_ood from ablation_table").fetchall()
    assert [r[:3] for r in table] == [("base", "", 1), ("reference", "", 1), ("grpo_adv", "0", 1),
                                      ("sft_same_data", "0", 1)]
    assert {r[3] for r in table} == {"profiled"} and all(r[5] == 12 for r in table)
    pairs = con.sql("select pair, n_seeds, excludes_zero from ablation_pairs_table where \"primary\"").fetchall()
    assert [p[:2] for p in pairs] == [("grpo_adv - sft_same_data", 1)] and pairs[0][2] is not None
    # every arm made one pass over its pool (one prompt group per GRPO step), SFT and GRPO on D_adv saw the same
    # turns, useful share and tokens logged
    runs = {r["arm"]: r for r in con.sql("select * from ablation_runs").pl().to_dicts()}
    adv, sft = runs["grpo_adv"], runs["sft_same_data"]
    assert adv["turns_trained"] == adv["pool"] == adv["steps"] > 0 and 0.0 <= adv["useful_share"] <= 1.0
    assert sft["turns_trained_fp"] == adv["turns_trained_fp"] and sft["steps"] == -(-adv["pool"] // 2)
    assert adv["tokens"] > 0 and sft["tokens"] > 0
    # the base model is scored with seed 0's draw: pivot_eval's own measurement (same draws, same sets)
    same = con.sql("select count(*) from pivot_eval p join ablation_results a using (policy, eval_set) "
                   "where policy = 'base' and p.accuracy is not distinct from a.accuracy").fetchone()[0]
    assert same == 4
    assert (tmp_path / "wh" / "plots" / "ablation_results.png").is_file()
    # what really ran: the evaluation engines and the OOD probe's model loads used the configured engine
    eval_engines = [e for e in engines if e[3] and ("grpo_policy" in e[3] or e[3] == str(tiny_model_dir))]
    assert eval_engines and {e[:3] for e in eval_engines} == {("transformers", "bfloat16", "cpu")}
    probe_loads = [ld for ld in loads if ld[1] == "bfloat16"]
    assert {ld[0].rsplit("/", 1)[-1] for ld in probe_loads} >= {"grpo_policy", "sft_policy"}
    steps = con.sql("select count(*) from grpo_steps").fetchone()[0]
    assert steps == 1
    con.close()

    # A second run reuses every model and evaluation row: nothing is trained or sampled again.
    engines.clear()
    assert pivot(["run", "--select", "sft_policy,grpo_run,pivot_eval,ablation_results"]) == 0
    assert engines == []
    import dagster as dg

    for asset in ("sft_policy", "grpo_run"):  # each ran and found its model with the same key: not retrained
        event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey(asset))
        assert event.asset_materialization.metadata["skipped"].value is True, asset

    # A warehouse copied to another directory regenerates nothing (identities are by content, not by place), and
    # no table or export carries a local path.
    import shutil

    shutil.copytree(tmp_path / "wh", tmp_path / "moved" / "wh")
    (tmp_path / "pivot.yaml").write_text(config(tiny_model_dir).replace("warehouse: ./wh", "warehouse: ./moved/wh"))
    engines.clear()
    assert pivot(["run"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert engines == []
    moved = tmp_path / "moved" / "wh"
    assert sorted(p.name for p in (moved / "rollouts").rglob("*.parquet")) == \
        sorted(p.name for p in (tmp_path / "wh" / "rollouts").rglob("*.parquet"))
    with duckdb.connect(str(moved / "pivot.duckdb"), read_only=True) as con:
        fps = {r[0] for r in con.sql("select distinct policy_fp from turn_profiles").fetchall()}
    assert fps and all(str(tmp_path) not in fp and fp.startswith("local|w:") for fp in fps), fps
    exported = (moved / "exports" / "pivots_adv.jsonl").read_text()
    assert str(tmp_path) not in exported
    (tmp_path / "pivot.yaml").write_text(config(tiny_model_dir))

    # Evaluation in 2 worker processes gives exactly the serial numbers (the same seeded draws per turn).

    serial = _eval_rows(tmp_path)
    shutil.rmtree(tmp_path / "wh" / "eval_cache")
    (tmp_path / "pivot.yaml").write_text(config(tiny_model_dir).replace("workers: 1", "workers: 2"))
    assert pivot(["run", "--select", "pivot_eval"]) == 0, capsys.readouterr().err
    assert "2 at a time in worker processes" in capsys.readouterr().err
    assert _eval_rows(tmp_path) == serial


def _eval_rows(tmp_path):
    import duckdb

    with duckdb.connect(str(tmp_path / "wh" / "pivot.duckdb"), read_only=True) as con:
        return con.sql("select policy, eval_set, n, accuracy, ci_low, ci_high, delta from pivot_eval "
                       "order by policy, eval_set").fetchall()
