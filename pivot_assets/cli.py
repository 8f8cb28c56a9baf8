"""`pivot`: run the pipeline, see what is stale, query the warehouse, score pairs, check contracts, export.

Every verb takes --config FILE (else $PIVOT_CONFIG, else ./pivot.yaml, else the built-in defaults).
Errors are one line on stderr and a non-zero exit; set PIVOT_DEBUG=1 for a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

SUPERVISED = "PIVOT_SUPERVISED"  # set in the child that does the work of `pivot run`
RUN_ID = "PIVOT_RUN_ID"  # the Dagster run id the supervisor chose for that child
RAY_HEAD_CHECKED = "PIVOT_RAY_HEAD_CHECKED"  # set by `pivot run` for its shard runs: the Ray head passed the preflight
PARENT_PID = "PIVOT_PARENT_PID"  # set in a child of `pivot run` (the worker, a shard run): it dies with that parent
# After SIGTERM, how long the child may take to stop cleanly before SIGKILL ($PIVOT_STOP_GRACE_S overrides).
STOP_GRACE_S = float(os.environ.get("PIVOT_STOP_GRACE_S", "3"))
# A child whose parent died stops cleanly on SIGTERM; one still alive this long after is SIGKILLed (long enough
# for the worker to stop its own shard runs first, each within STOP_GRACE_S).
ORPHAN_GRACE_S = 2 * STOP_GRACE_S + 2


def _config(args):
    from pivot_assets.core.config import load_config

    return load_config(args.config)


def _defs_and_instance(args):
    import dagster as dg

    from pivot_assets.pipeline import build_definitions
    from pivot_assets.runner import ensure_dagster_home

    cfg = _config(args)
    ensure_dagster_home(Path(cfg.base_dir))
    defs = build_definitions(cfg)
    return cfg, defs, dg.DagsterInstance.get()


def cmd_run(args) -> int:
    from pivot_assets.runner import parse_selection, plan_runs, run_assets, stale_targets

    cfg, defs, instance = _defs_and_instance(args)
    if args.missing and not args.stale:
        raise ValueError("--missing goes with --stale")
    if getattr(args, "shard", None) is not None:
        return _run_one_shard(args, cfg, defs, instance)
    if args.stale:
        if args.select:
            raise ValueError("--stale and --select are exclusive")
        rows = [r for r in stale_targets(defs, instance, include_missing=args.missing)
                if r.status == "STALE" or args.missing]
        if not rows:
            print("nothing is stale" + ("" if args.missing else " (never-materialized assets run with --missing)"))
            return 0
        keys = parse_selection(defs, ",".join(dict.fromkeys(r.key.to_user_string() for r in rows)))
        targets = [(r.key, r.partition) for r in rows] + [(k, None) for k in keys if k not in {r.key for r in rows}]
    else:
        keys = parse_selection(defs, args.select)
        targets = [(k, None) for k in keys]
    plan = plan_runs(defs, targets)
    if plan.shards:
        return _run_sharded(args, cfg, defs, instance, plan)
    print(f"materializing {len(keys)} assets: {', '.join(k.to_user_string() for k in keys)}", file=sys.stderr)
    report = run_assets(defs, keys, instance, run_id=os.environ.get(RUN_ID))
    if not _print_report(report):
        return 1
    print(f"warehouse: {cfg.warehouse_dir} (duckdb {cfg.warehouse_dir / 'pivot.duckdb'})")
    return 0


def _print_report(report, label: str = "run") -> bool:
    """The run's outcome as the lines `pivot run` prints; True when it succeeded."""
    if not report.success and "Interrupted" in (report.error or ""):
        raise KeyboardInterrupt  # stopped by a signal: one line from the supervisor (or main), not a run report
    print(f"{label} {report.run_id}: materialized {', '.join(report.materialized) or 'nothing'}")
    for check in report.failed_checks:
        print(f"failed check: {check}")
    if report.skipped:
        print(f"not materialized: {', '.join(report.skipped)}")
    if not report.success:
        print(f"error: {label} failed: {report.error or 'see the Dagster UI for the run log'}", file=sys.stderr)
    return report.success


# -- shards: one run per shard ------------------------------------------------------------------------------
# `pivot run` on a sharded config runs the unpartitioned assets the shards need, then one run per shard, each in
# its own process (`pivot run --shard NNN`: engine local one after another, engine ray up to scale.max_shard_runs
# at once, the work being on the cluster), then, once every shard succeeded, the unpartitioned rest (pivot sets
# read every shard). A shard run never opens pivot.duckdb; the views are refreshed once at the end.


