"""Run and inspect the Dagster definitions in-process, recorded in the instance under $DAGSTER_HOME
(so CLI runs show up in the UI beside the UI's own runs)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from pivot_assets.core.parallel import process_token
from pivot_assets.materialization import PROCESS_TAG


def ensure_dagster_home(base_dir: Path) -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or (base_dir / ".dagster_home")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    if not settings.exists():  # a local, private instance: no telemetry banner or pings
        settings.write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def parse_selection(defs: dg.Definitions, selection: str | None) -> list[dg.AssetKey]:
    """Dagster's asset selection syntax, or a comma-separated list of asset names; None = everything."""
    graph = defs.resolve_asset_graph()
    all_keys = set(graph.get_all_asset_keys())
    if not selection:
        return sorted(all_keys, key=lambda k: k.to_user_string())
    names = [s.strip() for s in selection.split(",") if s.strip()]
    if all(dg.AssetKey(n) in all_keys for n in names):
        keys = {dg.AssetKey(n) for n in names}
    else:
        try:
            keys = set(dg.AssetSelection.from_string(selection).resolve(graph))
        except Exception as e:  # Dagster raises several types for a bad selection string
            known = ", ".join(sorted(k.to_user_string() for k in all_keys))
            raise ValueError(f"bad selection {selection!r}: {str(e).splitlines()[0]} (assets: {known})") from None
        if not keys:
            raise ValueError(f"selection {selection!r} matches no asset")
    return sorted(_with_siblings(defs, keys), key=lambda k: k.to_user_string())


def selection_groups(defs: dg.Definitions, keys: list[dg.AssetKey]) -> set[str]:
    """The asset groups (ingest, profiling, ...) the keys belong to: what a run of them loads (preflight.py)."""
    graph = defs.resolve_asset_graph()
    return {graph.get(k).group_name for k in keys}


def _with_siblings(defs: dg.Definitions, keys: set[dg.AssetKey]) -> set[dg.AssetKey]:
    """A non-subsettable multi-asset (trajectories + quarantine) is always run whole."""
    out = set(keys)
    for ad in defs.assets or []:
        if isinstance(ad, dg.AssetsDefinition) and not ad.can_subset and ad.keys & keys:
            out |= set(ad.keys)
    return out


@dataclass
class RunReport:
    success: bool
    run_id: str
    materialized: list[str]
    failed_checks: list[str]
    skipped: list[str]
    error: str | None = None


# how a stop signal shows in a failed step's error: Dagster's interrupt, or DuckDB's when the signal landed inside a
# query (during a step Dagster's own SIGTERM handler runs, so the process's stop record may not see the signal)
INTERRUPTED_MARKS = ("Interrupted", "Query interrupted")


def print_report(report, label: str = "run", stopped: bool = False) -> bool:
    """The run's outcome as the lines `pivot run` prints; True when it succeeded. stopped: this process took a
    stop signal (supervisor.stop_requested), so a failure is the stop's doing, whatever the step raised."""
    if not report.success and (stopped or any(mark in (report.error or "") for mark in INTERRUPTED_MARKS)):
        raise KeyboardInterrupt  # stopped by a signal: one line from the supervisor (or main), not a run report
    print(f"{label} {report.run_id}: materialized {', '.join(report.materialized) or 'nothing'}")
    for check in report.failed_checks:
        print(f"failed check: {check}")
    if report.skipped:
        print(f"not materialized: {', '.join(report.skipped)}")
    if not report.success:
        print(f"error: {label} failed: {report.error or 'see the Dagster UI for the run log'}", file=sys.stderr)
    return report.success


def _failed_check(evaluation) -> str:
    """`asset:check`, then what failed as the check described it (a contract: expectation, column, one row)."""
    name = f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}"
    return f"{name}: {evaluation.description}" if evaluation.description else name


