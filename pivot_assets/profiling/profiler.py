"""Profiling: K reference-policy samples per turn, scored by the verifier, aggregated per turn (Dagster-free).

Keys and caching (nothing is computed twice):
    rollouts         (turn_id, policy_fp, sampling_fp, sample_index)   generation cache
    rollout_rewards  rollout key + verifier_fp                          scoring cache
Both are incremental part-tables: each part holds all K samples of whole turns and is written atomically,
so a turn is either fully present or absent, a kill -9 loses at most the part in flight, and a rerun
only generates for turns with no rows under the current (policy_fp, sampling_fp). A verifier change
re-scores from the cached completions and never regenerates a token.

Sharded (`scale.shards` > 1, profiling/shards.py): a Profiler works on one shard, reads and writes only that
shard's parts (<table>/shard=NNN/), with deterministic part names. The Ray engine (profiling/ray_job.py) expands
each turn into K rows, one sample each with its own seed (seeding "per_sample"): its rows resume per sample key
(turn_id, sample_index), and its sampling fingerprint says so, since they are other draws than the local
engine's K samples from one generator per turn (seeding "per_turn").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from pivot_assets.core.catalog import REWARDS_SCHEMA, ROLLOUTS_SCHEMA
from pivot_assets.core.hardware import Precision, resolve_dtype
from pivot_assets.core.ids import canonical_json, short_hash
from pivot_assets.core.progress import Progress
from pivot_assets.core.split import WARMUP, ConversationSplit
from pivot_assets.core.warehouse import Warehouse

from .shards import check_layout, part_key, read_sql, shard_turns

if TYPE_CHECKING:
    from pivot_assets.core.config import PivotConfig, PolicySection

SCORE_CHUNK = 20_000
PER_TURN, PER_SAMPLE = "per_turn", "per_sample"  # how samples are seeded (local engine, Ray engine)


# -- generation ------------------------------------------------------------------------------
def select_turns(wh: Warehouse, limit_turns: int | None, split: "ConversationSplit | None" = None) -> list[str]:
    """The turns to profile: all but the warm-up conversations' (the reference never profiles what it was trained
    on: core/split.py), or the first N of them by turn_id (a stable, content-derived order)."""
    limit = f"limit {int(limit_turns)}" if limit_turns else ""
    con = wh.duck()
    skip = sorted(split.trajectories(wh, WARMUP)) if split is not None and split.warmup_fraction else []
    con.register("warmup", pa.table({"trajectory_id": pa.array(skip, pa.string())}))
    rows = con.execute(f"select turn_id from read_parquet('{wh.table_path('turns')}') "
                       f"where trajectory_id not in (select trajectory_id from warmup) order by turn_id {limit}").fetchall()
    con.close()
    return [r[0] for r in rows]


def done_turns(wh: Warehouse, policy_fp: str, sampling_fp: str, shard: int | None = None) -> set[str]:
    if not wh.part_files("rollouts", shard):
        return set()
    rows = duckdb.execute(
        f"select distinct turn_id from {read_sql(wh, 'rollouts', shard)} "
        "where policy_fp = ? and sampling_fp = ?",
        [policy_fp, sampling_fp],
    ).fetchall()
    return {r[0] for r in rows}


def done_samples(wh: Warehouse, policy_fp: str, sampling_fp: str, shard: int | None = None) -> set[tuple[str, int]]:
    """(turn_id, sample_index) keys already generated: per-sample resume (a Ray batch may hold part of a turn)."""
    if not wh.part_files("rollouts", shard):
        return set()
    rows = duckdb.execute(
        f"select distinct turn_id, sample_index from {read_sql(wh, 'rollouts', shard)} "
        "where policy_fp = ? and sampling_fp = ?", [policy_fp, sampling_fp]).fetchall()
    return {(t, int(i)) for t, i in rows}


def turn_order(wh: Warehouse, turn_ids: Iterable[str]) -> list[str]:
    """The turns in (trajectory, message index) order: consecutive turns share their prompt prefix."""
    con = wh.duck()
    _with_wanted(con, turn_ids)
    rows = con.execute(f"select turn_id from read_parquet('{wh.table_path('turns')}') join wanted using (turn_id) "
                       "order by trajectory_id, message_index").fetchall()
    con.close()
    return [r[0] for r in rows]


def generation_requests(wh: Warehouse, turn_ids: Iterable[str]) -> list:
    """GenerationRequests (state rebuilt from trajectories.messages[:message_index]) in trajectory order,
    so a trajectory's turns sit together and the backend can reuse their shared prefix."""
    from pivot_assets.policies.base import GenerationRequest

    con = wh.duck()
    _with_wanted(con, turn_ids)
    rows = con.execute(
        f"""
        select u.turn_id, u.trajectory_id, u.message_index, t.messages, t.tools
        from read_parquet('{wh.table_path('turns')}') u
        join wanted using (turn_id)
        join read_parquet('{wh.table_path('trajectories')}') t using (trajectory_id)
        order by u.trajectory_id, u.message_index
        """
    ).fetchall()
    con.close()
    return [
        GenerationRequest(
            turn_id=tid,
            trajectory_id=trid,
            message_index=idx,
            messages=list(messages[:idx]),
            tools=json.loads(tools or "[]"),
        )
        for tid, trid, idx, messages, tools in rows
    ]