def _run_one_shard(args, cfg, defs, instance) -> int:
    from pivot_assets.profiling.shards import parse_shard, partition_key
    from pivot_assets.runner import parse_selection, run_assets

    if cfg.scale.shards == 1:
        raise ValueError("--shard needs scale.shards > 1 (nothing is sharded with shards: 1)")
    if args.stale:
        raise ValueError("--shard and --stale are exclusive (`pivot run --stale` runs the stale shards)")
    key = partition_key(parse_shard(args.shard, cfg.scale.shards))
    graph = defs.resolve_asset_graph()
    keys = [k for k in parse_selection(defs, args.select) if graph.get(k).partitions_def is not None]
    if not keys:
        raise ValueError(f"--shard runs sharded assets only; {args.select!r} selects none")
    if not os.environ.get(RAY_HEAD_CHECKED) and _submits_ray_jobs(cfg, {key: keys}):
        from pivot_assets.profiling.ray_preflight import check_ray_head

        check_ray_head(cfg, log=lambda line: print(line, file=sys.stderr))
    print(f"shard {key}: materializing {', '.join(k.to_user_string() for k in keys)}", file=sys.stderr)
    report = run_assets(defs, keys, instance, run_id=os.environ.get(RUN_ID), partition_key=key)
    return 0 if _print_report(report, f"shard {key} run") else 1


def _run_sharded(args, cfg, defs, instance, plan) -> int:
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.runner import run_assets

    print(f"materializing {plan.describe()}", file=sys.stderr)
    if plan.before and not _print_report(run_assets(defs, plan.before, instance)):
        return 1
    shards = plan.shards if args.stale else _shards_needing_a_run(defs, instance, plan.shards)
    fresh = sorted(set(plan.shards) - set(shards))
    if fresh:
        print(f"shards fresh, not run: {', '.join(fresh)} (`pivot run --shard NNN` forces one)", file=sys.stderr)
    if _submits_ray_jobs(cfg, shards):
        from pivot_assets.profiling.ray_preflight import check_ray_head

        check_ray_head(cfg, log=lambda line: print(line, file=sys.stderr))
    failed = _shard_runs(args, cfg, shards)
    if failed:
        print(f"error: shard run(s) failed: {', '.join(failed)}; the assets after them were not run "
              "(`pivot run --stale` reruns what is left)", file=sys.stderr)
        return 1
    if plan.after:
        if not _print_report(run_assets(defs, plan.after, instance)):
            return 1
    else:  # no unpartitioned step ran after the shards: refresh the views over their parts here, once
        Warehouse(cfg.warehouse_dir).refresh_views()
    print(f"warehouse: {cfg.warehouse_dir} (duckdb {cfg.warehouse_dir / 'pivot.duckdb'})")
    return 0


def _submits_ray_jobs(cfg, shards: dict) -> bool:
    """True when a shard run will submit a Ray job (engine ray, and `rollouts` among its assets)."""
    return cfg.scale.engine == "ray" and any(k.to_user_string() == "rollouts" for keys in shards.values() for k in keys)


def _shards_needing_a_run(defs, instance, shards: dict) -> dict:
    """Each shard's selected assets that are stale or missing (asked after the unpartitioned assets before them
    ran, so a change there shows); a shard whose selected assets are all fresh needs no run."""
    from pivot_assets.runner import stale_targets

    stale = {(r.key, r.partition) for r in stale_targets(defs, instance, include_missing=True)}
    out = {p: [k for k in keys if (k, p) in stale] for p, keys in shards.items()}
    return {p: keys for p, keys in out.items() if keys}


def _shard_runs(args, cfg, shards: dict) -> list[str]:
    """Run every shard's run in its own `pivot run --shard` process; the shards that failed."""
    in_flight = cfg.scale.max_shard_runs if cfg.scale.engine == "ray" else 1
    env = {k: v for k, v in os.environ.items() if k != RUN_ID}
    env[SUPERVISED] = "1"  # SIGTERM stops a shard run cleanly (Dagster records it as failed)
    env[PARENT_PID] = str(os.getpid())  # a shard run dies with this process, even on kill -9
    env[RAY_HEAD_CHECKED] = "1"  # checked once above, not again by every shard run
    pending = list(shards.items())
    running: dict[str, tuple[subprocess.Popen, str]] = {}
    failed: list[str] = []
    try:
        while pending or running:
            while pending and len(running) < in_flight:
                key, keys = pending.pop(0)
                argv = ["run", "--in-process", "--shard", key, "--select", ",".join(k.to_user_string() for k in keys)]
                argv += ["--config", args.config] if args.config else []
                run_id = str(uuid.uuid4())
                proc = subprocess.Popen([sys.executable, "-m", "pivot_assets.cli", *argv], env={**env, RUN_ID: run_id})
                running[key] = (proc, run_id)
            for key, (proc, _) in list(running.items()):
                if proc.poll() is not None:
                    del running[key]
                    if proc.returncode != 0:
                        failed.append(key)
            time.sleep(0.2)
    finally:  # interrupted: stop the shard runs still going (each keeps the parts it wrote)
        _stop_shard_runs(list(running.values()))
    return sorted(failed)


