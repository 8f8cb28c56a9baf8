"""bench/decisive.py on a tiny slice, driven through bench/gpu/decisive.sh's CPU slice (the built-in sample, the tiny
policy, one seed, a two-rate sweep): a slice cut by its time limit ends in one line with rc 0 and the next invocation
completes the run; its report comes from the unit files alone (the same text with the warehouse deleted); a run
killed with -9 after its first unit file resumes without recomputing any unit whose file existed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "bench" / "decisive.py"
SCRIPT = ROOT / "bench" / "gpu" / "decisive.sh"
SLICE_CONFIG = "decisive_cpu_slice.yaml"  # what the script writes into its WORK dir without CUDA
UNITS = 2 + 3  # train: 2 arms x 1 seed; eval: (reference + 2 arms) x 1 draw
COUNT = re.compile(r"decisive: computed (\d+) unit\(s\) \(train (\d+), eval (\d+)\); (\d+) already present")


def _cmd(config: Path, data: Path, work: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(RUNNER), "--config", str(config), "--data", str(data), "--work", str(work),
            "--out", str(out), "--png", str(out.with_name(f"{out.stem}_curves.png")), *extra]  # as the script names it


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def _script(model: Path, slice_s: int, data: Path, work: Path, out: Path) -> str:
    env = {**_env(), "MODEL": str(model), "SLICE_S": str(slice_s), "WORK": str(work), "DATA": str(data),
           "OUT": str(out), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _results(text: str) -> str:
    return text[text.index("## Results"):]


def _units(data: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in data.glob("*.parquet") if not p.name.startswith("sweep_")}


def _sweep_units(data: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in data.glob("sweep_*.parquet")}


@pytest.mark.scenario
def test_the_cpu_slice_resumes_reports_from_units_alone_and_survives_kill_9(tmp_path, tiny_model_dir):
    import polars as pl

    data, work, out = tmp_path / "data", tmp_path / "work", tmp_path / "out.md"
    # 1. a slice cut by its limit: one line, rc 0; the next one completes. 1 s is certain to cut it on any machine:
    # the runner's imports alone (torch, transformers, dagster) take longer, so this cannot pass by finishing early
    cut = _script(tiny_model_dir, 1, data, work, out)
    assert "slice over after 1 s" in cut and "run it again to continue" in cut
    stdout = _script(tiny_model_dir, 600, data, work, out)
    config = tmp_path / SLICE_CONFIG
    shutil.copy(work / SLICE_CONFIG, config)
    computed, train, ev, present = map(int, COUNT.search(stdout).groups())
    assert (train, ev) == (2, 3) and computed + present == UNITS
    assert len(_units(data)) == UNITS and not list(data.glob(".*.tmp"))
    steps = pl.read_parquet(data / "train_grpo_adv_s0.parquet")
    assert {"step", "reward_mean", "frac_reward_zero_std", "useful", "loss", "train_s"} <= set(steps.columns)
    assert steps.height == steps["steps_total"][0] >= 1
    samples = pl.read_parquet(data / "eval_reference_d0.parquet")
    assert {"turn_id", "conversation_id", "sample", "reward", "seconds"} <= set(samples.columns)
    assert samples.height == samples["turn_id"].n_unique() * 2  # eval_k samples per held-out turn
    first = out.read_text()
    assert "grpo_adv − grpo_cand (profiled, primary" in first and "**Verdict:" in first
    # the sweep ran first (a unit per rate and the reference's), its choice is the rate both arms trained at
    assert set(_sweep_units(data)) == {"sweep_train_lr_0p001.parquet", "sweep_train_lr_0p01.parquet",
                                       "sweep_eval_sweep_lr_0p001.parquet", "sweep_eval_sweep_lr_0p01.parquet",
                                       "sweep_eval_reference.parquet"}
    chosen = float(re.search(r"\*\*Chosen: ([0-9.e-]+)\.\*\*", first).group(1))
    assert first.index("## Learning-rate sweep") < first.index("## Results")
    rates = {r for a in ("grpo_adv", "grpo_cand")
             for r in pl.read_parquet(data / f"train_{a}_s0.parquet")["learning_rate"].to_list()}
    assert rates == {chosen}
    sweep_eval = pl.read_parquet(data / "sweep_eval_reference.parquet")
    held_out = set(samples["turn_id"].to_list())
    assert sweep_eval["turn_id"].n_unique() <= 3 and not set(sweep_eval["turn_id"].to_list()) & held_out
    assert (tmp_path / "out_curves.png").stat().st_size > 0

    # 2. the report from the unit files alone: the warehouse gone, the same numbers
    work2 = tmp_path / "work2"  # a copy without the arms' models: the killed run below trains them again
    shutil.copytree(work, work2, ignore=shutil.ignore_patterns("ablation_grpo_*"))
    shutil.rmtree(work)
    _run(_cmd(config, data, work, out, "--report"))
    assert not work.exists()
    assert _results(out.read_text()) == _results(first)
    again = _run(_cmd(config, data, work, out))  # every unit present: nothing computed, nothing prepared
    assert COUNT.search(again).groups() == ("0", "0", "0", str(UNITS)) and not work.exists()

    # 3. killed with -9 when its first unit file appears, then rerun: no unit whose file existed is recomputed
    # (the sweep's units given: the run starts at its arms)
    data2, out2 = tmp_path / "data2", tmp_path / "out2.md"
    data2.mkdir()
    for name in _sweep_units(data):
        shutil.copy2(data / name, data2 / name)
    sweep_before = _sweep_units(data2)
    proc = subprocess.Popen(_cmd(config, data2, work2, out2), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _units(data2) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _units(data2), f"no unit file appeared (rc {proc.poll()})"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = _units(data2)
    assert 1 <= len(before) < UNITS
    stdout = _run(_cmd(config, data2, work2, out2))
    computed, train, ev, present = map(int, COUNT.search(stdout).groups())
    assert present == len(before) and computed == UNITS - len(before)
    after = _units(data2)
    assert len(after) == UNITS
    assert {name: after[name] for name in before} == before  # not rewritten
    assert _sweep_units(data2) == sweep_before
    assert not list(data2.glob(".*.tmp"))