def create_pools(instance: dg.DagsterInstance, pools: set[str], attempts: int = 5) -> None:
    """Give each pool the job's steps claim its limit row before the run starts. Dagster inserts that row on a
    step's first claim, and two runs claiming a new pool at once race on the insert in its Postgres storage (one
    fails with a unique violation); here the loser retries and finds the row."""
    from sqlalchemy.exc import DBAPIError

    storage = instance.event_log_storage
    if instance.global_op_concurrency_default_limit is None or not storage.supports_global_concurrency_limits:
        return  # without a default limit a step's claim creates nothing
    for pool in sorted(pools):
        for attempt in range(attempts):
            try:
                if pool not in storage.get_concurrency_keys():
                    storage.initialize_concurrency_limit_to_default(pool)
                break
            except DBAPIError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.1 * (attempt + 1))


def job_for(defs: dg.Definitions, keys: list[dg.AssetKey], partitioned: bool = False) -> dg.JobDefinition:
    """The named job that holds every key (pivot_pipeline, else the ablation's), so the UI lists the run under that
    job and on its Overview; Dagster's anonymous implicit asset job for a shard's partition (one partitions
    definition) or a selection no named job holds."""
    from pivot_jobs import ABLATION_JOB, PIPELINE_JOB

    names = {j.name for j in defs.resolve_all_job_defs()}
    for name in () if partitioned else (PIPELINE_JOB, ABLATION_JOB):
        job = defs.resolve_job_def(name) if name in names else None
        if job is not None and set(keys) <= job.asset_layer.executable_asset_keys:
            return job
    return defs.resolve_implicit_global_asset_job_def()


def run_labels(job: dg.JobDefinition) -> dict[str, str]:
    """The tag the UI finds a run's code location by: without it a run of a named job is missing from the job's
    page and the Overview timeline (an in-process run has no location of its own)."""
    from dagster._core.definitions.repository_definition.valid_definitions import (
        SINGLETON_REPOSITORY_NAME,
    )
    from dagster._core.storage.tags import REPOSITORY_LABEL_TAG

    from pivot_jobs import CODE_LOCATION

    if job.name.startswith("__"):
        return {}
    return {REPOSITORY_LABEL_TAG: f"{SINGLETON_REPOSITORY_NAME}@{CODE_LOCATION}"}


def run_origin(job: dg.JobDefinition):
    """The code location and job a run of a named job belongs to, recorded on the run as launched runs have it: the
    UI's Overview timeline groups runs by it (a run without one is left off) and the job's page finds them by it."""
    from dagster._core.definitions.repository_definition.valid_definitions import (
        SINGLETON_REPOSITORY_NAME,
    )
    from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

    from pivot_jobs import CODE_LOCATION

    if job.name.startswith("__"):
        return None
    return RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin(CODE_LOCATION), SINGLETON_REPOSITORY_NAME),
                           job.name)


@contextlib.contextmanager
def runs_recorded_with(instance: dg.DagsterInstance, origin):
    """execute_in_process creates its run with no origin: for the duration, the instance creates runs with
    `origin` (an instance attribute shadowing the method, removed again on exit)."""
    if origin is None:
        yield
        return
    instance.create_run_for_job = functools.partial(instance.create_run_for_job, remote_job_origin=origin)
    try:
        yield
    finally:
        del instance.create_run_for_job