def _stop_shard_runs(runs: list[tuple[subprocess.Popen, str]]) -> None:
    """SIGTERM every shard run (each stops its Ray job, Dagster marks its run failed), SIGKILL those still going
    after STOP_GRACE_S, and mark their Dagster runs canceled (a run left STARTED would block its shard)."""
    for proc, _ in runs:
        proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    killed = []
    for proc, run_id in runs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed.append(run_id)
    for run_id in killed:
        try:
            from pivot_assets.runner import cancel_run

            cancel_run(run_id, "its `pivot run` was interrupted and the shard run killed")
        except Exception as e:  # best effort: the interrupt itself must still be reported
            print(f"warning: could not mark shard run {run_id} canceled: {str(e).splitlines()[0] if str(e) else e!r}",
                  file=sys.stderr)


ABLATION_SELECTION = "*ablation_results"  # what ablation_job runs: the ablation and everything upstream


def cmd_ablate(args) -> int:
    """`pivot ablate` = `pivot run --select '*ablation_results'` on a config with an `ablation:` section."""
    if _config(args).ablation is None:
        raise ValueError("pivot ablate: the config has no `ablation:` section (see configs/ablation_cpu.yaml)")
    args.select, args.stale, args.missing = ABLATION_SELECTION, False, False
    return cmd_run(args)


def cmd_stale(args) -> int:
    from pivot_assets.runner import stale_assets

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
    from pivot_assets.verifiers import DomainVerifiers, verify_jsonl

    cfg = _config(args)
    verifiers = DomainVerifiers(cfg.verifier)
    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8", errors="surrogateescape")
    with source:
        counts = verify_jsonl(source, sys.stdout, verifiers, verifier_name=args.verifier)
    print(json.dumps(counts), file=sys.stderr)
    return 0


def cmd_check(args) -> int:
    from pivot_assets.curation.operations import check_tables

    ok = True
    for table, result in check_tables(_config(args), args.table):
        print(f"{table}: {'PASS' if result.success else 'FAIL'}")
        if not result.success:
            ok = False
            print(result.summary())
    return 0 if ok else 1


def cmd_export(args) -> int:
    from pivot_assets.curation.operations import export_set

    path = export_set(_config(args), args.set, args.format, Path(args.out))
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pivot", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)

    def verb(name, fn, help_):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--config", default=None, help="pivot.yaml to use")
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
    sp = verb("check", cmd_check, "run the Great Expectations data contracts")
    sp.add_argument("table", nargs="?", default=None)
    sp = verb("export", cmd_export, "export a pivot set for TRL (hf) or NeMo-RL (nemo-gym)")
    sp.add_argument("--set", choices=["adv", "mixed", "cand"], default="adv")
    sp.add_argument("--format", choices=["hf", "nemo-gym"], default="hf")
    sp.add_argument("--out", required=True)
    return p


# -- stopping `pivot run` promptly --------------------------------------------------------------------
# A long torch op (a bf16 matmul on a CPU without bf16 ran for minutes) holds the interpreter, so a signal
# handler in the working process would run only when the op returns. `pivot run` therefore works in a child
# process and supervises it: on SIGTERM or Ctrl-C the child is asked to stop (SIGTERM: Dagster marks the run
# failed, parts already written stay), and killed if it has not stopped after STOP_GRACE_S. Every part is
# written to a temp file and renamed, so a kill leaves no half-written part; the supervisor then removes the
# temp files and marks the run canceled, and a rerun resumes from the parts on disk.


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def redeliver_swallowed_interrupts() -> None:
    """A stop signal whose exception is raised while the main thread runs a garbage-collector callback (a weakref
    finalizer of SQLAlchemy's, say) is printed as "Exception ignored in ..." and dropped by Python: the run went
    on until the supervisor killed it. When an interrupt is dropped that way, nothing is printed and the signal is
    sent again from a thread a moment later, so that its handler runs in the main code, not in the callback (were
    it dropped again, this hook sends it again)."""
    import threading

    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if not _is_interrupt(unraisable.exc_value):
            previous(unraisable)  # a real error in a callback is still printed; a dropped stop is handled here
            return
        # to the main thread itself: a signal the process takes in another thread would wait for a blocking call
        # of the main thread to return
        threading.Timer(0.05, signal.pthread_kill, (threading.main_thread().ident, signal.SIGTERM)).start()

    sys.unraisablehook = hook


