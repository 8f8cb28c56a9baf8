"""Progress lines: cached units count as done but never make a rate."""

from __future__ import annotations

import time

from pivot_assets.core.progress import Progress


def test_cached_units_make_no_rate_and_worked_ones_do():
    lines: list[str] = []
    p = Progress(total=3, unit="policies evaluated", log=lines.append, every_s=0)
    p.update(1, "reference (cached)", cached=True)
    assert lines[-1] == "policies evaluated: 1/3 (cached) reference (cached)"
    time.sleep(0.05)
    p.update(1, "grpo")
    rate = float(lines[-1].split("(")[1].split("/s")[0])
    assert 0 < rate <= 1 / 0.05  # one worked unit over >= 50 ms, not two units
    assert "ETA" in lines[-1]


def test_a_resumed_run_counts_the_checkpointed_steps_as_cached_and_ends_at_its_total():
    lines: list[str] = []
    p = Progress(total=3, unit="grpo steps", log=lines.append, every_s=0)
    p.reach(3, "loss 0.1")  # steps 1 and 2 came from the checkpoint
    assert lines[0] == "grpo steps: 2/3 (cached)" and lines[-1].startswith("grpo steps: 3/3 (")
    assert p.worked == 1
    p.reach(3)  # the same step again moves nothing
    assert p.done == 3 and len(lines) == 2


def test_previews_lead_with_the_id_then_the_figures_and_leave_out_fingerprints():
    import polars as pl

    from pivot_assets.materialization import preview_columns

    df = pl.DataFrame({"trajectory_id": ["t"], "turn_id": ["u"], "policy_fp": ["ab" * 20], "domain": ["d"],
                       "k": [8], "reward_mean": [0.5], "messages": [[1, 2]]})
    assert preview_columns(df) == ["trajectory_id", "k", "reward_mean", "turn_id", "domain"]
