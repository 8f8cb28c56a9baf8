"""What the docs state that the code or a results file knows, written into the pages by cog (`make docs`).

Each function returns one generated fact as Markdown; a page calls it inside a `[[[cog ... ]]]` block and
`make docs-check` (cog --check) fails when a block no longer matches what its function returns. Paths are taken
relative to this file, so a copy of the repository generates from its own pivot.yaml and results files.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# -- results files --------------------------------------------------------------------------------------------------

@cache
def results(name: str) -> dict:
    """bench/results/<name>.json: the figures a benchmark measured, each as its RESULTS file writes it."""
    return json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())


def figure(name: str, key: str):
    """One figure of a results summary, as its RESULTS file writes it."""
    return results(name)["figures"][key]


def link(name: str, prefix: str = "") -> str:
    path = results(name)["results_file"]
    return f"[`{Path(path).name}`]({prefix}{path})"


def _per_seed_range(name: str) -> str:
    values = sorted(float(part.split()[1]) for part in figure(name, "per_seed").split(", "))
    return f"{values[0]:+.3f} to {values[-1]:+.3f}"


def _share_range(name: str, arm: str) -> str:
    values = sorted(results(name)["figures"][f"useful_share_{arm}"])
    return f"{values[0]}-{values[-1]}"


def readme_results_table() -> str:
    """README's results: at most five rows, one line each, every figure from bench/results/."""
    d, v, r, g, a = "decisive_bfcl", "verifiers", "rescore", "grpo_rollout", "adaptive_stream"
    rows = [
        ("GRPO on D_adv against D_cand at equal steps (BFCL single-turn, 3 seeds)",
         f"adv - cand **{figure(d, 'adv_minus_cand')}** on {figure(d, 'held_out_items')} held-out items; "
         f"reference {figure(d, 'reference')}, D_adv {figure(d, 'grpo_adv')}, D_cand {figure(d, 'grpo_cand')}", d),
        ("`tool_call` / `executed_state` against BFCL's and tau2-bench's checkers",
         f"BFCL {figure(v, 'bfcl_agreement')} over {figure(v, 'bfcl_cases')} cases, no false accept; multi-turn "
         f"{figure(v, 'multi_turn_agreement')}; tau2 {figure(v, 'tau2_agreement')}", v),
        ("A verifier change on BFCL multi-turn rollouts",
         f"0 turns regenerated; re-scored in {figure(r, 'rescore_s')} against {figure(r, 'generate_s')} to generate", r),
        ("A GRPO step on a 2-core CPU (one BFCL prompt, 4 completions)",
         f"{figure(g, 'trl_step_s')} s with TRL as it comes, {figure(g, 'vllm_shared_step_s')} s "
         f"({figure(g, 'speedup')}) with the vLLM engine and the prompt run once", g),
        ("Adaptive profiling against exhaustive K=8, equal or better F1",
         f"transformers {figure(a, 'transformers_waves')}x (waves) / {figure(a, 'transformers_rounds')}x (rounds); "
         f"vLLM {figure(a, 'vllm_range')}", a),
    ]
    lines = ["| what | result | file |", "|---|---|---|"]
    lines += [f"| {what} | {result} | {link(name)} |" for what, result, name in rows]
    return "\n".join(lines)


def tau2_peer(prefix: str = "") -> str:
    """`executed_state` against tau2-bench's own database comparison, and its speed (bench/results/verifiers.json)."""
    f = results("verifiers")["figures"]
    return (f"**{f['tau2_agreement']} agreement on {f['tau2_cases']} cases of the first {f['tau2_tasks']} tasks per "
            f"domain ({f['tau2_airline_cases']} airline, {f['tau2_retail_cases']} retail), no false accept**; "
            f"`tool_call` {f['tau2_tool_call_airline']} / {f['tau2_tool_call_retail']} (it rejects the steps that "
            f"read before or after they write). On one core `executed_state` scores {f['tau2_tracked_airline']} steps/s on "
            f"airline and {f['tau2_tracked_retail']} on retail, rows in order, the parse of the domain's `db.json` "
            f"counted; {f['tau2_shuffled_airline']} and {f['tau2_shuffled_retail']} with the rows shuffled, so that "
            f"neighbours share no earlier calls. With a whole database per world (tau2's own way, timed in the same "
            f"run): {f['tau2_whole_airline']} and {f['tau2_whole_retail']} ({link('verifiers', prefix)}).")