def _is_interrupt(error: BaseException | None) -> bool:
    if isinstance(error, KeyboardInterrupt):
        return True
    dagster_errors = sys.modules.get("dagster._core.errors")  # Dagster raises its own, not a KeyboardInterrupt
    return dagster_errors is not None and isinstance(error, dagster_errors.DagsterExecutionInterruptedError)


def supervise(argv: list[str]) -> int:
    run_id = str(uuid.uuid4())
    env = {**os.environ, SUPERVISED: "1", RUN_ID: run_id, PARENT_PID: str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-m", "pivot_assets.cli", *argv], env=env)
    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = stop["signal"] or signum

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    while child.poll() is None:
        if stop["signal"] is not None:
            return _stop_child(child, stop["signal"], argv, run_id)
        time.sleep(0.1)
    return child.returncode


def _stop_child(child: subprocess.Popen, signum: int, argv: list[str], run_id: str) -> int:
    name = signal.Signals(signum).name
    try:
        child.send_signal(signal.SIGTERM)
        child.wait(STOP_GRACE_S)
        how = "stopped"
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        how = "killed"
        _after_kill(argv, run_id)
    print(f"interrupted ({name}): run {run_id} {how}; parts written so far are kept, `pivot run` resumes",
          file=sys.stderr)
    return 128 + int(signum)


def _after_kill(argv: list[str], run_id: str) -> None:
    """Remove the temp files the killed child left and mark its Dagster run canceled (best effort)."""
    try:
        args = build_parser().parse_args(argv)
        cfg = _config(args)
        from pivot_assets.core.warehouse import Warehouse

        Warehouse(cfg.warehouse_dir).clean_all_temp_files()
        from pivot_assets.runner import cancel_run, ensure_dagster_home

        ensure_dagster_home(Path(cfg.base_dir))
        cancel_run(run_id, "pivot run was interrupted and its worker killed")
    except Exception as e:  # the interrupt itself must still be reported
        print(f"warning: cleanup after interrupt incomplete: {str(e).splitlines()[0] if str(e) else e!r}",
              file=sys.stderr)


def entry() -> int:
    """The `pivot` console script: `pivot run` works in a supervised child (see above), the rest in-process."""
    argv = sys.argv[1:]
    args = build_parser().parse_args(argv)
    if args.verb in ("run", "ablate") and os.environ.get(SUPERVISED) != "1" and not args.in_process:
        return supervise(argv)
    return main(argv)


def _die_with_parent() -> None:
    """In a child of `pivot run` (the worker, a shard run): SIGTERM (a clean stop) when that parent dies, SIGKILL
    ORPHAN_GRACE_S later if still alive. Read once, so this process's own children get their own parent pid."""
    parent = os.environ.pop(PARENT_PID, None)
    if parent:
        from pivot_assets.core.parallel import die_with_parent

        die_with_parent(int(parent), signal.SIGTERM, grace_s=ORPHAN_GRACE_S)


def main(argv: list[str] | None = None) -> int:
    """Run one verb in this process (what tests and the supervised child call)."""
    args = build_parser().parse_args(argv)
    if os.environ.get(SUPERVISED) == "1":
        signal.signal(signal.SIGTERM, _raise_interrupt)
        redeliver_swallowed_interrupts()
    try:
        _die_with_parent()
        return args.fn(args)
    except KeyboardInterrupt:
        if os.environ.get(SUPERVISED) != "1":  # supervised: the supervisor reports it, once
            print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; the traceback only on request
        if os.environ.get("PIVOT_DEBUG"):
            raise
        from pivot_assets.core.config import ConfigError

        kind = "config error" if isinstance(e, ConfigError) else "error"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{kind}: {msg}", file=sys.stderr)
        return 2


def exit_now(rc: int) -> None:
    """End the supervised child without tearing down its modules: freeing Dagster's, pandas' and Great
    Expectations' objects one by one took 1.2-1.6 s after every run. Exit handlers (logging, weakref finalizers,
    temp dirs) still run and every stream is flushed; files and DuckDB connections were closed by the steps."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(rc)


if __name__ == "__main__":  # `python -m pivot_assets.cli`: the supervised child, or a direct in-process call
    code = main()
    if os.environ.get(SUPERVISED) == "1":
        exit_now(code)
    sys.exit(code)
