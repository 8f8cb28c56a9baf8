"""bench/decisive.py's planning, without training: the jobs come seed by seed (train and evaluate each arm in one
job, then the seed's reference), a model the work dir lacks is trained again under retrain_*, and the units of an
incomplete seed from another phase (a) block move to superseded/ while a complete seed stays whatever its block."""

from __future__ import annotations

from pathlib import Path

import polars as pl

ARMS, SEEDS = ["grpo_adv", "grpo_cand"], [0, 1]


def _write(path: Path, block: str | None) -> None:
    frame = pl.DataFrame({"step": [1], "host": ["h"]})
    (frame if block is None else frame.with_columns(pl.lit(block).alias("block"))).write_parquet(path)


def test_jobs_come_seed_by_seed_and_a_missing_model_is_trained_again(decisive, tmp_path):
    train_units, eval_units = decisive.unit_plan(ARMS, SEEDS)
    missing_eval = [u for u in eval_units if u != ("reference", 0)]
    tasks = decisive.unit_tasks(train_units, eval_units, [("grpo_cand", 0), *[(a, 1) for a in ARMS]],
                                missing_eval, tmp_path, has_model=lambda a, s: False)
    order = [(t["model"], t["seed"], Path(t["train_out"]).name if t["train_out"] else None,
              Path(t["eval_out"]).name if t["eval_out"] else None) for t in tasks]
    assert order == [
        ("grpo_adv", 0, "retrain_grpo_adv_s0.parquet", "eval_grpo_adv_d0.parquet"),  # its model is gone: retrained
        ("grpo_cand", 0, "train_grpo_cand_s0.parquet", "eval_grpo_cand_d0.parquet"),
        ("grpo_adv", 1, "train_grpo_adv_s1.parquet", "eval_grpo_adv_d1.parquet"),
        ("grpo_cand", 1, "train_grpo_cand_s1.parquet", "eval_grpo_cand_d1.parquet"),
        ("reference", 1, None, "eval_reference_d1.parquet"),
    ]
    kept = decisive.unit_tasks(train_units, eval_units, [], [("grpo_adv", 0)], tmp_path, has_model=lambda a, s: True)
    assert [(t["model"], t["train_out"]) for t in kept] == [("grpo_adv", None)]  # its model is there: evaluated only


def test_incomplete_seeds_of_another_block_move_to_superseded(decisive, tmp_path):
    for name in ("train_grpo_adv_s0", "train_grpo_cand_s0", "eval_grpo_adv_d0", "eval_grpo_cand_d0",
                 "eval_reference_d0"):
        _write(tmp_path / f"{name}.parquet", "old")  # seed 0: complete, from another block
    _write(tmp_path / "train_grpo_adv_s1.parquet", None)  # seed 1: incomplete, predates blocks
    _write(tmp_path / "train_grpo_cand_s1.parquet", "new")  # same block: stays
    moved = decisive.supersede_other_blocks(tmp_path, SEEDS, ARMS, "new")
    assert moved == ["train_grpo_adv_s1.parquet"]
    assert (tmp_path / "superseded" / "train_grpo_adv_s1.parquet").is_file()
    assert (tmp_path / "train_grpo_cand_s1.parquet").is_file() and (tmp_path / "train_grpo_adv_s0.parquet").is_file()
    assert decisive.supersede_other_blocks(tmp_path, SEEDS, ARMS, "new") == []  # nothing left to move


def test_the_report_names_each_seeds_block_and_machine(decisive):
    train = pl.DataFrame({"seed": [0, 0, 1], "block": ["b0", "b0", "b1"], "host": ["vm", "vm", "vm"],
                          "machine": [None, None, "Xeon, 2 usable cores"]})
    ev = pl.DataFrame({"draw": [0], "block": ["b0"], "host": ["vm"]})
    prep = {"runs": [{"host": "vm", "block": "b0", "machine": "EPYC, 2 usable cores"}, {"host": "vm"}]}
    lines = decisive.seed_lines(train, ev, [0, 1, 2], prep)
    assert lines[-3:] == ["| 0 | b0 | EPYC, 2 usable cores |", "| 1 | b1 | Xeon, 2 usable cores |",
                          "| 2 | (not run) | |"]


def test_a_pair_verdict_says_better_worse_or_the_seeds_the_measured_variance_asks_for(decisive):
    diffs = {0: [0.25, 0.0, -0.25, 0.5] * 50, 1: [0.0, 0.25, 0.0, 0.25] * 50, 2: [0.25, -0.25, 0.25, 0.0] * 50}
    c = decisive.pair_components(diffs)
    assert c["I"] == 200 and c["w"] > c["sd2"] >= 0.0 and c["s_seed"] > 0
    assert decisive.pair_half_width(c, 12, c["tau2"]) < decisive.pair_half_width(c, 3, c["tau2"])
    p = {"delta": 0.06, "delta_low": -0.01, "delta_high": 0.13}
    need = decisive.seeds_to_decide(c, p["delta"])
    assert need is not None and decisive.pair_half_width(c, need, c["tau2"]) < 0.06
    assert need == 1 or decisive.pair_half_width(c, need - 1, c["tau2"]) >= 0.06  # the fewest
    assert decisive.verdict_words(p, c).endswith(f"the measured variance asks for {need} seeds")
    assert decisive.verdict_words({**p, "delta_low": 0.01}, c).startswith("better")
    assert decisive.verdict_words({"delta": -0.06, "delta_low": -0.1, "delta_high": -0.02}, c).startswith("worse")
    assert decisive.verdict_words(None, None) == "not run yet"
    assert decisive.pair_components({0: diffs[0]}) is None  # one seed: no seed variance
