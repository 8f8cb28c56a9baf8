"""The training stage through Dagster: sft_policy -> grpo_run -> pivot_eval and the ablation on a tiny config.

A graded, fact-blind string verifier gives every profiled turn a continuous reward, so the tiny warm-up
policy yields pivots; the point here is the wiring: the configured backend, dtype and device reach
evaluation (the policies are sampled and probed with them), every ablation arm gets its own model and rows,
the ablation_table view reads them, and a second run trains and samples nothing.
"""

from __future__ import annotations

import pytest

from pivot_assets.cli import main as pivot

CONFIG = """
warehouse: ./wh
sample: {n_trajectories: 8, seed: 3}
sft: {steps: 2, batch_size: 2, max_length: 1024}
policy: {backend: transformers, model: sft, k: 2, max_new_tokens: 12, dtype: bfloat16, device: cpu}
verifier:
  default: {name: string_similarity, graded: true, facts: ignore}
pivots: {lambda_diff: 0.95}
training: {set: adv, init: sft, steps: 1, num_generations: 2, max_completion_length: 8, eval_fraction: 0.5,
           eval_k: 2, ood_max_items: 12, bootstrap: 200}
ablation: {arms: [grpo_adv_exact, sft_same_data], seeds: [0], steps: 1}
runtime: {workers: 1}   # the spies below see this process only; the workers' path is checked at the end
"""


@pytest.mark.slow
def test_sft_grpo_eval_materialize_and_evaluation_uses_the_configured_engine(tmp_path, monkeypatch,
                                                                             embedded_model_dir, capsys):
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
    (tmp_path / "pivot.yaml").write_text(CONFIG)

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

    # the ablation: one model dir per arm, rows keyed by arm and seed, the named view
    arms = con.sql("select distinct arm, seed from ablation_results where arm is not null order by arm").fetchall()
    assert arms == [("grpo_adv_exact", 0), ("sft_same_data", 0)]
    models = sorted(p.name for p in (tmp_path / "wh" / "models").iterdir() if p.name.startswith("ablation_"))
    assert models == ["ablation_grpo_adv_exact_s0", "ablation_sft_same_data_s0"]
    table = con.sql("select arm, n_adv, n_ood from ablation_table").fetchall()
    assert [r[0] for r in table] == ["base", "reference", "grpo_adv_exact", "sft_same_data"]
    assert all(r[2] == 12 for r in table)
    # the reference rows of pivot_eval and the ablation are the same measurement (same draws, same sets)
    same = con.sql("select count(*) from pivot_eval p join ablation_results a using (policy, eval_set, eval_key) "
                   "where policy in ('base', 'reference') and p.accuracy is not distinct from a.accuracy").fetchone()[0]
    assert same == 2 * 4
    assert (tmp_path / "wh" / "plots" / "ablation_results.png").is_file()
    # what really ran: the evaluation engines and the OOD probe's model loads used the configured engine
    eval_engines = [e for e in engines if e[3] and ("grpo_policy" in e[3] or e[3] == "embedded")]
    assert eval_engines and {e[:3] for e in eval_engines} == {("transformers", "bfloat16", "cpu")}
    probe_loads = [ld for ld in loads if ld[1] == "bfloat16"]
    assert {ld[0].rsplit("/", 1)[-1] for ld in probe_loads} >= {"grpo_policy", "sft_policy"}
    steps = con.sql("select count(*) from grpo_steps").fetchone()[0]
    assert steps == 1
    con.close()

    # A second run reuses every model and evaluation row: nothing is trained or sampled again.
    engines.clear()
    assert pivot(["run", "--select", "sft_policy,grpo_run,pivot_eval,ablation_results"]) == 0
    err = capsys.readouterr().err
    assert "not retraining" in err or engines == []
    assert engines == []

    # Evaluation in 2 worker processes gives exactly the serial numbers (the same seeded draws per turn).
    import shutil

    serial = _eval_rows(tmp_path)
    shutil.rmtree(tmp_path / "wh" / "eval_cache")
    (tmp_path / "pivot.yaml").write_text(CONFIG.replace("workers: 1", "workers: 2"))
    assert pivot(["run", "--select", "pivot_eval"]) == 0, capsys.readouterr().err
    assert "2 at a time in worker processes" in capsys.readouterr().err
    assert _eval_rows(tmp_path) == serial


def _eval_rows(tmp_path):
    import duckdb

    with duckdb.connect(str(tmp_path / "wh" / "pivot.duckdb"), read_only=True) as con:
        return con.sql("select policy, eval_set, n, accuracy, ci_low, ci_high, delta from pivot_eval "
                       "order by policy, eval_set").fetchall()