def generate_rollouts(
    wh: Warehouse, backend, policy_fp: str, sampling, requests: list, progress: Progress | None = None,
    shard: int | None = None,
) -> dict:
    """Generate K samples for each request; one atomic Parquet part per batch the backend yields.

    Rows are keyed by the caller's `policy_fp` (the same one `done_turns` looks up, so resume works). A shard's
    parts are named by their turns, so a rerun of the same batch overwrites it."""
    traj_of = {r.turn_id: r.trajectory_id for r in requests}
    n_rows = n_tokens = 0
    t0 = time.perf_counter()
    for batch in backend.generate(requests, sampling):
        if not batch:
            continue
        part = pa.Table.from_pylist(
            [
                {
                    "turn_id": s.turn_id,
                    "trajectory_id": traj_of[s.turn_id],
                    "policy_fp": policy_fp,
                    "sampling_fp": sampling.fingerprint,
                    "sample_index": s.sample_index,
                    "completion": s.completion,
                    "n_prompt_tokens": s.n_prompt_tokens,
                    "n_completion_tokens": s.n_completion_tokens,
                    "finish_reason": s.finish_reason,
                }
                for s in batch
            ],
            schema=ROLLOUTS_SCHEMA,
        )
        key = None if shard is None else part_key(policy_fp, sampling.fingerprint, rows={s.turn_id for s in batch})
        wh.append_part("rollouts", part, shard=shard, key=key)
        n_rows += len(batch)
        n_tokens += sum(s.n_completion_tokens for s in batch)
        if progress:
            progress.update(len(batch))
    wall = time.perf_counter() - t0
    return {"rollouts_generated": n_rows, "generated_tokens": n_tokens, "generation_s": round(wall, 2),
            "tokens_per_s": round(n_tokens / wall, 1) if wall > 0 else 0.0}


# -- scoring ---------------------------------------------------------------------------------
# Scoring merges three streams, all in trajectory-file order: the pending turns, the trajectories (each read
# and turned into Python once), and the unscored rollouts. A turn's state (messages[:message_index], a slice
# sharing the trajectory's messages) and its parsed tools are built once and shared by its K samples: no state
# is joined onto every sample. Memory follows SCORE_CHUNK and DuckDB's sort budget, not the table.
SCORE_MEMORY = "1GB"
TRAJECTORY_BATCH = 256


def unscored_rollouts_sql(wh: Warehouse, shard: int | None = None) -> str:
    """The current rollouts of the wanted turns with no reward under $verifier_fp: (turn_id, sample_index,
    completion) only, no state."""
    scored = (
        f"""and not exists (select 1 from {read_sql(wh, 'rollout_rewards', shard)} s
              where s.turn_id = r.turn_id and s.policy_fp = r.policy_fp and s.sampling_fp = r.sampling_fp
                and s.sample_index = r.sample_index and s.verifier_fp = $verifier_fp)"""
        if wh.part_files("rollout_rewards", shard)
        else ""
    )
    return f"""
        select r.turn_id, r.sample_index, r.completion
        from {read_sql(wh, 'rollouts', shard)} r
        join wanted using (turn_id)
        where r.policy_fp = $policy_fp and r.sampling_fp = $sampling_fp {scored}
    """


