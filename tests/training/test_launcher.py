"""Training as a launched job (training.launcher: accelerate): the command, the keys, and sft_policy and grpo_run
through `pivot run` with 2 CPU processes (DDP over gloo): a kill -9 of the launcher takes its ranks with it, the rerun
resumes from the checkpoint and writes the same tables as in-process with every rank's rows and one model, and the
next rerun is cached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pivot_assets.core.config import PivotConfig
from pivot_assets.core.identity import fingerprint
from pivot_assets.training.launcher import ENTRY, launch_command
from pivot_assets.training.runs import grpo_run_identity, sft_run_identity


def _training(**kw) -> PivotConfig:
    return PivotConfig.model_validate({"training": kw})


def test_plain_ddp_command_starts_torchrun_ranks_of_the_entry(tmp_path):
    cmd = launch_command(_training(launcher="accelerate", num_processes=2).training, tmp_path, "grpo",
                         tmp_path / "c.json", on_gpu=False)
    assert cmd[:3] == [sys.executable, "-m", "pivot_assets.training.launcher"]
    assert "--multi_gpu" in cmd and cmd[cmd.index("--num_processes") + 1] == "2"  # --cpu would start one process
    assert cmd[cmd.index(ENTRY) - 1] == "-m" and cmd[-4:] == ["--stage", "grpo", "--config", str(tmp_path / "c.json")]


def test_a_config_file_decides_the_distributed_type_and_a_missing_one_is_one_line(tmp_path):
    (tmp_path / "zero3.yaml").write_text("distributed_type: DEEPSPEED\n")
    training = _training(launcher="accelerate", accelerate_config="zero3.yaml").training
    cmd = launch_command(training, tmp_path, "sft", tmp_path / "c.json", on_gpu=True)
    assert cmd[cmd.index("--config_file") + 1] == str(tmp_path / "zero3.yaml") and "--multi_gpu" not in cmd
    with pytest.raises(ValueError, match="no such file"):
        launch_command(_training(launcher="accelerate", accelerate_config="nope.yaml").training, tmp_path, "sft",
                       tmp_path / "c.json", on_gpu=True)


def test_the_world_size_is_in_the_run_keys_and_one_process_trains_as_in_process():
    inprocess, one = _training(), _training(launcher="accelerate", num_processes=1)
    two = _training(launcher="accelerate", num_processes=2)
    for identity in (grpo_run_identity, sft_run_identity):
        assert fingerprint(identity(inprocess)) == fingerprint(identity(one))
        assert fingerprint(identity(two)) != fingerprint(identity(inprocess))


def test_the_shipped_accelerate_configs_parse():
    from accelerate.commands.config.config_args import load_config_from_file

    shipped = sorted((Path(__file__).parents[2] / "configs" / "accelerate").glob("*.yaml"))
    assert {p.stem for p in shipped} >= {"deepspeed_zero3", "fsdp"}
    for path in shipped:
        assert load_config_from_file(str(path)).num_processes >= 1, path


def _config(steps: int, model_dir: Path) -> str:
    """The training-assets test's tiny config, launched on 2 processes, without its ablation: SFT and GRPO shortened."""
    import yaml

    from .test_training_assets import config

    cfg = {k: v for k, v in yaml.safe_load(config(model_dir)).items() if k not in ("ablation", "runtime")}
    cfg["sft"].update(steps=1, batch_size=1, max_length=512)
    cfg["policy"].update(max_new_tokens=8, dtype="auto")
    cfg["training"].update(steps=steps, max_completion_length=6, launcher="accelerate", num_processes=2, save_steps=1)
    return yaml.safe_dump(cfg)


