"""Profiling: K reference-policy samples per turn, scored by the verifier, aggregated per turn (Dagster-free).

Keys and caching (nothing is computed twice):
    rollouts         (turn_id, policy_fp, sampling_fp, sample_index)   generation cache
    rollout_rewards  rollout key + verifier_fp                          scoring cache
Both are incremental part-tables written atomically, one part per batch of whole turns (all of a turn's samples
in that batch: its K, or one round's under adaptive profiling), so a kill -9 loses at most the part in flight and
a rerun generates only the sample keys missing under the current (policy_fp, sampling_fp). A verifier change
re-scores from the cached completions and never regenerates a token.

Sharded (`scale.shards` > 1, profiling/shards.py): a Profiler works on one shard, reads and writes only that
shard's parts (<table>/shard=NNN/), with deterministic part names.

Seeding (`profiling.seeding`). per_sample (the default): sample i of a turn is drawn under its own seed
(sample_seed(policy.seed, i), then by turn), so it is the same draw whatever k, the engine (local or Ray) or
adaptive stopping (profiling/adaptive.py). Rows resume per sample key (turn_id, sample_index); their sampling_fp
leaves k out, so raising k generates only the missing samples, and every read takes sample_index < k. per_turn:
one generator for a turn's K samples (the local engine's earlier seeding; its sampling_fp includes k).

The expert action's log-likelihood (policies/base.ActionLikelihood) is computed on the prefill of a turn's first
generated batch by a backend that can, and stored in `expert_likelihoods`, keyed like the rollouts without the
sample index; turn_profiles shows it per turn.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import cached_property
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from pivot_assets.core import parts
from pivot_assets.core.catalog import EXPERT_LIKELIHOODS_SCHEMA, REWARDS_SCHEMA, ROLLOUTS_SCHEMA
from pivot_assets.core.config import LAMBDA_DIFF
from pivot_assets.core import hardware
from pivot_assets.core.hardware import Precision
from pivot_assets.core.identity import ROLLOUTS, adaptive_identity, fingerprint, values
from pivot_assets.core.ids import canonical_json
from pivot_assets.core.progress import Progress
from pivot_assets.core.split import WARMUP, ConversationSplit
from pivot_assets.core.warehouse import Warehouse
from pivot_assets.environments import TurnState
from pivot_assets.policies.factory import capabilities

from . import adaptive as adaptive_rule
from . import prompt_guard
from .shards import check_layout, part_key, read_sql, shard_turns

_log = logging.getLogger(__name__)
# The whole tables profiling reads and the command that rebuilds each from the inputs (ingest and turns rewrite
# them on every run of theirs).
INPUT_TABLES_FIX = {"trajectories": "pivot run --select trajectories,quarantine,turns",
                    "turns": "pivot run --select turns"}

if TYPE_CHECKING:
    from pivot_assets.core.config import AdaptiveSection, PivotConfig, PolicySection

SCORE_CHUNK = 20_000
SERVED_PART_ROWS = 4096  # rollouts rows per part from a served engine (Profiler.part_rows)
PER_TURN, PER_SAMPLE = "per_turn", "per_sample"  # how samples are seeded (`profiling.seeding`)


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


def done_likelihoods(wh: Warehouse, policy_fp: str, sampling_fp: str, shard: int | None = None) -> set[str]:
    """Turns whose expert-action likelihood is stored under (policy_fp, sampling_fp)."""
    if not wh.part_files("expert_likelihoods", shard):
        return set()
    rows = duckdb.execute(f"select distinct turn_id from {read_sql(wh, 'expert_likelihoods', shard)} "
                          "where policy_fp = ? and sampling_fp = ?", [policy_fp, sampling_fp]).fetchall()
    return {r[0] for r in rows}


def write_likelihoods(wh: Warehouse, likelihoods: list, policy_fp: str, sampling_fp: str, shard: int | None,
                      key: str | None) -> None:
    """One part of expert_likelihoods, named like the rollouts part written with it (a rerun overwrites both)."""
    if not likelihoods:
        return
    part = pa.Table.from_pylist([{"turn_id": x.turn_id, "policy_fp": policy_fp, "sampling_fp": sampling_fp,
                                  "expert_logprob": x.logprob, "expert_tokens": x.n_tokens} for x in likelihoods],
                                schema=EXPERT_LIKELIHOODS_SCHEMA)
    wh.append_part("expert_likelihoods", part, shard=shard, key=key)


def turn_positions_sql(wh: Warehouse) -> str:
    """The wanted turns (turn_id, trajectory_id, message_index, trajectory_row: the trajectory's row in its file) in
    generation order, (trajectory row, message index): a trajectory's turns sit together (their prompts share a
    prefix) and the trajectories are read once, in file order. Narrow: no message is read."""
    return f"""
        select u.turn_id, u.trajectory_id, u.message_index, t.trajectory_row
        from read_parquet('{wh.table_path('turns')}') u
        join wanted using (turn_id)
        join (select trajectory_id, file_row_number as trajectory_row
              from read_parquet('{wh.table_path('trajectories')}', file_row_number = true)) t using (trajectory_id)
        order by t.trajectory_row, u.message_index
    """


def turn_order(wh: Warehouse, turn_ids: Iterable[str]) -> list[str]:
    """The turns in generation order (turn_positions_sql)."""
    con = wh.duck()
    _with_wanted(con, turn_ids)
    rows = con.execute(f"select turn_id from ({turn_positions_sql(wh)})").fetchall()
    con.close()
    return [r[0] for r in rows]


def generation_requests(wh: Warehouse, turn_ids: Iterable[str], experts: Iterable[str] = ()) -> list:
    """GenerationRequests (state rebuilt from trajectories.messages[:message_index]) in generation order
    (turn_positions_sql), so a trajectory's turns sit together and the backend can reuse their shared prefix. The
    turns in `experts` also carry their expert message (messages[message_index]), for its likelihood."""
    return list(generation_request_stream(wh, turn_ids, experts))


def generation_request_stream(wh: Warehouse, turn_ids: Iterable[str], experts: Iterable[str] = ()) -> Iterator:
    """generation_requests as a stream: the turns' positions (narrow, in generation order) merged with the
    trajectories read in file order, TRAJECTORY_BATCH rows in memory at a time (a join sorted in DuckDB would hold
    every turn's whole trajectory)."""
    experts = set(experts)
    from pivot_assets.policies.base import GenerationRequest

    con = wh.duck()
    _with_wanted(con, turn_ids)
    positions = _rows(con.execute(turn_positions_sql(wh)).fetch_record_batch(65_536))
    trajectories = enumerate(_trajectories_in_file_order(wh))
    row, trajectory = -1, None
    try:
        for turn in positions:
            while row < turn["trajectory_row"]:
                row, trajectory = next(trajectories)
            messages, idx = trajectory["messages"], turn["message_index"]
            yield GenerationRequest(turn_id=turn["turn_id"], trajectory_id=turn["trajectory_id"], message_index=idx,
                                    messages=list(messages[:idx]), tools=trajectory["tools"],
                                    expert=messages[idx] if turn["turn_id"] in experts else None)
    finally:
        con.close()


def generate_rollouts(
    wh: Warehouse, backend, policy_fp: str, sampling, requests: list, progress: Progress | None = None,
    shard: int | None = None,
) -> dict:
    """Generate K samples for each request; one atomic Parquet part per batch the backend yields.

    Rows are keyed by the caller's `policy_fp` (the same one `done_turns` looks up, so resume works). A shard's
    parts are named by their turns, so a rerun of the same batch overwrites it."""
    from pivot_assets.policies.base import likelihoods_of

    traj_of = {r.turn_id: r.trajectory_id for r in requests}
    n_rows = n_tokens = 0
    t0 = time.perf_counter()
    for batch in backend.generate(requests, sampling):
        if not batch:
            continue
        key = part_key(policy_fp, sampling.fingerprint, rows={s.turn_id for s in batch})
        write_likelihoods(wh, likelihoods_of(batch), policy_fp, sampling.fingerprint, shard, key)
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
        wh.append_part("rollouts", part, shard=shard, key=None if shard is None else key)
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


def unscored_rollouts_sql(wh: Warehouse, shard: int | None = None, k: int | None = None) -> str:
    """The current rollouts (sample_index < k) of the wanted turns with no reward under $verifier_fp: (turn_id,
    sample_index, completion) only, no state."""
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
        where r.policy_fp = $policy_fp and r.sampling_fp = $sampling_fp {_below_k('r', k)} {scored}
    """


def _below_k(alias: str, k: int | None) -> str:
    """The samples a budget of k takes (per-sample rows of a larger k share the key; per-turn rows are all < k)."""
    return "" if k is None else f"and {alias}.sample_index < {int(k)}"


def pending_turns_sql(wh: Warehouse, shard: int | None = None, k: int | None = None) -> str:
    """The turns with unscored rollouts and where their trajectory is (its row in the trajectories file)."""
    return f"""
        select u.turn_id, u.domain, u.expert_action, u.message_index, t.file_row_number as trajectory_row
        from (select distinct turn_id from ({unscored_rollouts_sql(wh, shard, k)})) p
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
        # the messages before the turn, with the trajectory's environment for verifiers that execute
        self.state = TurnState(trajectory["messages"][: turn["message_index"]], trajectory["environment"])


def _trajectories_in_file_order(wh: Warehouse) -> Iterator[dict]:
    """Every trajectory row in file order with a lazily built Python view: messages and parsed tools."""
    import pyarrow.parquet as pq

    file = pq.ParquetFile(wh.table_path("trajectories"))
    # environment: trajectories ingested before the column existed have none (their turns are not executable)
    columns = ["messages", "tools", *(["environment"] if "environment" in file.schema_arrow.names else [])]
    for batch in file.iter_batches(batch_size=TRAJECTORY_BATCH, columns=columns):
        for i in range(batch.num_rows):
            yield _LazyTrajectory(batch, i)


class _LazyTrajectory(dict):
    """A trajectory row converted to Python only when a pending turn needs it (most rows may not)."""

    def __init__(self, batch: pa.RecordBatch, index: int):
        super().__init__()
        self._batch, self._index = batch, index

    def __missing__(self, key):
        row = self._batch.slice(self._index, 1).to_pylist()[0]
        self.update(messages=row["messages"] or [], tools=json.loads(row["tools"] or "[]"),
                    environment=row.get("environment"))
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
                    chunk_rows: int = SCORE_CHUNK, shard: int | None = None,
                    k: int | None = None) -> Iterator[list[tuple[dict, TurnContext]]]:
    """Batches of (rollout row, its turn's context), each of whole turns and about chunk_rows rows."""
    pending = con.execute(pending_turns_sql(wh, shard, k), params).fetch_arrow_table()  # small: no text but the action
    if pending.num_rows == 0:
        return
    con.register("pending", pending.select(["turn_id", "trajectory_row", "message_index"]))
    rollouts = _rows(con.execute(
        f"""select r.turn_id, r.sample_index, r.completion from ({unscored_rollouts_sql(wh, shard, k)}) r join pending p using (turn_id)
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
    shard: int | None = None, k: int | None = None,
) -> dict:
    """Score every current rollout (sample_index < k) of the wanted turns not yet scored under this verifier.

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
    for batch in scoring_batches(wh, con, params, shard=shard, k=k):
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
# The population variance, exact where it can be: from the counts when every reward is 0 or 1 (n(k-n)/k^2, so 3 of
# 6 is 0.25, where var_pop gives 0.25000000000000006), 0 when all rewards are equal, else var_pop capped by its
# proven bound mean(1-mean) <= 0.25 for values in [0, 1] (Bhatia-Davis): the excess is rounding only.
REWARD_VAR_SQL = """(case when count(distinct s.reward) = 1 then 0.0
          when bool_and(s.reward in (0.0, 1.0))
          then (count(*) filter (where s.reward = 1.0) * count(*) filter (where s.reward = 0.0))::double
               / (count(*) * count(*))
          else least(var_pop(s.reward), avg(s.reward) * (1 - avg(s.reward)), 0.25) end)"""


def pass_threshold_sql(pass_thresholds: dict[str | None, float] | None, domain: str) -> str:
    """The pass threshold of the `domain` column's verifier (DomainVerifiers.pass_thresholds; None: 1.0)."""
    thresholds = pass_thresholds or {None: 1.0}
    listed = " ".join(f"when {_sql_text(d)} then {float(t)!r}" for d, t in thresholds.items() if d is not None)
    default = f"{float(thresholds.get(None, 1.0))!r}"
    return f"(case {domain} {listed} else {default} end)::double" if listed else f"{default}::double"


def _sql_text(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def profiles_sql(wh: Warehouse, shard: int | None = None, k: int | None = None, round_size: int = 2,
                 pass_thresholds: dict[str | None, float] | None = None) -> str:
    """One row per turn under (policy_fp, sampling_fp, verifier_fp) from its samples below k; population variance
    (ddof=0), so for binary rewards reward_var = mean * (1 - mean). n_pass counts the samples that pass
    (verifiers.base.passes: reward above 0 and at least the domain verifier's pass_threshold, recorded per row).
    Also the expert action's likelihood, and the columns the adaptive rule reads (adaptive.RULE_COLUMNS: dropped
    from turn_profiles)."""
    threshold = pass_threshold_sql(pass_thresholds, "u.domain")
    rewards = read_sql(wh, 'rollout_rewards', shard) if wh.part_files('rollout_rewards', shard) else 'no_rewards'
    likelihoods = (read_sql(wh, 'expert_likelihoods', shard) if wh.part_files('expert_likelihoods', shard)
                   else 'no_likelihoods')
    first = f"s.sample_index < {int(round_size)}"
    return f"""
        select s.turn_id, u.trajectory_id, u.domain, s.policy_fp, s.sampling_fp, s.verifier_fp,
               count(*)::int as k,
               avg(s.reward) as reward_mean,
               {REWARD_VAR_SQL} as reward_var,
               sqrt({REWARD_VAR_SQL}) as reward_std,
               count(*) filter (where s.reward > 0 and s.reward >= {threshold})::int as n_pass,
               {threshold} as pass_threshold,
               count(distinct coalesce(s.action, '<unparsed>'))::int as n_distinct_actions,
               l.expert_logprob, l.expert_tokens,
               sum(s.reward) as reward_sum,
               count(distinct s.reward)::int as n_reward_values,
               bool_and(s.reward in (0.0, 1.0)) as binary_rewards,
               count(*) filter (where {first} and s.reward >= 1.0)::int as first_round_pass,
               count(*) filter (where {first})::int as first_round_n
        from {rewards} s
        join wanted using (turn_id)
        join read_parquet('{wh.table_path('turns')}') u using (turn_id)
        left join (select turn_id, min(expert_logprob) as expert_logprob, min(expert_tokens) as expert_tokens
                   from {likelihoods} where policy_fp = $policy_fp and sampling_fp = $sampling_fp
                   group by turn_id) l using (turn_id)
        where s.policy_fp = $policy_fp and s.sampling_fp = $sampling_fp and s.verifier_fp = $verifier_fp
              {_below_k('s', k)}
        group by all
        order by s.turn_id
    """


def build_profiles(wh: Warehouse, policy_fp: str, sampling_fp: str, verifier_fp: str, turn_ids: Iterable[str],
                   shard: int | None = None, k: int | None = None, round_size: int = 2,
                   pass_thresholds: dict[str | None, float] | None = None) -> pa.Table:
    """The profile rows with the adaptive rule's columns (adaptive.annotate turns them into turn_profiles)."""
    con = wh.duck()
    _with_wanted(con, turn_ids)
    con.register("no_rewards", REWARDS_SCHEMA.empty_table())  # a shard with no rows yet has an empty profile
    con.register("no_likelihoods", EXPERT_LIKELIHOODS_SCHEMA.empty_table())
    table = con.execute(
        profiles_sql(wh, shard, k, round_size, pass_thresholds),
        {"policy_fp": policy_fp, "sampling_fp": sampling_fp, "verifier_fp": verifier_fp},
    ).fetch_arrow_table()
    con.close()
    return table


# -- the stage, as the three assets call it ----------------------------------------------------
SFT_MODEL = "sft"  # `policy.model: sft`: the warm-up model the sft_policy asset saved in the warehouse


def policy_model(policy: "PolicySection", wh: Warehouse) -> str:
    return str(wh.model_dir("sft_policy")) if policy.model == SFT_MODEL else policy.model


def policy_precision(policy: "PolicySection") -> Precision:
    """The dtype profiling samples in (a server decides its own: reported as such)."""
    if not capabilities(policy.backend).local_model:
        return Precision("server", policy.dtype, "server", "the server chooses its dtype")
    return hardware.policy_precision(policy)


def policy_version(policy: "PolicySection", seeding: str = PER_TURN, adaptive: "AdaptiveSection | None" = None,
                   adv_bounds: "adaptive_rule.AdvBounds | float" = LAMBDA_DIFF) -> str:
    """Code version of `rollouts`: the policy identity with the *resolved* dtype (bf16 and fp32 sample
    slightly different tokens, so moving to a CPU without bf16 must regenerate), per-sample seeding (other draws
    than per-turn seeding) and adaptive stopping (which samples exist: turning it off or tightening it tops up)."""
    extra = {} if seeding == PER_TURN else {"seeding": seeding}
    section = values(policy, ROLLOUTS)
    if capabilities(policy.backend).local_model:
        from pivot_assets.policies.hub import pinned_id

        # a Hub id is versioned by the commit it resolves to here (a served model's name is the server's)
        section["model"] = pinned_id(section["model"])
    if section.get("max_prompt_tokens") is None:
        section.pop("max_prompt_tokens", None)  # the default guard keeps the versions of warehouses before it
    return fingerprint({**section, "dtype": policy_precision(policy).dtype, **extra,
                        **adaptive_identity(adaptive, adaptive_rule.as_bounds(adv_bounds).identity())})


PROFILES_VERSION = "2"  # 2: k per turn (samples below policy.k), stop_reason, p_flip, the expert's likelihood


def profiles_version(cfg: "PivotConfig") -> str:
    """Code version of `turn_profiles`: which samples a profile takes (k) and the rule that says why it stopped."""
    return fingerprint({"version": PROFILES_VERSION, "k": cfg.policy.k,
                        **adaptive_identity(cfg.profiling.adaptive, adaptive_rule.rule_bounds(cfg).identity())})


def sampling_fingerprint(sampling, seeding: str = PER_TURN) -> str:
    """The rows' sampling_fp. per_turn: the sampling config's (k included: a turn's K samples share a generator).
    per_sample: every field but k, and the seeding: sample i is the same draw whatever k, so a larger k extends
    the same rows."""
    if seeding == PER_TURN:
        return sampling.fingerprint
    fields = {**asdict(sampling), "seeding": seeding}
    del fields["k"]
    return fingerprint(fields)


def sample_seed(seed: int, sample_index: int) -> int:
    """The seed of sample i of every turn under per-sample seeding (the backend then seeds by (this, turn_id))."""
    from pivot_assets.core.ids import seeded_int

    return seeded_int(seed, f"sample:{sample_index}")


def turn_chunks(rows: list[dict], size: int) -> Iterator[list[dict]]:
    """The rows in chunks of whole turns (about `size` rows each, at least one turn), turns in first-seen order."""
    by_turn: dict[str, list[dict]] = {}
    for r in rows:
        by_turn.setdefault(r["turn_id"], []).append(r)
    chunk: list[dict] = []
    for turn_rows in by_turn.values():
        if chunk and len(chunk) + len(turn_rows) > size:
            yield chunk
            chunk = []
        chunk += turn_rows
    if chunk:
        yield chunk


class Profiler:
    """rollouts -> rollout_rewards -> turn_profiles for one configured policy and verifier set.

    The fingerprints and the turns to profile are computed once per instance; the Dagster assets each
    make one call: generate(), score(), profile().
    """

    # False for a profiler of a subset of the pool under another policy (a refresh round): skipped_turns lists the
    # pool's prompt-guard skips, which such a run must not replace with its own subset's
    records_skipped = True

    def __init__(self, wh: Warehouse, policy: "PolicySection", verifiers, threads: int | str = "auto",
                 shard: int | None = None, shards: int = 1, seeding: str = PER_TURN,
                 adaptive: "AdaptiveSection | None" = None, lambda_diff: float = LAMBDA_DIFF,
                 split: ConversationSplit | None = None, adv_bounds: "adaptive_rule.AdvBounds | None" = None):
        from pivot_assets.core.config import AdaptiveSection

        self.wh, self.policy, self.verifiers, self.threads, self.split = wh, policy, verifiers, threads, split
        self.precision = policy_precision(policy)
        self.shard, self.shards, self.seeding = shard, shards, seeding
        self.adaptive = adaptive or AdaptiveSection()
        self.adv_bounds = adv_bounds or adaptive_rule.AdvBounds.pivotrl(lambda_diff)  # what adaptive stopping settles on
        if (shard is None) != (shards == 1):
            raise ValueError(f"a Profiler works on one shard of {shards}, or unsharded (shard None, shards 1)")
        if self.adaptive.enabled and seeding != PER_SAMPLE:
            raise ValueError("adaptive profiling needs per-sample seeding (profiling.seeding: per_sample)")
        self.prior: adaptive_rule.Prior | None = None  # the posterior rule's prior, once profile() fitted it

    @classmethod
    def for_config(cls, cfg: "PivotConfig", verifiers=None, shard: int | None = None,
                   wh: Warehouse | None = None) -> "Profiler":
        """The Profiler of one shard (or of the whole table when scale.shards is 1) under this config; the
        pipeline passes its resolved warehouse and profiling verifiers, a Ray job resolves its own."""
        if verifiers is None and cfg.profiling.adaptive.enabled:  # adaptive generation scores between rounds
            from pivot_assets.verifiers import VerifierSets

            verifiers = VerifierSets.from_config(cfg).profiling
        return cls(wh or Warehouse(cfg.warehouse_dir), cfg.policy, verifiers, cfg.runtime.threads, shard=shard,
                   shards=cfg.scale.shards, seeding=cfg.profiling.seeding, adaptive=cfg.profiling.adaptive,
                   adv_bounds=adaptive_rule.rule_bounds(cfg), split=ConversationSplit.from_config(cfg))

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

        if not self.engine.local_model:  # the server renders with its own template; thinking is sent to it
            thinking = "" if self.policy.thinking == "keep" else f"|think:{self.policy.thinking}"
            return f"openai|{self.policy.base_url}|{self.policy.model}{thinking}"
        model = policy_model(self.policy, self.wh)
        fmt = PromptFormat.from_policy(self.policy)  # the template and thinking mode change the samples
        return f"{policy_fingerprint(model, fmt)}|{self.policy.backend}:{self.precision.dtype}"

    @cached_property
    def engine(self):
        """What the configured engine can do (policies/base.EngineCapabilities)."""
        return capabilities(self.policy.backend)

    @cached_property
    def wanted_turns(self) -> list[str]:
        """The wanted turns (all outside the warm-up split, or the first limit_turns of them), then those of this
        shard: the shards of a limit_turns config together profile exactly the turns one unsharded run would."""
        turns = select_turns(self.wh, self.policy.limit_turns, self.split)
        return turns if self.shard is None else shard_turns(self.wh, turns, self.shard, self.shards)

    @cached_property
    def turns(self) -> list[str]:
        """The wanted turns less those the prompt guard skipped (skipped_turns, written by guard_prompts)."""
        skipped = set()
        if self.wh.exists(prompt_guard.SKIPPED_TURNS):
            skipped = set(self.wh.read_arrow(prompt_guard.SKIPPED_TURNS, ["turn_id"]).column("turn_id").to_pylist())
        return [t for t in self.wanted_turns if t not in skipped]

    def guard_prompts(self, log: Callable[[str], None] | None = None) -> list[dict]:
        """Record the wanted turns whose prompt does not fit the model's context (prompt_guard.py) in skipped_turns
        and leave them out of this profiler's turns. A turn with samples under this policy and sampling passed the
        same guard before (the limit is in their identity): only the others are rendered again."""
        from pivot_assets.policies.models import PromptFormat, load_tokenizer

        model = policy_model(self.policy, self.wh)
        limit = prompt_guard.prompt_limit(self.policy, model)
        rows = []
        sampled = done_turns(self.wh, self.policy_fp, self.sampling_fp, self.shard) if limit is not None else set()
        unchecked = [t for t in self.wanted_turns if t not in sampled]
        if limit is not None and unchecked:
            tokenizer = load_tokenizer(model, PromptFormat.from_policy(self.policy))
            rows = prompt_guard.too_long(generation_requests(self.wh, unchecked), tokenizer, limit)
        if self.records_skipped:
            prompt_guard.write_skipped(self.wh, rows, self.shard)
        skipped = {r["turn_id"] for r in rows}
        self.turns = [t for t in self.wanted_turns if t not in skipped]
        if rows and log:
            log(prompt_guard.skipped_line(rows, limit))
        return rows

    @cached_property
    def round_size(self) -> int:
        return min(self.adaptive.round_size, self.sampling.k)

    def build_backend(self):
        from pivot_assets.core.hardware import configure_torch
        from pivot_assets.policies.factory import build_backend

        if self.engine.torch_in_process:
            configure_torch(self.threads)
        return build_backend(self.policy, model=policy_model(self.policy, self.wh), threads=self.threads,
                             keep_prompts=self.adaptive.enabled)

    def generate(self, log: Callable[[str], None] | None = None) -> dict:
        """Every wanted turn's samples not yet generated: K per turn, or with adaptive profiling the rounds until
        each turn is settled (scored between rounds)."""
        self.wh.clean_temp_files("rollouts", self.shard)
        self.wh.clean_temp_files("expert_likelihoods", self.shard)
        self.check_parts(log, checksum=True)
        check_layout(self.wh, self.shards)
        skipped = self.guard_prompts(log)
        stats: dict = {"turns_profiled": len(self.turns), "turns_prompt_too_long": len(skipped),
                       "samples_per_turn": self.sampling.k,
                       "policy_fp": self.policy_fp, "sampling_fp": self.sampling_fp, "seeding": self.seeding,
                       **self.precision.as_metadata(), **self.policy.engine_choice.as_metadata()}
        if log:
            log(f"engine: {self.policy.backend} ({self.policy.engine_choice.reason})")
        backend = _Lazy(self.build_backend)
        try:
            if self.seeding == PER_TURN:
                stats.update(self._generate_per_turn(backend, log))
            elif self.adaptive.enabled:
                stats.update(self._generate_adaptive(backend, log))
            else:
                stats.update(self._generate_exhaustive(backend, log))
        finally:  # an engine in its own processes (vLLM) stops here, not at exit (where it would hang the exit)
            if backend.built:
                getattr(backend(), "close", lambda: None)()
        if backend.built:
            stats.update({k: v for k, v in backend().stats.items() if isinstance(v, (int, float))})
        return stats

    def _generate_per_turn(self, backend: "_Lazy", log) -> dict:
        done = done_turns(self.wh, self.policy_fp, self.sampling.fingerprint, self.shard)
        pending = [t for t in self.turns if t not in done]
        if log:
            log(f"{len(self.turns)} turns wanted, {len(self.turns) - len(pending)} cached, {len(pending)} to generate"
                f" ({self.policy.backend}, {self.precision.dtype}: {self.precision.reason})")
        stats: dict = {"turns_generated": len(pending), "cache_hits_turns": len(self.turns) - len(pending)}
        if pending:
            progress = Progress(total=len(pending) * self.sampling.k, log=log)
            stats.update(generate_rollouts(self.wh, backend(), self.policy_fp, self.sampling,
                                           generation_requests(self.wh, pending, experts=pending), progress,
                                           shard=self.shard))
        return stats

    def _generate_exhaustive(self, backend: "_Lazy", log) -> dict:
        pending = self.pending_by_turn()
        n_rows = sum(map(len, pending.values()))
        if log:
            log(f"{len(self.turns)} turns wanted, {len(self.turns) - len(pending)} complete, {n_rows} samples of "
                f"{len(pending)} turns to generate ({self.policy.backend}, {self.precision.dtype}: "
                f"{self.precision.reason})")
        stats: dict = {"turns_generated": len(pending), "cache_hits_turns": len(self.turns) - len(pending)}
        if n_rows:
            # a served engine's parts are cut from the turns' indices as its requests stream (no row per sample
            # held); an engine in this process takes the rows in its order
            rows = pending if not self.engine.local_model else self.rows_in_engine_order(pending)
            stats.update(self.generate_rows(backend(), rows, Progress(total=n_rows, log=log)))
        return stats

    def _generate_adaptive(self, backend: "_Lazy", log) -> dict:
        progress = Progress(total=len(self.turns) * self.sampling.k, log=log)  # at most: every turn sampled to k
        if self.adaptive.scheduler == "stream":
            return self.adaptive_stream(backend, progress, log)
        return self.adaptive_rounds(lambda rows: self.generate_rows(backend(), rows, progress), log)

    def adaptive_stream(self, backend: "_Lazy", progress: Progress, log) -> dict:
        """adaptive.run_stream on this process's engine (one that streams single requests: vLLM): wave_samples
        requests in flight, each turn's complete chunks written, scored and decided as they come in. The expert
        actions' likelihoods (the prior's feature) are scored first: the engine runs one kind of call at a time."""
        if not self.engine.streams_requests:
            raise ValueError(f"profiling.adaptive.scheduler stream: policy.backend {self.policy.backend} cannot add "
                             "and cancel single requests; use scheduler: waves")
        if self.verifiers is None:
            raise ValueError("adaptive profiling scores as it samples: the Profiler needs the verifiers")
        order = turn_order(self.wh, self.turns)
        self.score_expert_actions(backend, order)
        requests = {q.turn_id: q for q in generation_requests(self.wh, order)}
        stored = done_samples(self.wh, self.policy_fp, self.sampling_fp, self.shard)
        generated: set[str] = set()

        def open_stream():
            return backend().stream(requests, self.sampling, lambda i: sample_seed(self.sampling.seed, i))

        def write(samples: list) -> dict:
            # a turn whose stored samples are not 0..n-1 (a part set aside) would be asked an index it has
            new = [s for s in samples if (s.turn_id, s.sample_index) not in stored]
            if len(new) < len(samples):
                (log or _log.warning)(f"adaptive stream: {len(samples) - len(new)} samples already stored, not "
                                      "written again")
            generated.update(s.turn_id for s in new)
            out = self.write_samples(new, requests) if new else {"rows": 0, "tokens": 0}
            progress.update(out["rows"])
            return out

        stats = adaptive_rule.run_stream(order, self.counts, open_stream, write,
                                         lambda turns: self.score(log=None, turn_ids=turns), self.adaptive,
                                         self.sampling.k, self.adv_bounds, self.adaptive.wave_samples, log)
        stats["turns_generated"] = len(generated)
        stats["cache_hits_turns"] = len(self.turns) - len(generated)
        return stats

    def score_expert_actions(self, backend: "_Lazy", order: list[str]) -> None:
        """The expert action's likelihood of every turn without one stored (a backend that teacher-forces), in
        parts of policy.batch_size turns; the engine starts only if one is missing."""
        if not self.engine.scores_continuation:
            return
        stored = done_likelihoods(self.wh, self.policy_fp, self.sampling_fp, self.shard)
        missing = [t for t in order if t not in stored]
        for start in range(0, len(missing), self.policy.batch_size):
            turns = missing[start:start + self.policy.batch_size]
            likelihoods = backend().score_experts(generation_requests(self.wh, turns, experts=turns), self.sampling)
            key = part_key(self.policy_fp, self.sampling_fp, rows=(f"expert:{t}" for t in turns))
            write_likelihoods(self.wh, likelihoods, self.policy_fp, self.sampling_fp, self.shard, key)

    def adaptive_rounds(self, generate_rows: Callable[[list[dict]], dict], log) -> dict:
        """adaptive.run_rounds or run_waves (profiling.adaptive.scheduler): the samples each open turn lacks up to
        its next round (given to `generate_rows`: this process's engine, or the Ray job's actors, alive throughout),
        then scoring. The prior is fitted on this profiler's turns (a shard's, when sharded) from their first rounds."""
        order = turn_order(self.wh, self.turns)
        generated: set[str] = set()

        def generate(todo: dict[str, range]) -> dict:
            done = done_samples(self.wh, self.policy_fp, self.sampling_fp, self.shard)
            rows = [{"turn_id": t, "sample_index": i} for t in order if t in todo for i in todo[t] if (t, i) not in done]
            generated.update(r["turn_id"] for r in rows)
            return generate_rows(rows) if rows else {}

        def score(turns: list[str]) -> dict:
            return self.score(log=None, turn_ids=turns)

        if self.verifiers is None:
            raise ValueError("adaptive profiling scores between rounds: the Profiler needs the verifiers")
        if self.adaptive.scheduler == "stream":  # config validation keeps it off Ray; this is the other caller
            raise ValueError("profiling.adaptive.scheduler stream needs the engine in this process (adaptive_stream)")
        run = adaptive_rule.run_waves if self.adaptive.scheduler == "waves" else adaptive_rule.run_rounds
        stats = run(order, self.counts, generate, score, self.adaptive, self.sampling.k, self.adv_bounds, log)
        stats["turns_generated"] = len(generated)
        stats["cache_hits_turns"] = len(self.turns) - len(generated)
        return stats

    def generate_rows(self, backend, rows: list[dict] | dict[str, list[int]], progress: Progress | None = None) -> dict:
        """generate_samples over the rows (or, for a served engine, each turn's sample indices) in parts of whole
        turns (about part_rows each), so a kill loses at most the parts in flight. A served engine's requests are
        read in one stream, and its next part is requested while this one is written (one writer thread, parts
        written in order)."""
        n_rows = n_tokens = 0
        t0 = time.perf_counter()
        served = not self.engine.local_model
        parts_in = self.served_parts(rows) if served else (
            (chunk, None) for chunk in turn_chunks(rows, self.part_rows))
        with ThreadPoolExecutor(max_workers=1) as writer:
            written = None
            for chunk, requests in parts_in:
                samples, requests, likelihoods = self.sample_rows(backend, chunk, requests)
                if written is not None:
                    n_rows, n_tokens = self._written(written.result(), n_rows, n_tokens, progress)
                written = writer.submit(self.write_samples, samples, requests, likelihoods)
                if not served:
                    n_rows, n_tokens = self._written(written.result(), n_rows, n_tokens, progress)
                    written = None
            if written is not None:
                n_rows, n_tokens = self._written(written.result(), n_rows, n_tokens, progress)
        wall = time.perf_counter() - t0
        return {"rollouts_generated": n_rows, "generated_tokens": n_tokens, "generation_s": round(wall, 2),
                "tokens_per_s": round(n_tokens / wall, 1) if wall > 0 else 0.0}

    def check_parts(self, log: Callable[[str], None] | None = None, checksum: bool = False) -> list:
        """Before a stage reads them: the input tables are intact (else one line naming the file and the fix), and
        every damaged part of the regenerable tables is set aside (core/parts.py), so this run regenerates its rows."""
        for table, fix in INPUT_TABLES_FIX.items():
            parts.require_intact(self.wh, table, fix)
        damaged = parts.repair(self.wh, checksum=checksum, shard=self.shard)
        for problem in damaged:
            message = f"set aside {problem.line()} (kept under {parts.DAMAGED_DIR}/); its rows are regenerated"
            (log or _log.warning)(message)
        return damaged

    def score(self, log: Callable[[str], None] | None = None, turn_ids: Iterable[str] | None = None) -> dict:
        """Score every current rollout of the wanted turns (or of `turn_ids`) not yet scored under this verifier set."""
        self.wh.clean_temp_files("rollout_rewards", self.shard)
        if turn_ids is None:  # a stage's own call (adaptive rounds score within `rollouts`, which checked)
            self.check_parts(log)
        stats = score_rollouts(self.wh, self.verifiers, self.policy_fp, self.sampling_fp,
                               self.turns if turn_ids is None else turn_ids, progress_log=log, shard=self.shard,
                               k=self.sampling.k)
        return {"verifier_fp": self.verifiers.fingerprint, **stats}

    def counts(self) -> pa.Table:
        """The profile rows with the adaptive rule's columns (adaptive.RULE_COLUMNS)."""
        return build_profiles(self.wh, self.policy_fp, self.sampling_fp, self.verifiers.fingerprint, self.turns,
                              shard=self.shard, k=self.sampling.k, round_size=self.round_size,
                              pass_thresholds=self.verifiers.pass_thresholds)

    def profile(self) -> pa.Table:
        """One row per wanted turn under (policy_fp, sampling_fp, verifier_fp): its samples below k, why its
        sampling stopped (stop_reason, p_flip) and its expert action's likelihood."""
        self.check_parts()
        table, self.prior = adaptive_rule.annotate(self.counts(), self.adaptive, self.sampling.k, self.adv_bounds)
        return table

    def write_profiles(self, table: pa.Table) -> None:
        """The whole table unsharded; one part per shard (always the same name: a rerun replaces it)."""
        if self.shard is None:
            self.wh.write_table("turn_profiles", table)
        else:
            self.wh.append_part("turn_profiles", table, shard=self.shard, key="profiles")

    # -- per-sample generation (the local engine's rows and the Ray engine's; ray_job.py feeds them through Ray Data)
    def pending_samples(self) -> list[dict]:
        """(turn_id, sample_index) rows of this shard not yet generated, in the engine's order (rows_in_engine_order)."""
        return self.rows_in_engine_order(self.pending_by_turn())

    def rows_in_engine_order(self, pending: dict[str, list[int]]) -> list[dict]:
        """The pending indices as (turn_id, sample_index) rows, the turns in generation order, so a batch holds
        consecutive turns of a trajectory (prefix reuse). The transformers backend decodes a turn's K rows together
        (one prefill): turn-major. Others take one sample seed per call: sample-major."""
        if self.engine.turn_rows_together:
            return [{"turn_id": t, "sample_index": i} for t, indices in pending.items() for i in indices]
        return [{"turn_id": t, "sample_index": i} for i in range(self.sampling.k)
                for t, indices in pending.items() if i in indices]

    def pending_by_turn(self) -> dict[str, list[int]]:
        """The sample indices below k each turn of this shard lacks, its turns in generation order (those with
        none left out): what is done is read per turn in DuckDB, so memory follows the turns, not the samples."""
        check_layout(self.wh, self.shards)
        self.wh.clean_temp_files("rollouts", self.shard)
        k = self.sampling.k
        con = self.wh.duck()
        _with_wanted(con, self.turns)
        con.register("no_rollouts", ROLLOUTS_SCHEMA.empty_table())  # nothing generated yet
        stored = read_sql(self.wh, "rollouts", self.shard) if self.wh.part_files("rollouts", self.shard) else "no_rollouts"
        reader = con.execute(
            f"""select p.turn_id, d.indices from ({turn_positions_sql(self.wh)}) p
                left join (select turn_id, list(distinct sample_index) as indices from {stored}
                           where policy_fp = $policy and sampling_fp = $sampling and sample_index < {int(k)}
                           group by turn_id) d using (turn_id)
                where coalesce(len(d.indices), 0) < {int(k)} order by p.trajectory_row, p.message_index""",
            {"policy": self.policy_fp, "sampling": self.sampling_fp}).fetch_record_batch(65_536)
        pending: dict[str, list[int]] = {}
        try:
            for batch in reader:
                for turn_id, indices in zip(batch.column("turn_id").to_pylist(), batch.column("indices").to_pylist()):
                    have = set(indices or ())
                    pending[turn_id] = [i for i in range(k) if i not in have]
        finally:
            con.close()
        return pending

    def generate_samples(self, backend, rows: list[dict]) -> dict:
        """Generate one sample per (turn_id, sample_index) row, each seeded by (sample_seed(seed, i), turn_id);
        write them as ONE part named by its rows, so a retried batch overwrites its own part. The turns without a
        stored expert likelihood get it too (a backend that teacher-forces), in a part of the same name."""
        t0 = time.perf_counter()
        samples, requests, likelihoods = self.sample_rows(backend, rows)
        return {**self.write_samples(samples, requests, likelihoods), "seconds": time.perf_counter() - t0}

    def sample_rows(self, backend, rows: list[dict], requests: dict | None = None) -> tuple[list, dict, list]:
        """The samples of the rows, their turns' requests (read here unless given) and the expert likelihoods that
        came with them."""
        if requests is None:
            turns = {r["turn_id"] for r in rows}
            experts = (turns - done_likelihoods(self.wh, self.policy_fp, self.sampling_fp, self.shard)
                       if self.engine.scores_continuation else set())
            requests = {q.turn_id: q for q in generation_requests(self.wh, turns, experts)}
        samples, likelihoods = (self._samples_per_row(backend, rows, requests)
                                if self.engine.per_row_seeds
                                else self._samples_per_index(backend, rows, requests))
        return samples, requests, likelihoods

    def served_parts(self, rows: list[dict] | dict[str, list[int]]) -> Iterator[tuple[list[dict], dict]]:
        """The rows (or each turn's sample indices) in parts of whole turns (about part_rows each) with their turns'
        requests, the requests read in one stream in trajectory order (a query per part would read the trajectories
        once per part); a part's rows are built as it is cut. A served engine teacher-forces nothing: no expert
        messages."""
        by_turn: dict[str, list[int]] = dict(rows) if isinstance(rows, dict) else {}  # popped as turns are cut
        if not isinstance(rows, dict):
            for r in rows:
                by_turn.setdefault(r["turn_id"], []).append(int(r["sample_index"]))
        chunk: list[dict] = []
        requests: dict = {}
        for request in generation_request_stream(self.wh, list(by_turn)):
            chunk += [{"turn_id": request.turn_id, "sample_index": i} for i in by_turn.pop(request.turn_id)]
            requests[request.turn_id] = request
            if len(chunk) >= self.part_rows:
                yield chunk, requests
                chunk, requests = [], {}
        if chunk:
            yield chunk, requests
        if by_turn:
            raise ValueError(f"{len(by_turn)} turns to sample have no row in turns/trajectories, e.g. "
                             f"{next(iter(by_turn))}: pivot run --select turns")

    @cached_property
    def part_rows(self) -> int:
        """Rows per rollouts part: policy.batch_size, and for a served engine at least SERVED_PART_ROWS (its batch
        is the `concurrency` requests in flight, not the part; small parts cost a query and a file each)."""
        return self.policy.batch_size if self.engine.local_model else max(self.policy.batch_size, SERVED_PART_ROWS)

    @staticmethod
    def _written(out: dict, n_rows: int, n_tokens: int, progress: Progress | None) -> tuple[int, int]:
        if progress:
            progress.update(out["rows"])
        return n_rows + out["rows"], n_tokens + out["tokens"]

    def write_samples(self, samples: list, requests: dict, likelihoods: list = ()) -> dict:
        """The samples as ONE rollouts part named by its rows (a retried batch overwrites its own part), and the
        likelihoods that came with them in an expert_likelihoods part of the same name."""
        turn_ids = [s.turn_id for s in samples]
        part = pa.table({  # column by column: no dict per row
            "turn_id": turn_ids, "trajectory_id": [requests[t].trajectory_id for t in turn_ids],
            "policy_fp": [self.policy_fp] * len(samples), "sampling_fp": [self.sampling_fp] * len(samples),
            "sample_index": [s.sample_index for s in samples], "completion": [s.completion for s in samples],
            "n_prompt_tokens": [s.n_prompt_tokens for s in samples],
            "n_completion_tokens": [s.n_completion_tokens for s in samples],
            "finish_reason": [s.finish_reason for s in samples]}, schema=ROLLOUTS_SCHEMA)
        key = part_key(self.policy_fp, self.sampling_fp, rows=(f"{s.turn_id}:{s.sample_index}" for s in samples))
        write_likelihoods(self.wh, likelihoods, self.policy_fp, self.sampling_fp, self.shard, key)
        self.wh.append_part("rollouts", part, shard=self.shard, key=key)
        return {"rows": len(samples), "tokens": sum(s.n_completion_tokens for s in samples)}

    def _samples_per_index(self, backend, rows: list[dict], requests: dict) -> tuple[list, list]:
        """One backend call per sample index i (K=1 under sample_seed(seed, i)), the turns of that index batched;
        the expert actions ride along with the first call only."""
        from dataclasses import replace

        from pivot_assets.policies.base import likelihoods_of

        by_index: dict[int, list[str]] = {}
        for r in rows:
            by_index.setdefault(int(r["sample_index"]), []).append(str(r["turn_id"]))
        samples, likelihoods = [], []
        for call, (i, turn_ids) in enumerate(sorted(by_index.items())):
            one = replace(self.sampling, k=1, seed=sample_seed(self.sampling.seed, i))
            batch_requests = [requests[t] if call == 0 else replace(requests[t], expert=None) for t in turn_ids]
            for batch in backend.generate(batch_requests, one):
                samples += [replace(s, sample_index=i) for s in batch]
                likelihoods += likelihoods_of(batch)
        return samples, likelihoods

    def _samples_per_row(self, backend, rows: list[dict], requests: dict) -> tuple[list, list]:
        """One backend call: a turn's rows share its prefill and decode loop, each row drawing from its own
        generator seeded as _samples_per_index seeds it (the same draws, one prefill instead of K)."""
        from pivot_assets.policies.base import likelihoods_of

        plan: dict[str, list[tuple[int, int]]] = {}
        for r in rows:
            i = int(r["sample_index"])
            plan.setdefault(str(r["turn_id"]), []).append((i, sample_seed(self.sampling.seed, i)))
        samples, likelihoods = [], []
        for batch in backend.generate([requests[t] for t in plan], self.sampling, rows=plan):
            samples += batch
            likelihoods += likelihoods_of(batch)
        return samples, likelihoods


class _Lazy:
    """A value built on first use (the policy backend: a run with nothing to generate never loads the model)."""

    def __init__(self, build: Callable):
        self._build, self._value, self.built = build, None, False

    def __call__(self):
        if not self.built:
            self._value, self.built = self._build(), True
        return self._value