def pending_turns_sql(wh: Warehouse, shard: int | None = None) -> str:
    """The turns with unscored rollouts and where their trajectory is (its row in the trajectories file)."""
    return f"""
        select u.turn_id, u.domain, u.expert_action, u.message_index, t.file_row_number as trajectory_row
        from (select distinct turn_id from ({unscored_rollouts_sql(wh, shard)})) p
        join read_parquet('{wh.table_path('turns')}') u using (turn_id)
        join read_parquet('{wh.table_path('trajectories')}', file_row_number = true) t using (trajectory_id)
        order by trajectory_row, u.message_index
    """


def _with_wanted(con: duckdb.DuckDBPyConnection, turn_ids: Iterable[str]) -> None:
    """Register the turns being profiled (all, or the first limit_turns) as the table `wanted`."""
    con.register("wanted", pa.table({"turn_id": pa.array(sorted(set(turn_ids)), pa.string())}))


def _scoring_params(wh: Warehouse, policy_fp: str, sampling_fp: str, verifier_fp: str,
                    shard: int | None = None) -> dict:
    params = {"policy_fp": policy_fp, "sampling_fp": sampling_fp}
    if wh.part_files("rollout_rewards", shard):
        params["verifier_fp"] = verifier_fp
    return params


def _rows(reader) -> Iterator[dict]:
    """Rows of an Arrow record-batch stream, one batch in memory at a time."""
    for batch in reader:
        yield from batch.to_pylist()


class TurnContext:
    """What a turn's samples are scored against, built once per turn and shared by all of them."""

    __slots__ = ("domain", "expected_action", "tools", "state")

    def __init__(self, turn: dict, trajectory: dict):
        self.domain, self.expected_action = turn["domain"], turn["expert_action"]
        self.tools = trajectory["tools"]
        self.state = trajectory["messages"][: turn["message_index"]]


def _trajectories_in_file_order(wh: Warehouse) -> Iterator[dict]:
    """Every trajectory row in file order with a lazily built Python view: messages and parsed tools."""
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(wh.table_path("trajectories")).iter_batches(
            batch_size=TRAJECTORY_BATCH, columns=["messages", "tools"]):
        for i in range(batch.num_rows):
            yield _LazyTrajectory(batch, i)


class _LazyTrajectory(dict):
    """A trajectory row converted to Python only when a pending turn needs it (most rows may not)."""

    def __init__(self, batch: pa.RecordBatch, index: int):
        super().__init__()
        self._batch, self._index = batch, index

    def __missing__(self, key):
        row = self._batch.slice(self._index, 1).to_pylist()[0]
        self.update(messages=row["messages"] or [], tools=json.loads(row["tools"] or "[]"))
        return self[key]


def turn_contexts(wh: Warehouse, pending_turns: Iterator[dict]) -> Iterator[tuple[str, TurnContext]]:
    """(turn_id, context) for the pending turns (sorted by trajectory row), each trajectory read once."""
    trajectories = enumerate(_trajectories_in_file_order(wh))
    row, trajectory = -1, None
    for turn in pending_turns:
        while row < turn["trajectory_row"]:
            row, trajectory = next(trajectories)
        yield turn["turn_id"], TurnContext(turn, trajectory)


def scoring_batches(wh: Warehouse, con: duckdb.DuckDBPyConnection, params: dict,
                    chunk_rows: int = SCORE_CHUNK, shard: int | None = None) -> Iterator[list[tuple[dict, TurnContext]]]:
    """Batches of (rollout row, its turn's context), each of whole turns and about chunk_rows rows."""
    pending = con.execute(pending_turns_sql(wh, shard), params).fetch_arrow_table()  # small: no text but the action
    if pending.num_rows == 0:
        return
    con.register("pending", pending.select(["turn_id", "trajectory_row", "message_index"]))
    rollouts = _rows(con.execute(
        f"""select r.turn_id, r.sample_index, r.completion from ({unscored_rollouts_sql(wh, shard)}) r join pending p using (turn_id)
            order by p.trajectory_row, p.message_index, r.sample_index""", params).fetch_record_batch(chunk_rows))
    contexts = turn_contexts(wh, (row for b in pending.to_batches(max_chunksize=chunk_rows) for row in b.to_pylist()))
    batch: list[tuple[dict, TurnContext]] = []
    current_id, current = None, None
    for rollout in rollouts:
        if rollout["turn_id"] != current_id:
            if len(batch) >= chunk_rows:
                yield batch
                batch = []
            current_id = rollout["turn_id"]
            current = _advance_to(contexts, current_id)
        batch.append((rollout, current))
    if batch:
        yield batch


