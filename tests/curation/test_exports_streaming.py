"""Warehouse exports, streamed: every dataset in ../shared/data (and empty sets) through real ingest, turn
extraction, selection and both export formats; the streamed rows equal the in-memory exports."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from datasets import load_from_disk

from pivot_assets.core.catalog import PIVOT_SETS, REWARDS_SCHEMA, SET_TABLES
from pivot_assets.core.config import PivotConfig, PivotsSection
from pivot_assets.core.ids import seeded_unit
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.curation import exports
from pivot_assets.curation.tables import export_set, select_and_write
from pivot_assets.ingest.inputs import write_ingest, write_turns
from tests.ingest.reference import iter_ingest

DATASETS = ["nemo-gym", "tau2-bench", "bfcl",
            *(f"nemo-gym/resources_servers/{name}" for name in ("single_step_tool_use_with_argument_comparison",
                                                                 "workplace_assistant", "xlam_fc"))]


def profiled_warehouse(root: Path, inputs: list[dict], mixed: bool = True) -> Warehouse:
    """Real ingest and turns; profiles drawn per turn (K=4, seeded), all zero-variance when not `mixed`."""
    wh = Warehouse(root)
    write_ingest(wh, inputs)
    write_turns(wh)
    turns = duckdb.sql(f"select turn_id, trajectory_id, domain from read_parquet('{wh.table_path('turns')}')").fetchall()
    n_pass = [int(seeded_unit(0, t[0]) * 5) if mixed else 4 for t in turns]
    means = [p / 4 for p in n_pass]
    wh.write_table("turn_profiles", pa.table({
        "turn_id": [t[0] for t in turns], "trajectory_id": [t[1] for t in turns], "domain": [t[2] for t in turns],
        "policy_fp": ["p"] * len(turns), "sampling_fp": ["s"] * len(turns), "verifier_fp": ["v"] * len(turns),
        "k": pa.array([4] * len(turns), pa.int32()), "reward_mean": means,
        "reward_var": [m * (1 - m) for m in means], "reward_std": [(m * (1 - m)) ** 0.5 for m in means],
        "n_pass": pa.array(n_pass, pa.int32()), "n_distinct_actions": pa.array([2] * len(turns), pa.int32()),
    }, schema=pa.schema([("turn_id", pa.string()), ("trajectory_id", pa.string()), ("domain", pa.string()),
                         ("policy_fp", pa.string()), ("sampling_fp", pa.string()), ("verifier_fp", pa.string()),
                         ("k", pa.int32()), ("reward_mean", pa.float64()), ("reward_var", pa.float64()),
                         ("reward_std", pa.float64()), ("n_pass", pa.int32()), ("n_distinct_actions", pa.int32())])))
    wh.write_table("rollout_rewards", sample_rewards([t[0] for t in turns], n_pass))
    select_and_write(wh, PivotsSection(lambda_diff=0.6))
    return wh


def sample_rewards(turn_ids: list[str], n_pass: list[int]) -> pa.Table:
    """rollout_rewards behind those profiles: K=4 samples per turn, the passes last, written last sample first
    (the export orders by sample_index); plus rows that are not the profile's, which the export must skip: a
    fifth sample (a larger budget's, index >= k) and a sample scored by another verifier."""
    rows = []
    for turn, passed in zip(turn_ids, n_pass):
        for i in reversed(range(4)):
            rows.append((turn, "v", i, 1.0 if i >= 4 - passed else 0.0))
        rows += [(turn, "v", 4, 0.5), (turn, "other-verifier", 0, 0.25)]
    return pa.Table.from_pylist([
        {"turn_id": t, "policy_fp": "p", "sampling_fp": "s", "sample_index": i, "verifier_fp": v, "domain": None,
         "reward": r, "reason": None, "detail": None, "action": None} for t, v, i, r in rows], schema=REWARDS_SCHEMA)



def export_all(wh: Warehouse, cfg: PivotConfig, out: Path) -> dict[str, int]:
    sizes = {}
    for pivot_set in PIVOT_SETS:
        table = SET_TABLES[pivot_set]
        n = wh.read(table).height
        sizes[pivot_set] = n
        hf = export_set(Warehouse(cfg.warehouse_dir), pivot_set, "hf", out / f"{pivot_set}_hf")
        dataset = load_from_disk(str(hf))
        assert len(dataset) == n and "conversation_id" in dataset.column_names
        path = export_set(Warehouse(cfg.warehouse_dir), pivot_set, "nemo-gym", out / f"{pivot_set}.jsonl")
        lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert len(lines) == n
        if n:
            assert_streamed_equals_in_memory(wh, table, dataset, lines)
            assert_nemo_rows_read_back(path, lines)
    return sizes


def assert_streamed_equals_in_memory(wh: Warehouse, table: str, dataset, lines: list[dict]) -> None:
    pivots, trajectories = wh.read(table), wh.read("trajectories")
    in_memory = exports.to_hf_dataset(pivots, trajectories)
    assert dataset.to_list() == in_memory.to_list()
    rewards = wh.read("rollout_rewards")
    assert lines == json.loads(json.dumps(list(exports.to_nemo_gym_rows(pivots, trajectories, rewards=rewards))))
    assert all(line["metadata"]["conversation_id"] for line in lines)
    for line in lines:
        profile, n_pass = line["qwen_235b_info"], line["metadata"]["n_pass"]
        assert profile["rewards"] == [0.0] * (4 - n_pass) + [1.0] * n_pass
        assert profile["reward_mean"] == line["metadata"]["reward_mean"] == n_pass / 4 == line["pass_rate"]
        assert (line["pass_rate_total"], line["pass_rate_passed"]) == (4, n_pass)
        assert line["trajectory_id"] == line["metadata"]["trajectory_id"]


def assert_nemo_rows_read_back(path: Path, lines: list[dict]) -> None:
    """Our own Responses reader takes every exported row back as a trajectory whose last turn is the pivot."""
    back = list(iter_ingest([{"path": str(path), "format": "responses"}]))
    assert [kind for kind, _ in back].count("quarantine") == 0
    assert len(back) == len(lines)


@pytest.mark.scenario
@pytest.mark.parametrize("dataset", DATASETS)
def test_every_shared_dataset_exports_in_both_formats(dataset, tmp_path, shared_data_dir):
    wh = profiled_warehouse(tmp_path / "wh", [{"path": str(shared_data_dir / dataset)}])
    cfg = PivotConfig.model_validate({"warehouse": str(wh.root)})
    sizes = export_all(wh, cfg, tmp_path / "out")
    n_turns = wh.read("turns").height
    assert sizes["mixed"] <= n_turns and sizes["adv"] <= sizes["mixed"]


def test_empty_sets_export_empty_datasets(tmp_path, shared_data_dir):
    wh = profiled_warehouse(tmp_path / "wh", [{"path": str(shared_data_dir / "tau2-bench")}], mixed=False)
    cfg = PivotConfig.model_validate({"warehouse": str(wh.root)})
    assert export_all(wh, cfg, tmp_path / "out") == {"mixed": 0, "adv": 0, "cand": 0}
    features = load_from_disk(str(tmp_path / "out" / "adv_hf")).features
    assert features["prompt"].feature["tool_calls"].feature["function"]["arguments"].__class__.__name__ == "Json"


def test_a_batch_without_any_tool_call_still_builds(tmp_path, shared_data_dir):
    """The reported failure: a batch whose prompts hold no tool call ('MakeBuilder: cannot construct builder for
    type extension<arrow.json>'). Early airline turns have none; exported alone, in batches of one."""
    wh = profiled_warehouse(tmp_path / "wh", [{"path": str(shared_data_dir / "tau2-bench")}])
    table = SET_TABLES["mixed"]
    states = list(exports.stream_pivot_states(wh.source_glob(table), wh.source_glob("trajectories")))
    no_calls = [s for s in states if not any(m.get("tool_calls") for m in s[1])]
    assert no_calls and len(no_calls) < len(states)
    n = exports.export_hf(iter(no_calls + states), tmp_path / "hf", batch_size=1)
    dataset = load_from_disk(str(tmp_path / "hf"))
    assert n == len(dataset) == len(no_calls) + len(states)
    with_calls = next(row for row in dataset if any(m["tool_calls"] for m in row["prompt"]))
    call = next(c for m in with_calls["prompt"] for c in m["tool_calls"] or [])
    assert isinstance(call["function"]["arguments"], dict)  # Json reads back as an object


def test_stream_errors_name_the_pivot(tmp_path, shared_data_dir):
    wh = profiled_warehouse(tmp_path / "wh", [{"path": str(shared_data_dir / "tau2-bench")}])
    pivots = wh.read("pivots_mixed")
    import polars as pl

    wh.write_table("pivots_mixed", pivots.with_columns(pl.lit(0).cast(pl.Int64).alias("message_index")).to_arrow())
    with pytest.raises(ValueError, match="is not an assistant message"):
        list(exports.stream_pivot_states(wh.source_glob("pivots_mixed"), wh.source_glob("trajectories")))
    wh.write_table("pivots_mixed", pivots.with_columns(pl.lit("nope").alias("trajectory_id")).to_arrow())
    with pytest.raises(ValueError, match="not in trajectories"):
        list(exports.stream_pivot_states(wh.source_glob("pivots_mixed"), wh.source_glob("trajectories")))