def run_assets(defs: dg.Definitions, keys: list[dg.AssetKey], instance: dg.DagsterInstance,
               run_id: str | None = None, partition_key: str | None = None,
               prewarm_contracts: bool = True) -> RunReport:
    """One run of `keys` (of one shard's partition when partition_key is given). prewarm_contracts: import Great
    Expectations in the background while the first steps run (False where the checks will likely read kept
    results: GE's import and context cost seconds of CPU)."""
    job = job_for(defs, keys, partitioned=partition_key is not None)
    # sqlalchemy.orm, which GE and Dagster's instance queries both import lazily, is imported here first so the
    # two threads never race on it.
    import sqlalchemy.orm  # noqa: F401

    from pivot_assets.curation.contracts import prewarm

    if prewarm_contracts:
        prewarm()
    create_pools(instance, job.graph.pools)
    # Dagster's console logger defaults to DEBUG (every engine event); stage progress lines are INFO.
    level = os.environ.get("PIVOT_LOG_LEVEL", "INFO").upper()
    token = process_token()
    with runs_recorded_with(instance, run_origin(job)):
        result = job.execute_in_process(
            instance=instance,
            asset_selection=keys,
            raise_on_error=False,
            run_id=run_id,
            partition_key=partition_key,
            tags={**run_labels(job), **({PROCESS_TAG: token} if token else {})},
            run_config={"loggers": {"console": {"config": {"log_level": level}}}},
        )
    materialized = sorted(
        {e.asset_key.to_user_string() for e in result.get_asset_materialization_events() if e.asset_key}
    )
    failed_checks = [_failed_check(e.asset_check_evaluation_data) for e in result.all_events
                     if e.event_type_value == "ASSET_CHECK_EVALUATION" and not e.asset_check_evaluation_data.passed]
    error = None
    if not result.success:
        for e in result.all_events:
            if e.event_type_value == "STEP_FAILURE":
                err = e.step_failure_data.error
                msg = (err.cause or err).message if err else "step failed"
                error = f"{e.step_key}: {msg.strip().splitlines()[-1] if msg.strip() else 'failed'}"
                break
    skipped = sorted({k.to_user_string() for k in keys} - set(materialized))
    return RunReport(result.success, result.run_id, materialized, failed_checks, skipped, error)


def cancel_run(run_id: str, message: str) -> bool:
    """Mark a run that lost its worker (killed) as canceled, so the UI does not show it running forever."""
    instance = dg.DagsterInstance.get()
    run = instance.get_run_by_id(run_id)
    if run is None or run.is_finished:
        return False
    instance.report_run_canceled(run, message=message)
    return True


@dataclass(frozen=True)
class StaleRow:
    key: dg.AssetKey
    partition: str | None  # a shard's partition key; None for an unpartitioned asset
    status: str  # STALE | MISSING
    reason: str

    @property
    def name(self) -> str:
        """`rollouts[002]` for a shard, the asset name otherwise."""
        return self.key.to_user_string() + (f"[{self.partition}]" if self.partition is not None else "")


def stale_assets(defs: dg.Definitions, instance: dg.DagsterInstance,
                 include_missing: bool = True) -> list[tuple[str, str, str]]:
    """(asset, STALE|MISSING, reason) for every asset (shard: `asset[NNN]`) that is not fresh, in graph order."""
    return [(r.name, r.status, r.reason) for r in stale_targets(defs, instance, include_missing)]