def _advance_to(contexts: Iterator[tuple[str, TurnContext]], turn_id: str) -> TurnContext:
    # both streams follow (trajectory row, message index) and every pending turn has rollouts
    for tid, context in contexts:
        if tid == turn_id:
            return context
    raise ValueError(f"turn {turn_id} has rollouts but no row in turns/trajectories")


def score_rollouts(
    wh: Warehouse, verifiers, policy_fp: str, sampling_fp: str, turn_ids: Iterable[str], progress_log=None,
    shard: int | None = None,
) -> dict:
    """Score every current rollout of the wanted turns not yet scored under this verifier fingerprint.

    One atomic part per batch of whole turns; each turn's state is read once and shared by its samples."""
    from pivot_assets.verifiers import parse_candidate

    verifier_fp = verifiers.fingerprint
    if not wh.part_files("rollouts", shard):  # an empty shard (no trajectory hashed to it) has nothing to score
        return {"rollouts_scored": 0, "scoring_s": 0.0, "reasons": {}, "scores_per_s": 0}
    con = wh.duck(memory_limit=SCORE_MEMORY)
    _with_wanted(con, turn_ids)
    n = 0
    reasons: dict[str, int] = {}
    t0 = time.perf_counter()
    params = _scoring_params(wh, policy_fp, sampling_fp, verifier_fp, shard)
    for batch in scoring_batches(wh, con, params, shard=shard):
        items = [{"domain": c.domain, "expected_action": c.expected_action, "candidate": r["completion"],
                  "tools": c.tools, "state": c.state} for r, c in batch]
        out = []
        for (rollout, context), sc in zip(batch, verifiers.score_rows(items)):
            action, _err = parse_candidate(rollout["completion"])
            out.append({
                "turn_id": rollout["turn_id"], "policy_fp": policy_fp, "sampling_fp": sampling_fp,
                "sample_index": rollout["sample_index"], "verifier_fp": verifier_fp, "domain": context.domain,
                "reward": float(sc.reward), "reason": sc.reason, "detail": sc.detail,
                "action": canonical_json(action) if action is not None else None,
            })
            reasons[sc.reason] = reasons.get(sc.reason, 0) + 1
        key = None if shard is None else part_key(verifier_fp, policy_fp, sampling_fp,
                                                       rows=(f"{r['turn_id']}:{r['sample_index']}" for r in out))
        wh.append_part("rollout_rewards", pa.Table.from_pylist(out, schema=REWARDS_SCHEMA), shard=shard, key=key)
        n += len(out)
        if progress_log:
            progress_log(f"scored {n} rollouts")
    con.close()
    wall = time.perf_counter() - t0
    return {"rollouts_scored": n, "scoring_s": round(wall, 2), "reasons": reasons,
            "scores_per_s": round(n / wall) if wall > 0 and n else 0}


# -- per-turn profiles -----------------------------------------------------------------------
def profiles_sql(wh: Warehouse, shard: int | None = None) -> str:
    """One row per turn under (policy_fp, sampling_fp, verifier_fp); population variance (ddof=0),
    so for binary rewards reward_var = mean * (1 - mean)."""
    return f"""
        select s.turn_id, u.trajectory_id, u.domain, s.policy_fp, s.sampling_fp, s.verifier_fp,
               count(*)::int as k,
               avg(s.reward) as reward_mean,
               var_pop(s.reward) as reward_var,
               stddev_pop(s.reward) as reward_std,
               count(*) filter (where s.reward >= 1.0)::int as n_pass,
               count(distinct coalesce(s.action, '<unparsed>'))::int as n_distinct_actions
        from {read_sql(wh, 'rollout_rewards', shard) if wh.part_files('rollout_rewards', shard) else 'no_rewards'} s
        join wanted using (turn_id)
        join read_parquet('{wh.table_path('turns')}') u using (turn_id)
        where s.policy_fp = $policy_fp and s.sampling_fp = $sampling_fp and s.verifier_fp = $verifier_fp
        group by all
        order by s.turn_id
    """


