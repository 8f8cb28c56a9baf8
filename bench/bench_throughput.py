"""Benchmark: what the curation chain absorbs from an engine that answers at once (the pipeline's own cost).

Usage:
  .venv/bin/python bench/bench_throughput.py [--sizes 1000 10000] [--k 8] [--concurrency 32]
      [--baseline-root /tmp/base] [--in-process] [--profile] [--json bench/results/throughput.json]

For each code tree (this one, and with --baseline-root a checkout of an earlier commit, run side by side) and each
size N of the built-in sample: a project in a temp folder, `pivot run` of each step of the chain in turn
(ingest -> rollouts -> rollout_rewards -> turn_profiles -> pivot sets), the rollouts step served by an instant
OpenAI-compatible server (aiohttp, its own process on 127.0.0.1, one fixed tool call per choice). Per step: wall
seconds, samples/s, CPU seconds per sample (the step's process tree; the server's apart) and peak RSS of the
process tree (sampled every 50 ms). --in-process: at the first size, the rollouts step again through Profiler.generate with an engine
on the backend seam that returns at once (no HTTP: the client's cost seen apart). --profile: py-spy (pip install
py-spy) samples the served rollouts step of the first size; the leaf functions taking most samples are printed.
Prints markdown tables and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = {  # step -> the assets `pivot run --select` materializes
    "ingest": "trajectories,quarantine,turns",
    "rollouts": "rollouts",
    "rewards": "rollout_rewards",
    "profiles": "turn_profiles",
    "pivot sets": "pivots_mixed,pivots_adv,pivots_cand,pivot_selection_log",
}

SERVER = r'''
import json, sys
from aiohttp import web

CALL = {"id": "c0", "type": "function", "function": {"name": "get_order_status", "arguments": "{\"order_id\": \"ORD-1234\"}"}}
cache = {}

def reply(n):
    if n not in cache:
        choices = [{"index": i, "finish_reason": "tool_calls",
                    "message": {"role": "assistant", "content": None, "tool_calls": [CALL]}} for i in range(n)]
        cache[n] = json.dumps({"id": "x", "object": "chat.completion", "model": "instant", "choices": choices,
                               "usage": {"prompt_tokens": 400, "completion_tokens": 24 * n}}).encode()
    return cache[n]

async def chat(request):
    body = await request.json()
    return web.Response(body=reply(int(body.get("n", 1))), content_type="application/json")

app = web.Application(client_max_size=64 << 20)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
'''


def commit_of(root: Path) -> str:
    """The checkout's commit (short), with "+changes" when its tracked files differ from it."""
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", "pivot_assets", "pivot_jobs"])
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty.returncode else "")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([python, "-c", SERVER, str(port)])
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                                          data=b'{"n": 1}', method="POST"), timeout=1).read()
            return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the instant server did not start")


