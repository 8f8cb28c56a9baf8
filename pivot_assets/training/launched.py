"""One rank of a launched training run (training/launcher.py): `python -m pivot_assets.training.launched --stage
grpo|sft --config <config json>`. Every rank runs the stage's function; the main rank speaks Dagster Pipes (its log
lines and progress reach the run; its result is the custom message the asset publishes), the others print."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from pathlib import Path

from .launcher import exit_with_parent, is_main_process, launch_threads


def result_message(result: dict) -> dict:
    """The stage's result as JSON for Pipes (the Precision as a dict)."""
    return {**result, "precision": dataclasses.asdict(result["precision"])}


def run_stage(stage: str, config_json: Path, log) -> dict:
    from pivot_assets.core.config import PivotConfig
    from pivot_assets.shared import resolve_shared

    cfg = PivotConfig.model_validate_json(config_json.read_text())
    cfg = cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"threads": launch_threads(cfg.runtime.threads)})})
    shared = resolve_shared(cfg)
    wh, verifiers = shared.warehouse, shared.verifiers
    if stage == "grpo":
        from .grpo import run_local_grpo

        return run_local_grpo(wh, cfg, verifiers.reward, log)
    from .sft import train_sft_policy

    return train_sft_policy(wh, cfg, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stage", choices=("grpo", "sft"), required=True)
    parser.add_argument("--config", type=Path, required=True, help=(
        "the run's PivotConfig as JSON; a failing rank writes its error beside it (error-rank<N>.txt)"))
    args = parser.parse_args(argv)
    exit_with_parent()
    try:
        return _run_rank(args)
    except BaseException as exc:  # the asset raises this line instead of the launcher's exit code
        error = args.config.parent / f"error-rank{os.environ.get('RANK', '0')}.txt"
        error.write_text(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        raise


def _run_rank(args: argparse.Namespace) -> int:
    if not is_main_process():
        run_stage(args.stage, args.config, lambda line: print(line, file=sys.stderr, flush=True))
        return 0
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() if _under_pipes() else contextlib.nullcontext() as pipes:
        log = pipes.log.info if pipes is not None else print
        result = run_stage(args.stage, args.config, log)
        if pipes is not None:
            pipes.report_custom_message(result_message(result))
    return 0


def _under_pipes() -> bool:
    """Started by the asset's Pipes client (a rank started by hand prints instead)."""
    return "DAGSTER_PIPES_CONTEXT" in os.environ


if __name__ == "__main__":
    sys.exit(main())
