"""`pivot`: run the pipeline, see what is stale, query the warehouse, score pairs, check contracts, export.

Every verb takes --config FILE (else $PIVOT_CONFIG, else ./pivot.yaml, else the built-in defaults).
Errors are one line on stderr and a non-zero exit; set PIVOT_DEBUG=1 for a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _config(args):
    from pivot_assets.config import load_config

    return load_config(args.config)


def _defs_and_instance(args):
    import dagster as dg

    from pivot_assets.pipeline import build_definitions
    from pivot_assets.runner import ensure_dagster_home

    cfg = _config(args)
    ensure_dagster_home(Path(cfg.base_dir))
    defs = build_definitions(args.config)
    return cfg, defs, dg.DagsterInstance.get()


def cmd_run(args) -> int:
    from pivot_assets.runner import parse_selection, run_assets, stale_assets

    cfg, defs, instance = _defs_and_instance(args)
    if args.stale:
        if args.select:
            raise ValueError("--stale and --select are exclusive")
        import dagster as dg

        keys = [dg.AssetKey(name) for name, _, _ in stale_assets(defs, instance)]
        if not keys:
            print("nothing is stale")
            return 0
        keys = parse_selection(defs, ",".join(k.to_user_string() for k in keys))
    else:
        keys = parse_selection(defs, args.select)
    print(f"materializing {len(keys)} assets: {', '.join(k.to_user_string() for k in keys)}", file=sys.stderr)
    report = run_assets(defs, keys, instance)
    print(f"run {report.run_id}: materialized {', '.join(report.materialized) or 'nothing'}")
    for check in report.failed_checks:
        print(f"failed check: {check}")
    if report.skipped:
        print(f"not materialized: {', '.join(report.skipped)}")
    if not report.success:
        print(f"error: run failed: {report.error or 'see the Dagster UI for the run log'}", file=sys.stderr)
        return 1
    print(f"warehouse: {cfg.warehouse_dir} (duckdb {cfg.warehouse_dir / 'pivot.duckdb'})")
    return 0


def cmd_stale(args) -> int:
    from pivot_assets.runner import stale_assets

    _, defs, instance = _defs_and_instance(args)
    for name, status, reason in stale_assets(defs, instance):
        print(f"{name} {status} {reason}")
    return 0


def cmd_sql(args) -> int:
    from pivot_assets.warehouse import Warehouse, named_query

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
    from pivot_assets.warehouse_ops import check_tables

    ok = True
    for table, result in check_tables(_config(args), args.table):
        print(f"{table}: {'PASS' if result.success else 'FAIL'}")
        if not result.success:
            ok = False
            print(result.summary())
    return 0 if ok else 1


def cmd_export(args) -> int:
    from pivot_assets.warehouse_ops import export_set

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
    sp.add_argument("--stale", action="store_true", help="materialize only stale or missing assets")
    verb("stale", cmd_stale, "list stale or missing assets: <asset> <STALE|MISSING> <reason>")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; the traceback only on request
        if os.environ.get("PIVOT_DEBUG"):
            raise
        from pivot_assets.config import ConfigError

        kind = "config error" if isinstance(e, ConfigError) else "error"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{kind}: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
