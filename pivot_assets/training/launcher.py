"""Training as a launched job (`training.launcher: accelerate`), Dagster-free.

The asset starts `python -m pivot_assets.training.launcher <accelerate launch args>` through Dagster Pipes; that
process runs accelerate's launcher in-process (torchrun's agent), which starts `training.num_processes` ranks of
`python -m pivot_assets.training.launched`. Each rank runs the same stage function the in-process path runs
(grpo.run_local_grpo, sft.train_sft_policy): TRL's trainers see WORLD_SIZE and train with DDP (gloo on a CPU,
NCCL on GPUs; DeepSpeed ZeRO-3 or FSDP from `training.accelerate_config`). Only the main rank writes tables,
markers and the model, and only it speaks Pipes (logs, progress, the result the asset publishes).

A launched process exits when its parent does (`exit_with_parent`): kill -9 of the launcher takes its ranks with
it, and kill -9 of the Dagster step takes the launcher. Checkpoints are named by the run's key, so a rerun of the
same run resumes from the last complete one.

GPU configs and their memory arithmetic for 7B and 30B: docs/evaluation.md, "Training past one process".
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

ENTRY = "pivot_assets.training.launched"
STAGES = ("grpo", "sft")


# -- inside the ranks --------------------------------------------------------------------------------


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """The rank that writes tables, markers and models (rank 0; the only one in-process)."""
    return int(os.environ.get("RANK", "0")) == 0


def gather_lists(items: list) -> list:
    """Every rank's `items` concatenated in rank order (one rank: `items`): each rank scores or sees only its share
    of a step's samples, and the main rank writes them all."""
    import torch.distributed as dist

    if world_size() == 1 or not dist.is_initialized():
        return items
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def barrier() -> None:
    import torch.distributed as dist

    if world_size() > 1 and dist.is_initialized():
        dist.barrier()


def exit_with_parent(poll_s: float = 1.0) -> None:
    """Exit this process as soon as its parent is gone (then it is re-parented and getppid changes). A thread
    rather than PR_SET_PDEATHSIG: that signal fires when the parent *thread* that started us exits."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(137)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def launch_threads(threads: int | str) -> int | str:
    """Torch threads per rank: `runtime.threads`, or under `auto` the usable cores shared among the ranks (2 ranks
    with 2 threads each on 2 cores run many times slower than with 1)."""
    if threads != "auto" or world_size() == 1:
        return threads
    from pivot_assets.core.hardware import usable_cores

    return max(1, usable_cores() // world_size())


# -- in the asset -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(training, base_dir: Path, stage: str, config_json: Path, on_gpu: bool) -> list[str]:
    """The command the asset runs: this module's guard around `accelerate launch`, then a rank's entry."""
    if stage not in STAGES:
        raise ValueError(f"launch: unknown stage {stage!r} (one of {', '.join(STAGES)})")
    args = ["--num_processes", str(training.num_processes), "--num_machines", "1",
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), "--dynamo_backend", "no"]
    if training.accelerate_config:
        path = Path(training.accelerate_config)
        path = path if path.is_absolute() else (base_dir / path).resolve()
        if not path.is_file():
            raise ValueError(f"training.accelerate_config: no such file: {path}")
        args += ["--config_file", str(path)]
    else:
        # plain DDP. accelerate's `--cpu` would start one process only; `--multi_gpu` starts torchrun's ranks,
        # which train on the CPU over gloo where the trainer says use_cpu (no GPU)
        args += ["--mixed_precision", "no"] + (["--multi_gpu"] if training.num_processes > 1 else [])
        if not on_gpu and training.num_processes == 1:
            args += ["--cpu"]
    return [sys.executable, "-m", __name__, *args, "-m", ENTRY, "--stage", stage, "--config", str(config_json)]


def launch_env() -> dict[str, str]:
    """What the launched processes add to this one's environment: unbuffered output, so a rank's lines reach the
    run's log as they are written."""
    return {"PYTHONUNBUFFERED": "1"}


def run_accelerate(argv: list[str]) -> None:
    """accelerate launch with `argv`, in this process, which exits when its parent does."""
    from accelerate.commands.launch import launch_command as accelerate_launch, launch_command_parser

    exit_with_parent()
    accelerate_launch(launch_command_parser().parse_args(argv))


if __name__ == "__main__":
    run_accelerate(sys.argv[1:])