def demo_cost(prefix: str = "") -> str:
    """What `make demo` took, from bench/results/demo.json."""
    return (f"`make demo` took {figure('demo', 'make_demo_bf16')} with native bf16 and {figure('demo', 'make_demo_fp32')} "
            f"in fp32 on a 2-core CPU ({link('demo', prefix)})")


def demo_stages() -> str:
    """Where the demo's fp32 time goes, and what `make setup` adds."""
    f = results("demo")["figures"]
    return (f"In fp32: SFT warm-up {f['sft_policy_fp32_s']} s, rollouts {f['rollouts_fp32_s']} s, GRPO "
            f"{f['grpo_run_fp32_s']} s, evaluation {f['pivot_eval_fp32_s']} s; `make setup` on a fresh clone adds "
            f"{f['make_setup_s']} s with a warm pip cache.")


def decisive_summary(prefix: str = "") -> str:
    """The decisive comparison in one paragraph, from bench/results/decisive_bfcl.json."""
    d = "decisive_bfcl"
    return (f"GRPO on D_adv against GRPO on D_cand at equal GRPO steps ({figure(d, 'seeds')} seeds, "
            f"{figure(d, 'held_out_items')} held-out items x 4 samples, {figure(d, 'grpo_steps')} GRPO steps an arm and "
            f"seed, learning rate {figure(d, 'learning_rate')}; {link(d, prefix)}): both arms move off the reference "
            f"({figure(d, 'reference')} held-out accuracy): D_adv to {figure(d, 'grpo_adv')} "
            f"({figure(d, 'grpo_adv_delta')}), D_cand to {figure(d, 'grpo_cand')} ({figure(d, 'grpo_cand_delta')}), and "
            f"**adv - cand is {figure(d, 'adv_minus_cand')}**, positive in every seed ({_per_seed_range(d)}). "
            f"Useful share (GRPO groups with reward variance, all steps of all seeds): "
            f"grpo_adv {figure(d, 'useful_share_grpo_adv')}, grpo_cand {figure(d, 'useful_share_grpo_cand')}.")


def decisive_subsets() -> str:
    """The decisive run's adv - cand difference on the held-out D_mixed and D_adv items, and its interval's width."""
    d = "decisive_bfcl"
    return (f"On the held-out D_mixed items adv - cand is {figure(d, 'mixed_delta')}, on the "
            f"{figure(d, 'adv_set_items')} held-out D_adv items {figure(d, 'adv_set_delta')}. The interval's half-width "
            f"is {figure(d, 'measured_half_width')} where the design expected {figure(d, 'designed_half_width')}.")


def quick_ablation_summary(prefix: str = "") -> str:
    """The reduced ablation's headline and useful shares per arm (each seed), from its summary."""
    q = "ablation_bfcl_quick"
    return (f"The reduced run ({link(q, prefix)}: {figure(q, 'seeds')} seeds, {figure(q, 'held_out_items')} held-out "
            f"items, {figure(q, 'grpo_steps')} GRPO steps an arm): GRPO on D_adv {figure(q, 'grpo_adv_delta')} over the "
            f"reference, adv - cand {figure(q, 'adv_minus_cand')}. Useful share per seed: grpo_adv "
            f"{_share_range(q, 'grpo_adv')}, grpo_adv_exact {_share_range(q, 'grpo_adv_exact')}, grpo_cand "
            f"{_share_range(q, 'grpo_cand')}.")


def test_suite(prefix: str = "") -> str:
    """The test suite's measured runs, from bench/results/tests.json: `make test`'s set (`suite`), `make test-fast`'s
    (`fast`) and the run they are compared with (`before`), each where the file has it."""
    t, f = "tests", results("tests")["figures"]
    said = {"suite": "`make test`'s pytest", "fast": "`make test-fast`'s", "before": "the suite as it was (compared)"}
    runs = [f"{what} ran {f[f'{label}_tests']} in {f[f'{label}_wall']} (peak memory in use on the box "
            f"{f[f'{label}_peak_memory']})" for label, what in said.items() if f"{label}_wall" in f]
    return (f"On the {figure(t, 'machine')}: " + "; ".join(runs) + f" ({link(t, prefix)}: the time by kind of test, "
            "by worker and by module).")