def _pivot(tmp_path: Path, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home"), "HF_HUB_OFFLINE": "1"}
    env.pop("PIVOT_CONFIG", None)
    return subprocess.Popen([str(Path(sys.executable).parent / "pivot"), *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _ranks(tmp_path: Path) -> list[int]:
    """Pids of this test's launched ranks and launchers (from /proc cmdlines): only processes whose environment holds
    this test's DAGSTER_HOME, which every rank inherits, so a rank another test launches at the same time is not
    counted."""
    home = f"DAGSTER_HOME={tmp_path / 'dagster_home'}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ours = "pivot_assets.training.launche" in cmdline and home in (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if ours and proc.name.isdigit():
            pids.append(int(proc.name))
    return pids


def _sql(tmp_path: Path, query: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(tmp_path / "wh" / "pivot.duckdb"), read_only=True) as con:
        return con.execute(query).fetchall()


def _grpo_checkpoint(models: Path, run: subprocess.Popen, timeout: float = 900) -> Path:
    """The first complete GRPO checkpoint of the running `run`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        done = [p for p in models.glob(".grpo_policy.trainer-*/checkpoint-*") if (p / "trainer_state.json").exists()]
        if done:
            return done[0]
        time.sleep(1)
    raise AssertionError(run.communicate()[0][-3000:])


@pytest.mark.scenario
def test_sft_and_grpo_launched_on_two_processes_a_killed_launcher_resumes_and_a_rerun_is_cached(tmp_path,
                                                                                                tiny_model_dir):
    (tmp_path / "pivot.yaml").write_text(_config(steps=2, model_dir=tiny_model_dir))
    models = tmp_path / "wh" / "models"
    run = _pivot(tmp_path, "run", "--select", "*grpo_run", start_new_session=True)
    checkpoint = _grpo_checkpoint(models, run)  # sft_policy has trained (launched) by then
    launchers = [p for p in _ranks(tmp_path) if b"training.launcher " in Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")]
    assert len(launchers) == 1 and len(_ranks(tmp_path)) == 3  # grpo_run's launcher and its 2 ranks
    os.kill(launchers[0], signal.SIGKILL)
    gone_by = time.monotonic() + 30
    while _ranks(tmp_path) and time.monotonic() < gone_by:
        time.sleep(0.5)
    assert _ranks(tmp_path) == [], "the ranks outlived their launcher"
    out = run.communicate(timeout=120)[0]
    assert run.returncode != 0, out[-2000:]
    assert "sft: 2 processes" in out and "grpo: 2 processes" in out and "[pipes]" in out

    rerun = _pivot(tmp_path, "run", "--select", "*grpo_run")
    out = rerun.communicate(timeout=900)[0]
    assert rerun.returncode == 0, out[-3000:]
    assert "sft_policy is up to date" in out and "grpo: resuming from" in out and checkpoint.name in out, out[-3000:]
    done_step = int(checkpoint.name.split("-")[-1])
    assert f"grpo steps: {done_step}/2 (cached)" in out and "grpo steps: 2/2 (" in out  # progress through Pipes
    assert _sql(tmp_path, "select step from grpo_steps order by step") == [(1,), (2,)]  # checkpoint's + resumed
    # every rank's completions of the resumed steps: 2 ranks x one group of num_generations=2 a step
    assert _sql(tmp_path, "select step, count(*), count(distinct run_key) from grpo_completions group by step "
                          "order by step") == [(s, 4, 1) for s in range(done_step + 1, 3)]
    assert _sql(tmp_path, "select count(*) from sft_steps where tokens > 0") == [(1,)]
    assert sorted(p.name for p in models.iterdir()) == ["grpo_policy", "sft_policy"]  # no checkpoint or tmp left
    assert (models / "grpo_policy" / ".pivot_key").is_file() and (models / "grpo_policy" / "config.json").is_file()

    cached = _pivot(tmp_path, "run", "--select", "sft_policy,grpo_run")
    out = cached.communicate(timeout=300)[0]
    assert cached.returncode == 0 and "processes:" not in out and out.count("up to date") >= 2, out[-3000:]


@pytest.mark.scenario
def test_a_failing_rank_fails_the_asset_with_its_own_error_in_one_line(tmp_path):
    """Pipes alone would say "External execution process failed with code 1"; the asset says what the rank raised."""
    import dagster as dg

    from pivot_assets.training.assets import launched_result

    cfg = PivotConfig.model_validate({"warehouse": str(tmp_path / "wh"), "base_dir": str(tmp_path),
                                      "training": {"launcher": "accelerate", "num_processes": 1}})

    @dg.asset
    def launched(context) -> None:  # no annotation: this module's annotations are strings
        launched_result(context, cfg, "sft")

    result = dg.materialize([launched], raise_on_error=False, instance=dg.DagsterInstance.ephemeral())
    error = result.get_step_failure_events()[0].event_specific_data.error.cause  # what the asset raised
    assert error.cls_name == "RuntimeError" and len(error.message.strip().splitlines()) == 1, error.message
    assert error.message.startswith("RuntimeError: sft (launched): rank0: FileNotFoundError: table 'trajectories'")