def build_profiles(wh: Warehouse, policy_fp: str, sampling_fp: str, verifier_fp: str, turn_ids: Iterable[str],
                   shard: int | None = None) -> pa.Table:
    con = wh.duck()
    _with_wanted(con, turn_ids)
    con.register("no_rewards", REWARDS_SCHEMA.empty_table())  # a shard with no rows yet has an empty profile
    table = con.execute(
        profiles_sql(wh, shard), {"policy_fp": policy_fp, "sampling_fp": sampling_fp, "verifier_fp": verifier_fp}
    ).fetch_arrow_table()
    con.close()
    return table


# -- the stage, as the three assets call it ----------------------------------------------------
SFT_MODEL = "sft"  # `policy.model: sft`: the warm-up model the sft_policy asset saved in the warehouse
# What changes the samples (the code version of `rollouts`); speed knobs (batch_size, concurrency) are not in it.
POLICY_IDENTITY = ("backend", "model", "base_url", "device", "k", "temperature", "top_p", "max_new_tokens", "seed",
                   "limit_turns", "chat_template", "thinking", "thinking_budget")


def policy_model(policy: "PolicySection", wh: Warehouse) -> str:
    return str(wh.model_dir("sft_policy")) if policy.model == SFT_MODEL else policy.model


def policy_precision(policy: "PolicySection") -> Precision:
    """The dtype profiling samples in (a server decides its own: reported as such)."""
    if policy.backend == "openai":
        return Precision("server", policy.dtype, "server", "the server chooses its dtype")
    return resolve_dtype(policy.dtype, "cuda" if policy.backend == "vllm" else policy.device)


def policy_version(policy: "PolicySection", seeding: str = PER_TURN) -> str:
    """Code version of `rollouts`: the policy identity with the *resolved* dtype (bf16 and fp32 sample
    slightly different tokens, so moving to a CPU without bf16 must regenerate) and, for the Ray engine, its
    per-sample seeding (other draws than the local engine's)."""
    identity = {k: v for k, v in policy.model_dump().items() if k in POLICY_IDENTITY}
    extra = {} if seeding == PER_TURN else {"seeding": seeding}
    return short_hash(canonical_json({**identity, "dtype": policy_precision(policy).dtype, **extra}))


def seeding_of(engine: str) -> str:
    """The Ray engine samples each (turn, sample_index) row with its own seed; the local engine K per turn."""
    return PER_SAMPLE if engine == "ray" else PER_TURN


def sampling_fingerprint(sampling, seeding: str = PER_TURN) -> str:
    """The rows' sampling_fp: the sampling config's, marked when samples are seeded one by one."""
    return sampling.fingerprint if seeding == PER_TURN else short_hash(f"{sampling.fingerprint}|{seeding}")


def sample_seed(seed: int, sample_index: int) -> int:
    """The seed of sample i of every turn under per-sample seeding (the backend then seeds by (this, turn_id))."""
    from pivot_assets.core.ids import seeded_int

    return seeded_int(seed, f"sample:{sample_index}")


