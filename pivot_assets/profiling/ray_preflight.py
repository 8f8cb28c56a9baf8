"""Is the Ray head able to run shard jobs? Checked once before any is submitted (Dagster-free).

A shard job runs `python -m pivot_assets.profiling.ray_job` with the `python` on the head's PATH, and it opens the
warehouse with the environment of the node it runs on (credentials are never forwarded: docs/scale.md).
A head started from this venv's `ray` without the venv on PATH, or without the AWS variables an s3:// warehouse
needs, fails every shard job, each late and with a long traceback. The preflight is one small Ray job with the
shard jobs' runtime_env: its driver (the `python` a shard job gets) imports this package and what the configured
backend needs and opens the warehouse, then one Ray task does the same in a Ray worker. A failure is one line
saying what the head lacks and how to start it.
"""

from __future__ import annotations

import json
import shlex
import time

from pivot_assets.core.config import PivotConfig
from pivot_assets.core.engines import absent_packages

MARK = "PIVOT_PREFLIGHT "
# The job's entrypoint: plain Python, so it reports what it cannot import even where this package is not importable.
_ENTRY = """
import json, sys
def done(ok, where, what):
    print("PIVOT_PREFLIGHT " + json.dumps({"ok": ok, "where": where, "what": what, "python": sys.executable}), flush=True)
    sys.exit(0 if ok else 1)
try:
    from pivot_assets.profiling.ray_preflight import check_cluster
except ImportError as e:
    done(False, "driver", "cannot import " + (e.name or str(e)))
done(*check_cluster(sys.argv[1]))
"""
TIMEOUT_S = 300


def open_warehouse(config_json: str) -> tuple[bool, str]:
    """(ok, what) in this process: the package, the backend's packages and Ray Data import; the warehouse opens and
    holds the turns table (ingest ran before the shards)."""
    try:
        import duckdb  # noqa: F401
        import ray.data  # noqa: F401

        from pivot_assets.core.warehouse import Warehouse
    except ImportError as e:
        return False, f"cannot import {e.name or e}"
    cfg = PivotConfig.model_validate(json.loads(config_json))
    missing = absent_packages(cfg.policy.backend)
    if missing:
        return False, f"cannot import {', '.join(missing)} (policy.backend {cfg.policy.backend})"
    try:
        wh = Warehouse(cfg.warehouse_dir)
        if not wh.table_path("turns").exists():
            return False, f"sees no turns table in the warehouse {wh.tables_uri}"
    except Exception as e:  # noqa: BLE001  (whatever opening it raises is what the shard jobs would raise)
        return False, f"cannot open the warehouse {cfg.warehouse}: {_gist(e)}"
    return True, f"imports pivot_assets and opens {wh.tables_uri}"


def check_cluster(config_json: str) -> tuple[bool, str, str]:
    """In the preflight job's driver: (ok, where, what) of the driver's check, then of one Ray task's."""
    ok, what = open_warehouse(config_json)
    if not ok:
        return False, "driver", what
    import ray

    ray.init(logging_level="WARNING")
    try:
        ok, what = ray.get(ray.remote(num_cpus=0)(open_warehouse).remote(config_json), timeout=TIMEOUT_S)
    except Exception as e:  # noqa: BLE001  (a worker that cannot even import this module)
        return False, "worker", _gist(e)
    return ok, "worker", what


def check_ray_head(cfg: PivotConfig, log=print, timeout_s: float = TIMEOUT_S) -> str:
    """Run the preflight job on the configured head; raise RuntimeError (one line) when the head cannot run shard
    jobs, else return what it checked."""
    from .ray_job import job_client, runtime_env

    address = cfg.scale.ray_address or "$RAY_ADDRESS"
    try:
        client = job_client(cfg.scale.ray_address)
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"no Ray job server answers at {address} ({_gist(e)}): start a head "
                           f"({START_HINT}) or fix scale.ray_address") from None
    entry = f"python -c {shlex.quote(_ENTRY)} {shlex.quote(json.dumps(cfg.model_dump(mode='json')))}"
    t0 = time.monotonic()
    # its own metadata: never taken for a shard's job (stop_earlier_jobs matches pivot_shard and pivot_warehouse)
    job = client.submit_job(entrypoint=entry, runtime_env=runtime_env(cfg), metadata={"pivot_preflight": "1"})
    while not client.get_job_status(job).is_terminal():
        if time.monotonic() - t0 > timeout_s:
            client.stop_job(job)
            raise RuntimeError(f"the Ray head at {address} did not run the preflight job {job} within {timeout_s:.0f} s "
                               "(`ray job logs` shows why): no shard was submitted")
        time.sleep(0.5)
    logs = client.get_job_logs(job)
    report = next((json.loads(line[len(MARK):]) for line in logs.splitlines() if line.startswith(MARK)), None)
    if report is None:
        last = next((line for line in reversed(logs.splitlines()) if line.strip()), "no output")
        raise RuntimeError(f"the Ray head at {address} cannot run shard jobs: its preflight job {job} ended "
                           f"{client.get_job_status(job).value} before checking anything ({last}); {START_HINT}")
    if not report["ok"]:
        raise RuntimeError(f"the Ray head at {address} cannot run shard jobs: a job's {report['where']} "
                           f"({report['python']}) {report['what']}; {_hint(cfg, report['what'])}")
    what = f"Ray head {address}: a job's driver and a worker {report['what']} ({time.monotonic() - t0:.1f} s)"
    log(what)
    return what


START_HINT = "start it from this project's environment, e.g. `PATH=$PWD/.venv/bin:$PATH ray start --head` (docs/scale.md)"


def _hint(cfg: PivotConfig, what: str) -> str:
    if what.startswith("cannot import"):
        return ("start the head with this project's venv first on PATH (`PATH=$PWD/.venv/bin:$PATH ray start --head`), "
                "or install the project on the cluster's image, or set scale.ray_runtime_env")
    if cfg.warehouse.startswith("s3://"):
        return ("start the head (and every node) with the warehouse's AWS variables in its environment "
                "(`AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_ENDPOINT_URL=... ray start --head`): "
                "shard jobs get no credentials from the submitter")
    return "the warehouse must be on storage every Ray node reaches at the same path (or use an s3:// warehouse)"


def _gist(e: BaseException) -> str:
    """The line that says what went wrong (a Ray task error ends its traceback with it)."""
    text = str(e).strip()
    return text.splitlines()[-1] if text else type(e).__name__
