"""`pivot`: run the pipeline, see what is stale, query the warehouse, score pairs, check contracts, export.

Every verb takes --config FILE (else $PIVOT_CONFIG, else ./pivot.yaml, else the built-in defaults).
Errors are one line on stderr and a non-zero exit; `--debug` (or PIVOT_DEBUG=1) shows the traceback. `pivot run`
checks what the config names before it runs anything (preflight.py), works in a supervised child (supervisor.py),
and runs a sharded config as one process per shard (shard_runs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pivot_jobs import supervisor


def _config(args):
    from pivot_assets.core.config import load_config

    return load_config(args.config)


def _defs_and_instance(args):
    import dagster as dg

    from pivot_assets.shared import resolve_shared
    from pivot_jobs.definitions import build_definitions
    from pivot_jobs.runner import ensure_dagster_home

    cfg = _config(args)
    ensure_dagster_home(Path(cfg.base_dir))
    shared = resolve_shared(cfg)
    return shared, build_definitions(cfg, shared), dg.DagsterInstance.get()


def cmd_run(args) -> int:
    from pivot_jobs.runner import plan_runs, print_report, run_assets

    shared, defs, instance = _defs_and_instance(args)
    cfg = shared.cfg
    shard = getattr(args, "shard", None)  # `pivot ablate` has no --shard
    if args.missing and not args.stale:
        raise ValueError("--missing goes with --stale")
    if shard is not None and args.stale:
        raise ValueError("--shard and --stale are exclusive (`pivot run --stale` runs the stale shards)")
    if args.stale and args.select:
        raise ValueError("--stale and --select are exclusive")
    targets = _run_targets(args, defs, instance)
    if not targets:
        print("nothing is stale" + ("" if args.missing else " (never-materialized assets run with --missing)"))
        return 0
    keys = sorted({k for k, _ in targets}, key=lambda k: k.to_user_string())
    defs = _preflight(shared, defs, keys)
    if shard is not None:  # a shard run's rollouts step checks its own shard's parts
        from pivot_jobs.shard_runs import run_one_shard

        return run_one_shard(cfg, defs, instance, shard, args.select)
    set_aside_damaged_parts(shared.warehouse)
    plan = plan_runs(defs, targets)
    if plan.shards:
        from pivot_jobs.shard_runs import run_sharded

        return run_sharded(cfg, defs, instance, plan, args.config, forced=args.stale)
    print(f"materializing {len(keys)} assets: {', '.join(k.to_user_string() for k in keys)}", file=sys.stderr)
    from pivot_assets.curation.tables import holds_contract_results

    report = run_assets(defs, keys, instance, run_id=os.environ.get(supervisor.RUN_ID),
                        prewarm_contracts=not holds_contract_results(shared.warehouse))
    if not print_report(report, stopped=supervisor.stop_requested()):
        return 1
    print(f"warehouse: {cfg.warehouse_dir} (duckdb {cfg.warehouse_dir / 'pivot.duckdb'})")
    return 0


def _run_targets(args, defs, instance) -> list:
    """(asset key, partition or None) the run materializes: the selection, or with --stale the stale assets (and
    shards) with the rest of their multi-assets; empty when nothing is stale."""
    from pivot_jobs.runner import parse_selection, stale_targets

    if not args.stale:
        return [(k, None) for k in parse_selection(defs, args.select)]
    rows = [r for r in stale_targets(defs, instance, include_missing=args.missing)
            if r.status == "STALE" or args.missing]
    if not rows:
        return []
    keys = parse_selection(defs, ",".join(dict.fromkeys(r.key.to_user_string() for r in rows)))
    return [(r.key, r.partition) for r in rows] + [(k, None) for k in keys if k not in {r.key for r in rows}]


def _preflight(shared, defs, keys):
    """Check what the config names before anything runs (preflight.py); the definitions to run with, built again
    (on the same warehouse and verifiers) when a Hub model was downloaded just now (its commit is in the rollouts'
    code version)."""
    from pivot_jobs import preflight
    from pivot_jobs.definitions import build_definitions
    from pivot_jobs.runner import selection_groups

    fetched = preflight.check_run(shared.cfg, selection_groups(defs, keys))
    return build_definitions(shared.cfg, shared) if fetched else defs


ABLATION_SELECTION = "*ablation_results"  # what ablation_job runs: the ablation and everything upstream


def cmd_ablate(args) -> int:
    """`pivot ablate` = `pivot run --select '*ablation_results'` on a config with an `ablation:` section."""
    if _config(args).ablation is None:
        raise ValueError("pivot ablate: the config has no `ablation:` section (see configs/ablation_cpu.yaml)")
    args.select, args.stale, args.missing = ABLATION_SELECTION, False, False
    return cmd_run(args)


def cmd_stale(args) -> int:
    from pivot_jobs.runner import stale_assets

    _, defs, instance = _defs_and_instance(args)
    rows = stale_assets(defs, instance)
    for name, status, reason in rows:
        print(f"{name} {status} {reason}")
    if not rows:
        print("all fresh")
    return 0


def cmd_sql(args) -> int:
    from pivot_assets.core.warehouse import Warehouse, named_query

    wh = Warehouse(_config(args).warehouse_dir)
    if not wh.duckdb_path.exists():
        raise ValueError(f"no warehouse at {wh.root} yet: run `pivot run` first")
    query = named_query(args.query)
    import duckdb

    con = wh.connect(read_only=True)
    try:
        rel = con.sql(query)
        if rel is None:
            return 0
        _print_relation(rel, args.format)
    except duckdb.Error as e:
        raise ValueError(f"SQL error: {str(e).splitlines()[0]}") from None
    finally:
        con.close()
    return 0


def _print_relation(rel, fmt: str) -> None:
    if fmt == "table":
        import polars as pl

        with pl.Config(tbl_rows=200, tbl_cols=30, fmt_str_lengths=60, tbl_hide_dataframe_shape=True):
            print(rel.pl())
        return
    df = rel.pl()
    if fmt == "csv":
        print(df.write_csv(), end="")
    else:
        for row in df.iter_rows(named=True):
            print(json.dumps(row, default=str, ensure_ascii=False))


def cmd_verify(args) -> int:
    from pivot_assets.verifiers import VerifierSets, verify_jsonl

    cfg = _config(args)
    verifiers = VerifierSets.from_config(cfg).profiling
    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8", errors="surrogateescape")
    with source:
        counts = verify_jsonl(source, sys.stdout, verifiers, verifier_name=args.verifier)
    print(json.dumps(counts), file=sys.stderr)
    return 0


def cmd_check(args) -> int:
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.curation.tables import check_tables, contract_params

    cfg = _config(args)
    if args.parts:
        return check_parts(Warehouse(cfg.warehouse_dir))
    ok = True
    for table, result in check_tables(Warehouse(cfg.warehouse_dir), contract_params(cfg), args.table):
        print(f"{table}: {'PASS' if result.success else 'FAIL'}")
        if not result.success:
            ok = False
            print(result.summary())
    return 0 if ok else 1


def set_aside_damaged_parts(wh) -> None:
    """Before a run reads any table (views are refreshed by its first step): damaged parts of the tables it
    regenerates are set aside by their footers and records (core/parts.py); `rollouts` checks the checksums too."""
    from pivot_assets.core.parts import DAMAGED_DIR, repair

    for problem in repair(wh, checksum=False):
        print(f"set aside {problem.line()} (kept under {DAMAGED_DIR}/); this run regenerates its rows", file=sys.stderr)


def check_parts(wh) -> int:
    """`pivot check --parts`: one line per table, then one per damaged, missing or foreign part; 1 if any."""
    from pivot_assets.core.parts import check_all

    tables = check_all(wh)
    for table in tables:
        print(table.summary())
        for problem in table.problems:
            print(f"  {problem.line()}")
    return 1 if any(t.problems for t in tables) else 0


def cmd_export(args) -> int:
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.curation.tables import export_set

    if args.profile_key is not None and args.format != "nemo-gym":
        raise ValueError("--profile-key names the nemo-gym rows' profile object: it goes with --format nemo-gym")
    path = export_set(Warehouse(_config(args).warehouse_dir), args.set, args.format, Path(args.out), args.profile_key)
    print(path)
    return 0


def cmd_config(args) -> int:
    from pivot_assets.core.config_reference import config_schema, reference_markdown

    if args.schema:
        print(json.dumps(config_schema(), indent=2))
    else:
        print(reference_markdown(), end="")
    return 0


DEBUG_HELP = "on an error, print the traceback, not one line (as PIVOT_DEBUG=1 does)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pivot", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)

    def verb(name, fn, help_):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--config", default=None, help="pivot.yaml to use")
        sp.add_argument("--debug", action="store_true", help=DEBUG_HELP)
        sp.set_defaults(fn=fn)
        return sp

    sp = verb("run", cmd_run, "materialize assets (all, --select, or --stale)")
    sp.add_argument("--select", default=None, help="Dagster asset selection, or asset names joined by commas")
    sp.add_argument("--stale", action="store_true", help="materialize the stale assets (add --missing for never-run ones)")
    sp.add_argument("--missing", action="store_true", help="with --stale: also assets never materialized")
    sp.add_argument("--shard", default=None,
                    help="run one shard (partition key, e.g. 003) of the sharded assets selected (scale.shards > 1)")
    sp.add_argument("--in-process", action="store_true",
                    help="work in this process (no supervisor: SIGTERM waits for the current torch op)")
    sp = verb("ablate", cmd_ablate, "train and evaluate the ablation arms (ablation_job)")
    sp.add_argument("--in-process", action="store_true", help="work in this process (no supervisor)")
    verb("stale", cmd_stale, "list stale or missing assets (a shard: <asset>[NNN]): <asset> <STALE|MISSING> <reason>")
    sp = verb("sql", cmd_sql, "run a named query from sql/ or an ad-hoc query")
    sp.add_argument("query", help="a file name in sql/ (without .sql) or a SQL query")
    sp.add_argument("--format", choices=["table", "csv", "json"], default="table")
    sp = verb("verify", cmd_verify, "score (expected_action, candidate) pairs from JSONL")
    sp.add_argument("--input", required=True, help="JSONL file, or - for stdin")
    sp.add_argument("--verifier", default=None, help="use this verifier (default params) for every line")
    sp = verb("check", cmd_check, "run the Great Expectations data contracts (or, with --parts, check the files)")
    sp.add_argument("table", nargs="?", default=None)
    sp.add_argument("--parts", action="store_true",
                    help="check every table's files (footer, rows, checksum recorded when written): damaged, "
                         "missing and foreign parts; exit 1 if any")
    sp = verb("export", cmd_export, "export a pivot set for TRL (hf) or NeMo-RL (nemo-gym)")
    sp.add_argument("--set", choices=["adv", "mixed", "cand"], default="adv")
    sp.add_argument("--format", choices=["hf", "nemo-gym"], default="hf")
    sp.add_argument("--out", required=True)
    sp.add_argument("--profile-key", default=None,
                    help="nemo-gym: the name of each row's profile object {rewards, reward_mean, reward_std, "
                         "reward_var} (default qwen_235b_info, the key NeMo-RL's pivot data script filters on)")
    sp = verb("ui", cmd_ui, "open the Dagster UI on this config's instance (the runs `pivot run --config` records)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=3000)
    sp = sub.add_parser("config", help="print pivot.yaml's JSON Schema (--schema) or its Markdown reference (--reference)")
    sp.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sp.set_defaults(fn=cmd_config)
    which = sp.add_mutually_exclusive_group(required=True)
    which.add_argument("--schema", action="store_true", help="the JSON Schema (for editors: yaml-language-server)")
    which.add_argument("--reference", action="store_true", help="the Markdown reference (docs/configuration.md)")
    return p


def ui_workspace(home: Path) -> Path:
    """A Dagster workspace in the instance directory that loads `pivot_jobs.definitions.definitions` (the config from
    $PIVOT_CONFIG) under the code location `pivot run` labels its runs with."""
    from pivot_jobs import CODE_LOCATION

    path = home / "workspace.yaml"
    path.write_text("load_from:\n  - python_module:\n      module_name: pivot_jobs.definitions\n"
                    f"      attribute: definitions\n      location_name: {CODE_LOCATION}\n"
                    f"      working_directory: {json.dumps(str(Path.cwd()))}\n")
    return path


def cmd_ui(args) -> int:
    """`dagster dev` on the instance `pivot run --config X` records to, with X's definitions."""
    import shutil
    import subprocess

    from pivot_assets.core.config import resolve_config_path
    from pivot_jobs.runner import ensure_dagster_home

    cfg = _config(args)  # a bad config is one line here, not a stack trace in the webserver
    home = ensure_dagster_home(Path(cfg.base_dir))
    path = resolve_config_path(args.config)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    if path is not None:
        env["PIVOT_CONFIG"] = str(Path(path).resolve())
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or shutil.which("dagster")
    if dagster is None:
        raise RuntimeError("the dagster command is not installed in this environment (`make setup` installs it)")
    print(f"pivot ui: instance {home}, config {env.get('PIVOT_CONFIG', 'built-in defaults')}, "
          f"http://{args.host}:{args.port}", file=sys.stderr)
    command = [dagster, "dev", "-w", str(ui_workspace(home)), "-h", args.host, "-p", str(args.port)]
    # a shell that started this in the background ignores SIGINT; dagster dev shuts down on it
    return subprocess.call(command, env=env, preexec_fn=_default_signals)