def box_throughput(prefix: str = "") -> str:
    """What one box absorbs from an instant served engine, and what that is in GPUs (bench/results/throughput.json)."""
    t, f = "throughput", results("throughput")["figures"]
    before = (f" (a baseline checkout measured beside it: {f['rollouts_before']} and {f['chain_before']})"
              if "rollouts_before" in f else "")
    in_process = (f"; from an engine in the process (no HTTP), {f['in_process_samples_per_s']} samples/s"
                  if "in_process_samples_per_s" in f else "")
    return (f"On the {f['machine']}, from an OpenAI-compatible server that answers at once, at {f['samples']} samples "
            f"(k 8): the rollouts step absorbs {f['rollouts_samples_per_s']} samples/s and the whole chain, ingest to "
            f"pivot sets, runs at {f['chain_samples_per_s']} samples/s{before}{in_process}; no step's process tree "
            f"holds more than {f['peak_rss_mb']} MB. At {f['gpu_samples_per_s']} samples/s per GPU (an H100 with vLLM "
            f"on a 1-2B policy, ~60-token samples: an assumption, not measured here) one such box keeps "
            f"{f['gpus_fed']} GPUs fed ({link(t, prefix)}: per step, per size, and where the time goes).")


def ingest_streaming() -> str:
    """How ingest cuts its input (ingest/streaming.py) and the peak memory the throughput bench measured for it."""
    from pivot_assets.ingest.streaming import UNIT_BYTES, WORKERS_FROM_UNITS

    t = results("throughput")
    largest = max(t["runs"]["this tree"], key=lambda r: r["samples"])
    mib = f"{UNIT_BYTES >> 20} MiB"
    return (f"Ingestion streams: each input is cut into bounded units ({mib} of JSONL lines, Parquet row groups, HF row "
            f"ranges; a `.json` document is one unit; a compressed JSON Lines file is decompressed in the parent into "
            f"{mib} blocks of whole lines that travel with their unit, since a compressed stream cannot be cut by byte "
            f"offset) processed in one worker process per core from {(WORKERS_FROM_UNITS * UNIT_BYTES) >> 20} MiB of "
            f"input (below that, in the pipeline's process: a worker costs a second to start and a few hundred MB); "
            f"a unit takes about 20x its bytes while it is adapted. Ingest of {largest['trajectories']:,} sample "
            f"trajectories ({largest['turns']:,} turns) peaked at {largest['steps']['ingest']['peak_rss_mb']:,} MB for "
            f"the whole process tree on the {t['meta']['machine']} ({link('throughput')}).")


def served_parts() -> str:
    """How the rollouts step feeds a served engine (profiling/profiler.py)."""
    from pivot_assets.profiling.profiler import SERVED_PART_ROWS

    return (f"The rollouts step sends one request per sample (each sample has its own seed) from one asyncio loop over "
            f"kept-alive connections, `policy.concurrency` in flight, and writes a part of at least "
            f"{SERVED_PART_ROWS:,} rows while the next part's requests are in flight; the samples still to generate "
            f"are read per turn and the requests built as the parts are cut, so its memory follows the turns, not "
            f"the samples; rewards and profiles are computed in batches and in DuckDB.")


def decisive_steps() -> str:
    return figure("decisive_bfcl", "grpo_steps")


# -- the demo's settings (pivot.yaml through the config model) -----------------------------------------------------

def demo_config():
    from pivot_assets.core.config import load_config

    return load_config(ROOT / "pivot.yaml")


def demo_settings() -> str:
    """The shipped pivot.yaml in one sentence."""
    c = demo_config()
    return (f"The shipped `pivot.yaml` is the demo: the embedded sample ({c.sample.n_trajectories} trajectories), "
            f"an SFT warm-up of {c.sft.steps} steps as the reference policy (zero-shot the 135M model almost never emits a "
            f"correct tool call, so it has no pivots), K={c.policy.k} samples a turn of at most "
            f"{c.policy.max_new_tokens} new tokens, `pivots.lambda_diff` {c.pivots.lambda_diff}, a "
            f"{c.training.steps}-step CPU smoke GRPO run on `D_{c.training.set}`, and `evaluation.k` {c.evaluation.k} "
            f"on {c.evaluation.max_turns} held-out turns and {c.evaluation.ood_max_items} probe items.")


# -- the SQL tables (core/catalog.py) ------------------------------------------------------------------------------