class Profiler:
    """rollouts -> rollout_rewards -> turn_profiles for one configured policy and verifier set.

    The fingerprints and the turns to profile are computed once per instance; the Dagster assets each
    make one call: generate(), score(), profile().
    """

    def __init__(self, wh: Warehouse, policy: "PolicySection", verifiers, threads: int | str = "auto",
                 shard: int | None = None, shards: int = 1, seeding: str = PER_TURN,
                 split: ConversationSplit | None = None):
        self.wh, self.policy, self.verifiers, self.threads, self.split = wh, policy, verifiers, threads, split
        self.precision = policy_precision(policy)
        self.shard, self.shards, self.seeding = shard, shards, seeding
        if (shard is None) != (shards == 1):
            raise ValueError(f"a Profiler works on one shard of {shards}, or unsharded (shard None, shards 1)")

    @classmethod
    def for_config(cls, cfg: "PivotConfig", verifiers=None, shard: int | None = None) -> "Profiler":
        """The Profiler of one shard (or of the whole table when scale.shards is 1) under this config."""
        return cls(Warehouse(cfg.warehouse_dir), cfg.policy, verifiers, cfg.runtime.threads, shard=shard,
                   shards=cfg.scale.shards, seeding=seeding_of(cfg.scale.engine),
                   split=ConversationSplit.from_config(cfg))

    @cached_property
    def sampling(self):
        from pivot_assets.policies.base import SamplingConfig

        return SamplingConfig.from_policy(self.policy)

    @cached_property
    def sampling_fp(self) -> str:
        return sampling_fingerprint(self.sampling, self.seeding)

    @cached_property
    def policy_fp(self) -> str:
        """Fingerprint of the configured reference policy, without loading it."""
        from pivot_assets.policies.models import PromptFormat, policy_fingerprint

        if self.policy.backend == "openai":  # the server renders with its own template; thinking is sent to it
            thinking = "" if self.policy.thinking == "keep" else f"|think:{self.policy.thinking}"
            return f"openai|{self.policy.base_url}|{self.policy.model}{thinking}"
        model = policy_model(self.policy, self.wh)
        fmt = PromptFormat.from_policy(self.policy)  # the template and thinking mode change the samples
        return f"{policy_fingerprint(model, fmt)}|{self.policy.backend}:{self.precision.dtype}"

    @cached_property
    def turns(self) -> list[str]:
        """The wanted turns (all outside the warm-up split, or the first limit_turns of them), then those of this
        shard: the shards of a limit_turns config together profile exactly the turns one unsharded run would."""
        turns = select_turns(self.wh, self.policy.limit_turns, self.split)
        return turns if self.shard is None else shard_turns(self.wh, turns, self.shard, self.shards)

    def generate(self, log: Callable[[str], None] | None = None) -> dict:
        """K samples for every wanted turn not yet sampled under (policy_fp, sampling_fp)."""
        if self.seeding != PER_TURN:
            raise ValueError("per-sample seeding generates on the Ray engine (profiling/ray_job.py), not here")
        self.wh.clean_temp_files("rollouts")
        check_layout(self.wh, self.shards)
        done = done_turns(self.wh, self.policy_fp, self.sampling.fingerprint, self.shard)
        pending = [t for t in self.turns if t not in done]
        if log:
            log(f"{len(self.turns)} turns wanted, {len(self.turns) - len(pending)} cached, {len(pending)} to generate"
                f" ({self.policy.backend}, {self.precision.dtype}: {self.precision.reason})")
        stats: dict = {"turns_profiled": len(self.turns), "turns_generated": len(pending),
                       "cache_hits_turns": len(self.turns) - len(pending), "samples_per_turn": self.sampling.k,
                       "policy_fp": self.policy_fp, "sampling_fp": self.sampling.fingerprint,
                       **self.precision.as_metadata()}
        if pending:
            from pivot_assets.core.hardware import configure_torch
            from pivot_assets.policies.factory import build_backend

            if self.policy.backend == "transformers":
                configure_torch(self.threads)
            backend = build_backend(self.policy, model=policy_model(self.policy, self.wh))
            progress = Progress(total=len(pending) * self.sampling.k, log=log)
            stats.update(generate_rollouts(self.wh, backend, self.policy_fp, self.sampling,
                                           generation_requests(self.wh, pending), progress, shard=self.shard))
            stats.update({k: v for k, v in backend.stats.items() if isinstance(v, (int, float))})
        return stats

    def score(self, log: Callable[[str], None] | None = None) -> dict:
        """Score every current rollout of the wanted turns not yet scored under this verifier set."""
        self.wh.clean_temp_files("rollout_rewards")
        stats = score_rollouts(self.wh, self.verifiers, self.policy_fp, self.sampling_fp, self.turns,
                               progress_log=log, shard=self.shard)
        return {"verifier_fp": self.verifiers.fingerprint, **stats}

    def profile(self) -> pa.Table:
        """One row per wanted turn under (policy_fp, sampling_fp, verifier_fp)."""
        return build_profiles(self.wh, self.policy_fp, self.sampling_fp, self.verifiers.fingerprint,
                              self.turns, shard=self.shard)

    def write_profiles(self, table: pa.Table) -> None:
        """The whole table unsharded; one part per shard (always the same name: a rerun replaces it)."""
        if self.shard is None:
            self.wh.write_table("turn_profiles", table)
        else:
            self.wh.append_part("turn_profiles", table, shard=self.shard, key="profiles")

    # -- per-sample generation (the Ray engine's rows; ray_job.py feeds them through Ray Data) -------
    def pending_samples(self) -> list[dict]:
        """(turn_id, sample_index) rows of this shard not yet generated, in trajectory order, so a batch holds
        consecutive turns of a trajectory (prefix reuse). The transformers backend decodes a turn's K rows
        together (one prefill): turn-major. Others take one sample seed per call: sample-major."""
        check_layout(self.wh, self.shards)
        self.wh.clean_temp_files("rollouts")
        done = done_samples(self.wh, self.policy_fp, self.sampling_fp, self.shard)
        order, k = turn_order(self.wh, self.turns), range(self.sampling.k)
        pairs = ((t, i) for t in order for i in k) if self.policy.backend == "transformers" else \
            ((t, i) for i in k for t in order)
        return [{"turn_id": t, "sample_index": i} for t, i in pairs if (t, i) not in done]

    def generate_samples(self, backend, rows: list[dict]) -> dict:
        """Generate one sample per (turn_id, sample_index) row, each seeded by (sample_seed(seed, i), turn_id);
        write them as ONE part named by its rows, so a retried batch overwrites its own part."""
        requests = {q.turn_id: q for q in generation_requests(self.wh, {r["turn_id"] for r in rows})}
        t0 = time.perf_counter()
        samples = (self._samples_per_row(backend, rows, requests) if getattr(backend, "per_row_seeds", False)
                   else self._samples_per_index(backend, rows, requests))
        part = pa.Table.from_pylist([
            {"turn_id": s.turn_id, "trajectory_id": requests[s.turn_id].trajectory_id, "policy_fp": self.policy_fp,
             "sampling_fp": self.sampling_fp, "sample_index": s.sample_index, "completion": s.completion,
             "n_prompt_tokens": s.n_prompt_tokens, "n_completion_tokens": s.n_completion_tokens,
             "finish_reason": s.finish_reason} for s in samples], schema=ROLLOUTS_SCHEMA)
        key = part_key(self.policy_fp, self.sampling_fp, rows=(f"{s.turn_id}:{s.sample_index}" for s in samples))
        self.wh.append_part("rollouts", part, shard=self.shard, key=key)
        return {"rows": len(samples), "tokens": sum(s.n_completion_tokens for s in samples),
                "seconds": time.perf_counter() - t0}

    def _samples_per_index(self, backend, rows: list[dict], requests: dict) -> list:
        """One backend call per sample index i (K=1 under sample_seed(seed, i)), the turns of that index batched."""
        from dataclasses import replace

        by_index: dict[int, list[str]] = {}
        for r in rows:
            by_index.setdefault(int(r["sample_index"]), []).append(str(r["turn_id"]))
        samples = []
        for i, turn_ids in sorted(by_index.items()):
            one = replace(self.sampling, k=1, seed=sample_seed(self.sampling.seed, i))
            for batch in backend.generate([requests[t] for t in turn_ids], one):
                samples += [replace(s, sample_index=i) for s in batch]
        return samples

    def _samples_per_row(self, backend, rows: list[dict], requests: dict) -> list:
        """One backend call: a turn's rows share its prefill and decode loop, each row drawing from its own
        generator seeded as _samples_per_index seeds it (the same draws, one prefill instead of K)."""
        plan: dict[str, list[tuple[int, int]]] = {}
        for r in rows:
            i = int(r["sample_index"])
            plan.setdefault(str(r["turn_id"]), []).append((i, sample_seed(self.sampling.seed, i)))
        return [s for batch in backend.generate([requests[t] for t in plan], self.sampling, rows=plan) for s in batch]