def _default_signals() -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _after_kill(argv: list[str], run_id: str) -> None:
    """After the supervisor killed `pivot run`'s worker: remove the temp files it left, mark its run canceled."""
    cfg = _config(build_parser().parse_args(argv))
    from pivot_assets.core.warehouse import Warehouse
    from pivot_jobs.runner import cancel_run, ensure_dagster_home

    Warehouse(cfg.warehouse_dir).clean_all_temp_files()
    ensure_dagster_home(Path(cfg.base_dir))
    cancel_run(run_id, "pivot run was interrupted and its worker killed")


def entry() -> int:
    """The `pivot` console script: `pivot run` works in a supervised child (see above), the rest in-process."""
    argv = sys.argv[1:]
    args = build_parser().parse_args(argv)
    if args.verb in ("run", "ablate") and not supervisor.is_supervised() and not args.in_process:
        return supervisor.supervise(argv, lambda run_id: _after_kill(argv, run_id))
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one verb in this process (what tests and the supervised child call)."""
    args = build_parser().parse_args(argv)
    if supervisor.is_supervised():
        supervisor.become_worker()
    try:
        supervisor.die_with_parent()
        return args.fn(args)
    except KeyboardInterrupt:
        if not supervisor.is_supervised():  # supervised: the supervisor reports it, once
            print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; the traceback only on request
        if args.debug or os.environ.get("PIVOT_DEBUG"):
            raise
        from pivot_assets.core.config import ConfigError

        kind = "config error" if isinstance(e, ConfigError) else "error"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{kind}: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # `python -m pivot_jobs.cli`: the supervised child, or a direct in-process call
    code = main()
    if supervisor.is_supervised():
        supervisor.exit_now(code)
    sys.exit(code)