def sql_tables() -> str:
    """Every catalog table with a fixed schema: its key and its other columns."""
    from pivot_assets.core.catalog import TABLES

    lines = ["| table | key | other columns |", "|---|---|---|"]
    for t in TABLES.values():
        if t.schema is None:
            continue
        rest = [n for n in t.schema.names if n not in t.key]
        lines.append(f"| `{t.name}` | {', '.join(t.key)} | {', '.join(rest)} |")
    keyed = [t for t in TABLES.values() if t.schema is None]
    lines.append("")
    lines.append("Keyed like the above, columns set by the stage that writes them: "
                 + "; ".join(f"`{t.name}` ({', '.join(t.key)})" for t in keyed) + ".")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a `|` (even inside backticks) would end the cell."""
    return text.replace("|", "\\|")


# -- the CLI (pivot_jobs/cli.py's parser) --------------------------------------------------------------------------

def _flag(action) -> str:
    name = action.option_strings[0] if action.option_strings else action.dest.upper()
    if action.choices:
        value = "|".join(map(str, action.choices))
        return f"{name} {value}" if action.option_strings else value
    if action.option_strings and action.nargs != 0:
        return f"{name} {action.metavar or action.dest.upper()}"
    return name


def cli_verbs() -> str:
    """Every `pivot` verb, what it does and its flags."""
    import argparse

    from pivot_jobs.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    lines = ["| verb | what | arguments and flags |", "|---|---|---|"]
    for verb, parser in sub.choices.items():
        flags = [_flag(a) for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        cells = [f"`pivot {verb}`", helps[verb], ", ".join(f"`{f}`" for f in flags)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


# -- user-facing error messages (the raising modules' constants) ---------------------------------------------------

def _quote(template: str, **example) -> str:
    text = template.format(**example)
    return _cell(f"`` {text} ``" if "`" in text else f"`{text}`")


def _error_quotes() -> list[tuple[str, str]]:
    """(the message as the code prints it, with example values; what to do), one per quoted error constant."""
    from pivot_assets.core.warehouse import S3_CREDENTIALS_MISSING
    from pivot_assets.policies.hub import NOT_CACHED_OFFLINE
    from pivot_assets.verifiers.user_verifiers import NO_MODULE

    return [
        (_quote(NOT_CACHED_OFFLINE, hub_id="org/name", cache="~/.cache/huggingface/hub",
                fetch_command="hf download org/name"),
         "a Hub id with no network (`HF_HUB_OFFLINE=1`) and no cached snapshot: run the printed `hf download` on a "
         "machine with network, or copy its `$HF_HOME/hub/models--org--name` here "
         "([engines](engines.md#models-by-hub-id))"),
        (_quote(NO_MODULE, name="my_rewards:MyVerifier", top="my_rewards", where="/home/me/work, /home/me/work/configs"),
         "the module is looked for on `sys.path` (`PYTHONPATH`), in the working directory and in the config's "
         "folder; the line lists the folders it searched ([verifiers](verifiers.md#write-your-own-verifier))"),
        (_quote(S3_CREDENTIALS_MISSING),
         "credentials come only from the environment; on Ray, start the head (and every node) with them "
         "([scale-out](scale.md#object-storage-and-a-shared-instance))"),
    ]


def error_table() -> str:
    """Troubleshooting's quoted error lines, each from the constant the raising module prints."""
    lines = ["| the line printed (after `config error: <config>: <key>:` where a config key names it) | cause and fix |",
             "|---|---|"]
    return "\n".join(lines + [f"| {message} | {fix} |" for message, fix in _error_quotes()])


# What each capability means to a user, with the pages that say more; a capability without a line here fails `make docs`.
CAPABILITY_MEANING = {
    "local_model": "samples a local model dir: a local tokenizer, a weights fingerprint, a dtype it resolves",
    "torch_in_process": "runs torch in the calling process, whose intra-op threads are set there",
    "turn_rows_together": "one prefill serves a turn's K samples: batches are turn-major, else sample-major",
    "scores_continuation": "teacher-forced log-likelihood of the expert action ([adaptive profiling](adaptive.md))",
    "bounded_thinking": "implements `policy.thinking_budget` (a forced `</think>`)",
    "per_row_seeds": "each (turn, sample index) drawn under its own seed",
    "reloads_weights": "loads another checkpoint of the same architecture into the running engine (evaluation's "
                       "models in turn)",
    "grpo_rollouts": "samples GRPO's completions for TRL, the trainer's weights loaded after each step "
                     "(`training.rollout_engine: auto` picks it; [what a GRPO step costs]"
                     "(evaluation.md#what-a-grpo-step-costs-and-making-it-cheaper))",
    "streams_requests": "takes single requests while others decode, hands each back as it finishes and cancels on "
                        "demand (adaptive profiling's `scheduler: stream`, [adaptive.md](adaptive.md))",
}