def stale_targets(defs: dg.Definitions, instance: dg.DagsterInstance,
                  include_missing: bool = True) -> list[StaleRow]:
    """Every asset, and every shard of a partitioned one, that is not fresh, in graph order.

    Partitioned assets are asked per partition: asked without a key, Dagster reports one as FRESH. A
    materialized asset below a STALE one is STALE too (it will change when that one reruns): a shard below its
    own shard of a parent, an unpartitioned asset below any shard. Below a MISSING one it is STALE only with
    include_missing: `pivot run --stale` reruns what exists and never starts a stage nobody asked for (a
    verifier change must not launch SFT on a profiling-only warehouse).
    """
    from dagster._core.asset_graph_view.asset_graph_view import (
        AssetGraphView,
        TemporalContext,
    )
    from dagster._core.definitions.data_version import (
        CachingStaleStatusResolver,
        StaleStatus,
    )
    from dagster._time import get_current_datetime

    graph = defs.resolve_asset_graph()
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    resolver = CachingStaleStatusResolver(instance=instance, asset_graph=graph, loading_context=view)
    out: dict[tuple[dg.AssetKey, str | None], StaleRow] = {}

    def not_fresh(parent: dg.AssetKey, partition: str | None) -> list[StaleRow]:
        """The parent's rows this (asset, partition) sits below: the same shard, or every shard of it."""
        return [r for (k, p), r in out.items() if k == parent and (partition is None or p in (None, partition))]

    for key in graph.toposorted_asset_keys:
        node = graph.get(key)
        for partition in (node.partitions_def.get_partition_keys() if node.partitions_def else [None]):
            status = resolver.get_status(key, partition)
            if status == StaleStatus.MISSING:
                out[(key, partition)] = StaleRow(key, partition, "MISSING", "never materialized")
            elif status == StaleStatus.STALE:
                causes = resolver.get_stale_root_causes(key, partition) or resolver.get_stale_causes(key, partition)
                out[(key, partition)] = StaleRow(key, partition, "STALE",
                                                 "; ".join(sorted({_cause_text(c) for c in causes})) or "stale")
            else:
                # Dagster reports only direct causes; a materialized asset below a stale or missing one
                # will change when that one is rerun, so it is stale too.
                upstream = sorted({r.key.to_user_string() for p in node.parent_keys for r in not_fresh(p, partition)
                                   if include_missing or r.status == "STALE"})
                if upstream:
                    out[(key, partition)] = StaleRow(key, partition, "STALE",
                                                     f"upstream {', '.join(upstream)} is stale or missing")
    return list(out.values())


# -- one run per shard -------------------------------------------------------------------------------------------
@dataclass
class RunPlan:
    """What `pivot run` executes, in order: the unpartitioned assets the shards need, then one run per shard
    (a run over several partitions would report one data version for all of them), then the rest."""

    before: list[dg.AssetKey]
    shards: dict[str, list[dg.AssetKey]]  # partition key -> the partitioned assets that shard runs
    after: list[dg.AssetKey]

    def describe(self) -> str:
        parts = []
        if self.before:
            parts.append(", ".join(k.to_user_string() for k in self.before))
        if self.shards:
            names = sorted({k.to_user_string() for keys in self.shards.values() for k in keys})
            parts.append(f"{', '.join(names)} in {len(self.shards)} shard run(s) ({', '.join(sorted(self.shards))})")
        if self.after:
            parts.append(", ".join(k.to_user_string() for k in self.after))
        return "; then ".join(parts)


def plan_runs(defs: dg.Definitions, targets: list[tuple[dg.AssetKey, str | None]]) -> RunPlan:
    """Split (asset, partition) targets into RunPlan order; a partitioned asset given without a partition means
    every shard of it."""
    graph = defs.resolve_asset_graph()
    shards: dict[str, set[dg.AssetKey]] = {}
    unpartitioned: set[dg.AssetKey] = set()
    for key, partition in targets:
        pdef = graph.get(key).partitions_def
        if pdef is None:
            unpartitioned.add(key)
        else:
            for p in [partition] if partition is not None else pdef.get_partition_keys():
                shards.setdefault(p, set()).add(key)
    partitioned = {k for keys in shards.values() for k in keys}
    needed = set().union(*(graph.get_ancestor_asset_keys(k) for k in partitioned)) if partitioned else set()
    order = {k: i for i, k in enumerate(graph.toposorted_asset_keys)}

    def ordered(keys):
        return sorted(keys, key=order.__getitem__)

    before = _with_siblings(defs, unpartitioned & needed) & unpartitioned  # a multi-asset runs whole
    return RunPlan(before=ordered(before), shards={p: ordered(keys) for p, keys in sorted(shards.items())},
                   after=ordered(unpartitioned - before))


def _cause_text(cause) -> str:
    dep = f" ({cause.dependency_asset_key.to_user_string()})" if cause.dependency else ""
    return f"{cause.asset_key.to_user_string()}: {cause.reason}{dep}"