def config(n: int, k: int, concurrency: int, base_url: str) -> str:
    return f"""warehouse: ./warehouse
sample: {{n_trajectories: {n}, seed: 0}}
policy: {{backend: openai, base_url: "{base_url}", model: instant, k: {k}, concurrency: {concurrency},
          temperature: 1.0, max_new_tokens: 64}}
verifier:
  default: {{name: tool_call, text_threshold: 0.5}}
pivots: {{lambda_diff: 0.7, seed: 0}}
"""


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_step(code_root: Path, project: Path, select: str, py_spy: str | None = None) -> dict:
    """`pivot run --select` in the project with the code of `code_root`: wall, CPU of the tree, peak tree RSS."""
    env = {**os.environ, "PYTHONPATH": str(code_root), "DAGSTER_HOME": str(project / "dagster_home"),
           "HF_HUB_OFFLINE": "1"}
    env.pop("PIVOT_CONFIG", None)
    cmd = [sys.executable, "-m", "pivot_jobs.cli", "run", "--select", select]
    if py_spy:
        cmd = [py_spy, "record", "--gil", "--format", "raw", "--rate", "100", "--output", str(project / "profile.txt"),
               "--", *cmd]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(ps))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode(errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"pivot run --select {select} failed ({code_root}):\n{out[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(peak / 2**20)}


def count_rows(project: Path, table: str) -> int:
    import duckdb

    wh = project / "warehouse"
    parts = wh / table
    glob = f"{parts}/**/*.parquet" if parts.is_dir() else f"{wh}/{table}.parquet"
    return duckdb.sql(f"select count(*) from read_parquet('{glob}')").fetchone()[0]


def chain(code_root: Path, n: int, k: int, concurrency: int, workdir: Path, py_spy: str | None) -> dict:
    """The chain at size n under the code of code_root, its rollouts served by a fresh instant server."""
    project = workdir / f"{code_root.name}-{n}"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    server, base_url = start_server(sys.executable)
    try:
        (project / "pivot.yaml").write_text(config(n, k, concurrency, base_url))
        steps = {}
        for step, select in STEPS.items():
            server_cpu0 = sum(psutil.Process(server.pid).cpu_times()[:2])
            steps[step] = run_step(code_root, project, select)
            steps[step]["server_cpu_s"] = round(sum(psutil.Process(server.pid).cpu_times()[:2]) - server_cpu0, 2)
        if py_spy:  # the rollouts step again, under py-spy (apart: the measured run is not slowed by it)
            shutil.rmtree(project / "warehouse" / "rollouts")
            run_step(code_root, project, STEPS["rollouts"], py_spy)
    finally:
        server.terminate()
        server.wait()
    samples = count_rows(project, "rollouts")
    for s in steps.values():
        s["samples_per_s"] = round(samples / s["wall_s"])
        s["cpu_ms_per_sample"] = round(1000 * s["cpu_s"] / samples, 3)
    wall = sum(s["wall_s"] for s in steps.values())
    result = {"trajectories": n, "turns": count_rows(project, "turns"), "samples": samples, "steps": steps,
              "chain": {"wall_s": round(wall, 2), "samples_per_s": round(samples / wall),
                        "cpu_ms_per_sample": round(1000 * sum(s["cpu_s"] for s in steps.values()) / samples, 3),
                        "peak_rss_mb": max(s["peak_rss_mb"] for s in steps.values())}}
    if py_spy and (project / "profile.txt").exists():
        result["profile"] = top_leaves(project / "profile.txt")
    shutil.rmtree(project / "warehouse", ignore_errors=True)
    return result


def top_leaves(raw: Path, n: int = 15) -> list[dict]:
    """py-spy raw output (stack;stack;... count): the share of samples per leaf function and per top-level area."""
    leaves: Counter = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        leaves[_short(frames[-1])] += int(count)
        total += int(count)
    return [{"function": f, "share": round(c / total, 3)} for f, c in leaves.most_common(n)]


def _short(frame: str) -> str:
    """'func (path/to/file.py:12)' -> 'func (file.py)'."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})" if where else name


def in_process(code_root: Path, n: int, k: int, workdir: Path) -> dict:
    """The rollouts step through Profiler.generate (code of code_root, in a process of its own) with an engine on
    the backend seam that returns at once."""
    project = workdir / f"inproc-{code_root.name}-{n}"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    (project / "pivot.yaml").write_text(config(n, k, 32, "http://127.0.0.1:9/v1"))
    run_step(code_root, project, STEPS["ingest"])
    env = {**os.environ, "PYTHONPATH": str(code_root), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, __file__, "--in-process-run", str(project)], env=env, cwd=project,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"in-process run failed ({code_root}):\n{out.stderr[-3000:]}")
    shutil.rmtree(project, ignore_errors=True)
    return {"trajectories": n, **json.loads(out.stdout.strip().splitlines()[-1])}


def in_process_run(project: Path) -> dict:
    """(In the child process) Profiler.generate in `project` with the instant engine; its figures as a dict."""
    from pivot_assets.core.config import load_config
    from pivot_assets.policies.base import Sample
    from pivot_assets.profiling.profiler import Profiler

    completion = '<tool_call>\n{"name": "get_order_status", "arguments": {"order_id": "ORD-1234"}}\n</tool_call>'

    class InstantBackend:
        fingerprint, stats = "instant", {}

        def generate(self, requests, sampling, rows=None):
            plan = rows or {r.turn_id: [(i, sampling.seed) for i in range(sampling.k)] for r in requests}
            yield [Sample(r.turn_id, i, completion, 400, 24, "stop") for r in requests for i, _seed in plan[r.turn_id]]

    profiler = Profiler.for_config(load_config(project / "pivot.yaml"))
    profiler.build_backend = InstantBackend
    usage0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    samples = profiler.generate()["rollouts_generated"]
    wall, usage1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    return {"samples": samples, "wall_s": round(wall, 2), "samples_per_s": round(samples / wall),
            "cpu_ms_per_sample": round(1000 * cpu / samples, 3),
            "peak_rss_mb": round(usage1.ru_maxrss / 1024)}


def markdown(runs: dict, inproc: dict) -> str:
    lines = [("| code | sample trajectories | turns | samples | rollouts step (samples/s) | whole chain (s) | "
             "chain samples/s | CPU ms/sample (chain) | peak RSS (MB) |"), "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, results in runs.items():
        for r in results:
            c = r["chain"]
            lines.append(f"| {label} | {r['trajectories']:,} | {r['turns']:,} | {r['samples']:,} | "
                         f"{r['steps']['rollouts']['samples_per_s']:,} | {c['wall_s']} | {c['samples_per_s']:,} | "
                         f"{c['cpu_ms_per_sample']} | {c['peak_rss_mb']:,} |")
    lines += ["", "Per step (wall s / samples/s / CPU ms per sample / peak RSS MB; server CPU s during the step):", "",
              "| code | samples | " + " | ".join(STEPS) + " |", "|---|---:|" + "---|" * len(STEPS)]
    for label, results in runs.items():
        for r in results:
            cells = [f"{s['wall_s']} / {s['samples_per_s']:,} / {s['cpu_ms_per_sample']} / {s['peak_rss_mb']}"
                     + (f"; server {s['server_cpu_s']}" if name == "rollouts" else "")
                     for name, s in r["steps"].items()]
            lines.append(f"| {label} | {r['samples']:,} | " + " | ".join(cells) + " |")
    if inproc:
        lines += ["", "In-process instant engine (no HTTP), rollouts step:", "",
                  "| code | sample trajectories | samples | wall s | samples/s | CPU ms/sample | peak RSS (MB) |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {label} | {r['trajectories']:,} | {r['samples']:,} | {r['wall_s']} | {r['samples_per_s']:,} | "
                  f"{r['cpu_ms_per_sample']} | {r['peak_rss_mb']:,} |" for label, rs in inproc.items() for r in rs]
    for label, results in runs.items():
        for r in results:
            if r.get("profile"):
                lines += ["", (f"Where the served rollouts step's time goes ({label}, {r['samples']:,} samples; "
                              "py-spy, share of samples by leaf function):"), "", "| function | share |", "|---|---:|"]
                lines += [f"| {p['function']} | {p['share']:.1%} |" for p in r["profile"]]
    return "\n".join(lines)


TARGETS = {"rollouts_samples_per_s": 2000, "chain_samples_per_s_10k": 1500, "wall_per_sample_ratio": 1.3,
           "peak_rss_mb": 1024}


def target_lines(results: list[dict]) -> list[str]:
    """This tree's figures against the targets: the rollouts step and the chain at the largest size up to 10k
    sample trajectories, the chain's wall time per sample there against the smallest size's, peak RSS at every size."""
    by_n = sorted(results, key=lambda r: r["trajectories"])
    at = max((r for r in by_n if r["trajectories"] <= 10_000), key=lambda r: r["trajectories"], default=by_n[-1])
    small = by_n[0]
    per_sample = {r["trajectories"]: r["chain"]["wall_s"] / r["samples"] for r in by_n}
    ratio = per_sample[at["trajectories"]] / per_sample[small["trajectories"]]
    rss = max(r["chain"]["peak_rss_mb"] for r in by_n)

    def mark(ok: bool) -> str:
        return "met" if ok else "missed"

    return [
        "| target | measured (this tree) | |", "|---|---|---|",
        f"| rollouts step >= {TARGETS['rollouts_samples_per_s']:,} samples/s (at {at['samples']:,} samples) | "
        f"{at['steps']['rollouts']['samples_per_s']:,} | "
        f"{mark(at['steps']['rollouts']['samples_per_s'] >= TARGETS['rollouts_samples_per_s'])} |",
        f"| whole chain >= {TARGETS['chain_samples_per_s_10k']:,} samples/s at {at['trajectories']:,} sample "
        f"trajectories | {at['chain']['samples_per_s']:,} | "
        f"{mark(at['chain']['samples_per_s'] >= TARGETS['chain_samples_per_s_10k'])} |",
        f"| chain wall time per sample at {at['trajectories']:,} within {TARGETS['wall_per_sample_ratio']}x of "
        f"{small['trajectories']:,}'s | {ratio:.2f}x ({1000 * per_sample[at['trajectories']]:.3f} vs "
        f"{1000 * per_sample[small['trajectories']]:.3f} ms) | {mark(ratio <= TARGETS['wall_per_sample_ratio'])} |",
        f"| peak RSS <= {TARGETS['peak_rss_mb']:,} MB at every size up to {by_n[-1]['samples']:,} samples | "
        f"{rss:,} MB | {mark(rss <= TARGETS['peak_rss_mb'])} |",
    ]


GPU_SAMPLES_PER_S = 1000  # what one H100 with vLLM returns on a 1-2B policy, ~60-token samples: assumed, not measured


def report(meta: dict, tables: str, note: str, figures: dict, targets: list[str]) -> str:
    targets_text = "\n".join(targets)
    return f"""# Throughput: what the curation chain absorbs from an engine that answers at once

{gpu_line(figures)}

{targets_text}

Machine: {meta['machine']}; {meta['date']}; Python {meta['python']}; k {meta['k']}, concurrency {meta['concurrency']}.
Command: `.venv/bin/python {meta['command']}`. Load average after the run: {', '.join(map(str, meta['load_average_after']))}.
{note}

The engine is an OpenAI-compatible server on 127.0.0.1 that answers every request at once with one fixed tool call
(aiohttp, a process of its own: its CPU is counted apart), so the figures are the pipeline's own cost. Each step is
one `pivot run --select` (its Dagster start included); the chain is their sum. Peak RSS: the step's process tree,
sampled every 50 ms. Code: {', '.join(f"{label} {commit}" for label, commit in meta['commits'].items())}
(`baseline`: the same bench run against a checkout of an earlier commit, side by side, size by size).

{tables}
"""


def gpu_line(figures: dict) -> str:
    return (f"At {figures['samples']} samples the rollouts step absorbs {figures['rollouts_samples_per_s']} samples/s "
            f"from a served engine: at {figures['gpu_samples_per_s']} samples/s per GPU (an H100 with vLLM on a 1-2B "
            f"policy, ~60-token samples: assumed, not measured here) that is {figures['gpus_fed']} GPUs kept fed.")


def summarize(meta: dict, runs: dict, inproc: dict) -> dict:
    """The figures the docs quote (docs/_gen/facts.py), each as a string the report shows, and the row quoted."""
    mine, base = runs["this tree"], runs.get("baseline", [])
    largest = max(mine, key=lambda r: r["samples"])
    rollouts = largest["steps"]["rollouts"]
    figures = {"machine": meta["machine"], "samples": f"{largest['samples']:,}",
               "rollouts_samples_per_s": f"{rollouts['samples_per_s']:,}",
               "chain_samples_per_s": f"{largest['chain']['samples_per_s']:,}",
               "peak_rss_mb": f"{max(r['chain']['peak_rss_mb'] for r in mine):,}",
               "gpus_fed": f"{rollouts['samples_per_s'] / GPU_SAMPLES_PER_S:.1f}",
               "gpu_samples_per_s": f"{GPU_SAMPLES_PER_S:,}"}
    row = next(line for line in markdown({"this tree": [largest]}, {}).splitlines() if line.startswith("| this tree"))
    evidence = {key: row for key in ("samples", "rollouts_samples_per_s", "chain_samples_per_s")}
    if base:
        before = max(base, key=lambda r: r["samples"])
        figures["rollouts_before"] = f"{before['steps']['rollouts']['samples_per_s']:,}"
        figures["chain_before"] = f"{before['chain']['samples_per_s']:,}"
        base_row = next(line for line in markdown({"baseline": [before]}, {}).splitlines() if line.startswith("| baseline"))
        evidence.update(rollouts_before=base_row, chain_before=base_row)
    if inproc.get("this tree"):
        figures["in_process_samples_per_s"] = f"{max(r['samples_per_s'] for r in inproc['this tree']):,}"
    return {"what": f"the curation chain's throughput from an instant engine on {meta['machine']}",
            "figures": figures, "evidence": evidence}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--baseline-root", type=Path, default=None, help="a checkout of the commit to compare against")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--profile", action="store_true", help="py-spy the served rollouts step of the first size")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    ap.add_argument("--json", type=Path, default=None, help="the figures as JSON (bench/results/throughput.json)")
    ap.add_argument("--out", type=Path, default=None, help="the Markdown report (bench/RESULTS_throughput.md)")
    ap.add_argument("--note", default="", help="what else ran on the box during the measurement")
    ap.add_argument("--in-process-run", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.in_process_run:
        print(json.dumps(in_process_run(args.in_process_run)))
        return
    from pivot_assets.core.hardware import describe_cpu

    workdir = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    roots = {"this tree": ROOT, **({"baseline": args.baseline_root.resolve()} if args.baseline_root else {})}
    runs: dict[str, list] = {label: [] for label in roots}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for n in args.sizes:  # both trees at one size before the next: the box's load changes alike for both
        for label, root in roots.items():
            spy = args.py_spy if args.profile and n == args.sizes[0] else None
            runs[label].append(chain(root, n, args.k, args.concurrency, workdir, spy))
            print(f"{label} n={n}: {json.dumps(runs[label][-1]['chain'])}", flush=True)
    inproc = {label: [in_process(root, n, args.k, workdir) for n in args.sizes[:1]] for label, root in roots.items()
              if args.in_process}
    shutil.rmtree(workdir, ignore_errors=True)
    meta = {"machine": describe_cpu(), "date": started, "python": platform.python_version(),
            "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "load_average_after": [round(x, 2) for x in os.getloadavg()], "k": args.k, "concurrency": args.concurrency,
            "commits": {label: commit_of(root) for label, root in roots.items()}}
    print(json.dumps(meta))
    tables = markdown(runs, inproc)
    print(tables)
    summary = summarize(meta, runs, inproc)
    if args.out:
        args.out.write_text(report(meta, tables, args.note, summary["figures"], target_lines(runs["this tree"])))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        summary = {"results_file": args.out.resolve().relative_to(ROOT).as_posix() if args.out else None,
                   **summary, "meta": meta, "runs": runs, "in_process": inproc}
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