def engine_capabilities() -> str:
    """Which engine can do what (core/engines.py's ENGINES), one row per capability."""
    from dataclasses import fields

    from pivot_assets.core.engines import ENGINES

    flags = [f.name for f in fields(next(iter(ENGINES.values()))) if f.type in (bool, "bool")]
    lines = ["| capability | " + " | ".join(ENGINES) + " | what it means |", "|---" * (len(ENGINES) + 2) + "|"]
    for flag in flags:
        cells = ["yes" if getattr(caps, flag) else "no" for caps in ENGINES.values()]
        lines.append(f"| `{flag}` | " + " | ".join(cells) + f" | {CAPABILITY_MEANING[flag]} |")
    return "\n".join(lines)


# -- the exports (curation/exports.py) -----------------------------------------------------------------------------

def _feature(feature) -> str:
    """A `datasets` feature as a short type: string, int64, JSON, list of ..., {key: type, ...}."""
    from datasets import Json, List, Value

    if isinstance(feature, Value):
        return feature.dtype
    if isinstance(feature, Json):
        return "JSON"
    if isinstance(feature, List):
        return f"list of {_feature(feature.feature)}"
    if isinstance(feature, dict):
        return "{" + ", ".join(f"{k}: {_feature(v)}" for k, v in feature.items()) + "}"
    raise ValueError(f"no short name for the feature {feature!r}")


# What each column of the HF export holds (curation/exports.py's docstring); a column without a line fails `make docs`.
HF_COLUMN_MEANING = {
    "prompt": "the pivot's state, the conversation before the turn, as chat-template messages (reasoning dropped, "
              "`content` \"\" when none, `tool_calls` [] when none, arguments an object)",
    "tools": "the trajectory's chat tool schemas, JSON text",
    "turn_id": "the pivot turn's id",
    "trajectory_id": "its trajectory's id",
    "domain": "the trajectory's domain",
    "message_index": "the turn's index in the trajectory's messages (the prompt is the messages before it)",
    "action_kind": "`tool_call`, `tool_call_batch` or `message`",
    "expert_action": "the expert's action at the turn, JSON text: what a reward function compares a completion with",
    "selection_rank": "the pivot's rank in its set (the export's order)",
    "pivot_set": "`adv`, `mixed` or `cand`",
    "policy_fp": "the reference policy that profiled the turn (fingerprint)",
    "verifier_fp": "the verifier that scored its samples (fingerprint)",
    "k": "samples in the profile",
    "reward_mean": "the profile's mean reward",
    "reward_var": "its variance",
    "reward_std": "its standard deviation",
    "n_pass": "samples that pass: reward at least `pass_threshold` (1 for 0/1 rewards)",
    "n_distinct_actions": "distinct actions among the samples",
    "pass_threshold": "the verifier's pass threshold that `n_pass` counts by",
    "conversation_id": "the source conversation (for splits grouped by conversation)",
    "environment": "the trajectory's executable environment, JSON text (null when it has none): what `executed_state` "
                   "rebuilds the turn's world from",
}


def hf_export_columns() -> str:
    """The columns of `pivot export --format hf` (and pivot_dataset) with their types, from the dataset's Features."""
    from pivot_assets.curation.exports import _hf_features

    lines = ["| column | type | what |", "|---|---|---|"]
    lines += [f"| `{name}` | {_cell(_feature(f))} | {HF_COLUMN_MEANING[name]} |" for name, f in _hf_features().items()]
    return "\n".join(lines)


def nemo_gym_row_keys() -> str:
    """The keys of a `pivot export --format nemo-gym` row, the profile object's name among them."""
    from pivot_assets.curation.exports import DEFAULT_PROFILE_KEY, NEMO_GYM_ROW_KEYS, REWARD_STATS

    keys = ", ".join(f"`{k}`" for k in NEMO_GYM_ROW_KEYS)
    stats = ", ".join(("rewards", *REWARD_STATS))
    return (f"A row's keys: {keys}, and the profile object `{DEFAULT_PROFILE_KEY}` ({{{stats}}}; "
            f"`--profile-key NAME` names it otherwise).")
