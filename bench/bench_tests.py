"""Where the test suite's time goes: every test's phases grouped by kind, per worker, and per module, this tree beside
a baseline run, in one table.

A run writes one JSON line per test phase (tests/timings.py, PIVOT_TEST_TIMINGS) and samples the box's used memory
and busy cores every 2 s; the report reads those files, so kept runs render beside a new one without running again.

    # `make test`'s set (pytest -q -x -n 2, --keep-going leaves out -x) and `make test-fast`'s, then the report:
    .venv/bin/python bench/bench_tests.py --run --label suite
    .venv/bin/python bench/bench_tests.py --run --label fast --marker "not scenario"
    .venv/bin/python bench/bench_tests.py --timings bench/data/tests/suite.jsonl --label suite \
        --baseline before=bench/data/tests/before.jsonl --baseline fast=bench/data/tests/fast.jsonl \
        --out bench/RESULTS_tests.md --unit-seconds

A `make test` itself is timed the same way: PIVOT_TEST_TIMINGS=bench/data/tests/suite.jsonl in its environment, and
`bench_tests.py --sample bench/data/tests/suite.memory` beside it (stopped with Ctrl-C). Runs are kept in
bench/data/tests/<label>.jsonl and .memory; the report also writes bench/results/tests.json (the docs' figures) and,
with --unit-seconds, tests/unit_seconds.json (the order xdist hands out the units of work).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "data" / "tests"
SLOW_UNMARKED_S = 5.0  # a test outside `scenario` slower than this belongs in it (the fast loop's budget)

# (kind, rule): the first rule a test meets names its kind
KINDS = ("kill / stop and rerun", "Ray", "vLLM", "S3", "accelerate launch", "dagster dev / UI", "pivot run",
         "model or training", "the rest")


def kind_of(test: dict, source: str) -> str:
    name, fixtures, marks = test["nodeid"].split("::")[-1], set(test["fixtures"]), set(test["marks"])
    module = test["nodeid"].split("::")[0]
    if re.search(r"kill|sigterm|interrupt|stopped", name):
        return "kill / stop and rerun"
    if fixtures & {"ray_head", "ray_head_s3"} or "/scale/test_ray_" in module:
        return "Ray"
    if "vllm" in marks:
        return "vLLM"
    if "s3_server" in fixtures:
        return "S3"
    if "/test_launcher" in module or "accelerate" in name:
        return "accelerate launch"
    if "/pipeline/test_ui" in module:
        return "dagster dev / UI"
    if re.search(r"""pivot\(\[\s*["']run|["']run["'],\s*["']--""", source):
        return "pivot run"
    if fixtures & {"embedded_model_dir", "tiny_model_dir"} or re.search(r"train|sft|grpo", name):
        return "model or training"
    return "the rest"


def function_sources(module: str) -> dict[str, str]:
    """{test function name: its source} of one test module."""
    path = REPO / module
    if not path.is_file():
        return {}
    text = path.read_text()
    return {node.name: ast.get_source_segment(text, node) or ""
            for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)}


def load(path: Path) -> dict[str, dict]:
    """{node id: {phases' seconds, fixtures, marks, worker, outcome, kind}} of one timings file."""
    tests: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        t = tests.setdefault(r["nodeid"], {"nodeid": r["nodeid"], "seconds": 0.0, "phases": {}, "fixtures": [],
                                           "marks": [], "worker": "main", "outcome": "passed"})
        t["seconds"] += r["seconds"]
        t["phases"][r["when"]] = r["seconds"]
        for key in ("fixtures", "marks", "worker"):
            t[key] = r.get(key) or t[key]
        if r["outcome"] == "failed":
            t["outcome"] = "failed" if r["when"] == "call" else "error"
        elif r["outcome"] == "skipped" and t["outcome"] == "passed":
            t["outcome"] = "skipped"
    sources: dict[str, dict[str, str]] = {}
    for t in tests.values():
        module, func = t["nodeid"].split("::")[0], t["nodeid"].split("::")[-1].split("[")[0]
        source = sources.setdefault(module, function_sources(module)).get(func, "")
        t["kind"] = kind_of(t, source)
    return tests


def span(path: Path, gap_s: float = 60.0) -> float:
    """Seconds the tests ran: from the first start to the last stop, less any pause of more than `gap_s` in which no
    test ran (a file that joins two pytest invocations counts each one's span)."""
    rows = sorted((r["start"], r["stop"]) for r in map(json.loads, path.read_text().splitlines()) if r.get("start"))
    total, begin, end = 0.0, None, None
    for start, stop in rows:
        if begin is None or start - end > gap_s:
            total += (end - begin) if begin is not None else 0.0
            begin, end = start, stop
        end = max(end, stop)
    return total + ((end - begin) if begin is not None else 0.0)


def by(tests: dict[str, dict], key) -> dict[str, tuple[int, float]]:
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for t in tests.values():
        out[key(t)][0] += 1
        out[key(t)][1] += t["seconds"]
    return {k: (n, s) for k, (n, s) in out.items()}


def outcomes(tests: dict[str, dict]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for t in tests.values():
        counts[t["outcome"]] += 1
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))


def cpu() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    flags = Path("/proc/cpuinfo").read_text()
    extras = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores ({', '.join(extras) or 'no avx512_bf16, no AMX'})"


def cpu_times() -> tuple[int, int]:
    """(all jiffies, idle + iowait jiffies) of the box since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values), values[3] + values[4]


def sample_box(memory: Path, stop: threading.Event) -> None:
    """Append "epoch used_MiB busy_fraction" to `memory` every 2 s until `stop` (busy: of all cores, since the last
    line): the box's memory in use and how busy its cores were while the tests ran."""
    before = cpu_times()
    with memory.open("w") as f:
        while not stop.wait(2):
            info = {k: int(v.split()[0]) for k, v in
                    (line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())}
            now = cpu_times()
            busy = 1 - (now[1] - before[1]) / max(now[0] - before[0], 1)
            before = now
            f.write(f"{time.time():.0f} {(info['MemTotal'] - info['MemAvailable']) // 1024} {busy:.2f}\n")
            f.flush()


def run_suite(label: str, marker: str | None, keep_going: bool) -> tuple[Path, Path, float, int]:
    """Run the suite as `make test` does, with per-test timings and a memory sampler; (timings, memory, wall, rc)."""
    DATA.mkdir(parents=True, exist_ok=True)
    timings, memory = DATA / f"{label}.jsonl", DATA / f"{label}.memory"
    timings.unlink(missing_ok=True)
    stop = threading.Event()
    sampler = threading.Thread(target=sample_box, args=(memory, stop), daemon=True)
    sampler.start()
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-n", "2", "-p", "no:cacheprovider", *["-x"] * (not keep_going)]
    cmd += ["-m", marker] if marker else []
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, cwd=REPO, env={**os.environ, "PIVOT_TEST_TIMINGS": str(timings)})
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    return timings, memory, wall, rc


def peak_mb(memory: Path | None) -> str:
    if not memory or not memory.is_file():
        return "n/a"
    values = [int(line.split()[1]) for line in memory.read_text().splitlines() if line.strip()]
    return f"{max(values) / 1024:.1f} GiB" if values else "n/a"


def mean_busy(memory: Path | None) -> str:
    """The cores' mean busy share over the run (a sampler line's third field), where it was sampled."""
    if not memory or not memory.is_file():
        return "n/a"
    busy = [float(line.split()[2]) for line in memory.read_text().splitlines() if len(line.split()) > 2]
    return f"{100 * sum(busy) / len(busy):.0f}%" if busy else "n/a"


def side_by_side(rows: list[str], columns: list[dict], fmt) -> list[str]:
    return [f"| {row} | " + " | ".join(fmt(c.get(row)) for c in columns) + " |" for row in rows]


def report(runs: list[tuple[str, Path, str]], command: str) -> tuple[str, dict]:
    """runs: (label, timings file, note); the last is the run this report is about. Returns the Markdown and its
    summary (bench/results/tests.json: each run's wall time, tests and peak memory, quoted from the Markdown)."""
    loaded = [(label, load(path), span(path), note, path) for label, path, note in runs]
    labels = [label for label, *_ in loaded]
    head = "| | " + " | ".join(labels) + " |\n|---|" + "---|" * len(labels)
    out = ["# The test suite's time, by kind", "",
           f"Machine: {cpu()}; {datetime.now(timezone.utc):%Y-%m-%d}. Command: `{command}`.", "",
           "Each column is one run of `pytest -q -x -n 2` (what `make test` runs after its lint), its timings written by "
           "tests/timings.py and kept in bench/data/tests/. Seconds are the sum of a test's setup, call and teardown "
           "(a module- or session-scoped fixture's start is charged to the first test that uses it); a kind is the "
           "first rule of bench/bench_tests.py's `kind_of` that a test meets.", ""]
    out += ["| run | note | wall (tests running) | tests | peak used memory | cores busy |", "|---|---|---|---|---|---|"]
    summary = {"results_file": "bench/RESULTS_tests.md", "what": f"the test suite's runs on {cpu()}",
               "figures": {"machine": cpu()}, "evidence": {"machine": f"Machine: {cpu()};"}}
    for label, tests, wall, note, path in loaded:
        figures = {f"{label}_wall": f"{wall:,.0f} s ({wall / 60:.1f} min)", f"{label}_tests": outcomes(tests),
                   f"{label}_peak_memory": peak_mb(path.with_suffix('.memory'))}
        row = f"| {label} | {note} | " + " | ".join(figures.values()) + f" | {mean_busy(path.with_suffix('.memory'))} |"
        out.append(row)
        summary["figures"].update(figures)
        summary["evidence"].update({key: row for key in figures})
    kinds = [by(t, lambda x: x["kind"]) for _, t, *_ in loaded]
    out += ["", "## Seconds by kind (tests)", "", head]
    out += side_by_side(list(KINDS), kinds, lambda v: f"{v[1]:,.0f} ({v[0]})" if v else "-")
    out += ["| all | " + " | ".join(f"{sum(s for _, s in k.values()):,.0f} ({sum(n for n, _ in k.values())})"
                                     for k in kinds) + " |"]
    workers = [by(t, lambda x: x["worker"]) for _, t, *_ in loaded]
    names = sorted({w for ws in workers for w in ws})
    out += ["", "## Seconds by worker (the busiest is the critical path)", "", head]
    out += side_by_side(names, workers, lambda v: f"{v[1]:,.0f} ({v[0]})" if v else "-")
    modules = [by(t, lambda x: x["nodeid"].split("::")[0]) for _, t, *_ in loaded]
    names = sorted({m for ms in modules for m in ms})
    out += ["", "## Tests and seconds per module", "", "Tests are collected test items (each parametrization one).",
            "", head]
    out += side_by_side(names, modules, lambda v: f"{v[0]} / {v[1]:,.0f} s" if v else "-")
    label, tests, *_ = loaded[-1]
    slowest = sorted(tests.values(), key=lambda t: -t["seconds"])[:25]
    out += ["", f"## The 25 slowest tests ({label})", "", "| seconds | kind | worker | test |", "|---|---|---|---|"]
    out += [f"| {t['seconds']:,.1f} | {t['kind']} | {t['worker']} | `{t['nodeid']}` |" for t in slowest]
    loose = sorted((t for t in tests.values() if "scenario" not in t["marks"] and t["seconds"] > SLOW_UNMARKED_S),
                   key=lambda t: -t["seconds"])
    out += ["", f"## Tests outside `scenario` slower than {SLOW_UNMARKED_S:.0f} s ({label})", "",
            "They run in `make test-fast`; each belongs in `scenario` or needs to be made faster.", ""]
    out += [f"- {t['seconds']:,.1f} s `{t['nodeid']}`" for t in loose] or ["None."]
    return "\n".join(out) + "\n", summary


def write_unit_seconds(tests: dict[str, dict]) -> None:
    """tests/unit_seconds.json: seconds per unit of work (tests/conftest.py's unit_of), longest first."""
    sys.path.insert(0, str(REPO))
    from tests.conftest import UNIT_SECONDS, unit_of

    units = by(tests, lambda t: unit_of(t["nodeid"]))
    ordered = dict(sorted(((u, round(s, 1)) for u, (_, s) in units.items()), key=lambda kv: -kv[1]))
    UNIT_SECONDS.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"bench_tests: wrote {UNIT_SECONDS.relative_to(REPO)} ({len(ordered)} units)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="store_true", help="run the suite now (else render --timings)")
    ap.add_argument("--label", default="after", help="the run's name: bench/data/tests/<label>.jsonl")
    ap.add_argument("--keep-going", action="store_true", help="run every test (without -x): timings of all of them")
    ap.add_argument("--marker", help="a pytest -m expression (e.g. 'not scenario' for make test-fast's set)")
    ap.add_argument("--timings", type=Path, help="an existing timings file to render (without --run)")
    ap.add_argument("--sample", type=Path, metavar="FILE",
                    help="only sample the box's memory and cores into FILE until stopped (beside a `make test`)")
    ap.add_argument("--note", default="", help="what the run was (a commit, a state of the box)")
    ap.add_argument("--baseline", type=Path, action="append", default=[],
                    help="timings file(s) to show beside it, each as LABEL=FILE or FILE (label from its name)")
    ap.add_argument("--out", type=Path, help="write the report here (else print it)")
    ap.add_argument("--notes", type=Path, help="a Markdown file appended to the report (what the figures mean)")
    ap.add_argument("--unit-seconds", action="store_true",
                    help="write the run's seconds per unit of work to tests/unit_seconds.json (the scheduler's order)")
    args = ap.parse_args(argv)
    if args.sample:
        try:
            sample_box(args.sample, threading.Event())
        except KeyboardInterrupt:
            return 0
    if args.run:
        timings, _, wall, rc = run_suite(args.label, args.marker, args.keep_going)
        print(f"bench_tests: pytest rc {rc}, {wall:,.0f} s; timings in {timings}")
    elif args.timings:
        timings = args.timings
    else:
        ap.error("give --run or --timings FILE")
    runs = []
    for b in args.baseline:
        label, _, path = str(b).rpartition("=")
        runs.append((label or Path(path).stem, Path(path), ""))
    runs.append((args.label, timings, args.note))
    command = "python bench/bench_tests.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text, summary = report(runs, command)
    if args.notes:
        text += "\n" + args.notes.read_text()
    if args.unit_seconds:
        write_unit_seconds(load(timings))
    if args.out:
        args.out.write_text(text)
        summary["results_file"] = str(args.out.resolve().relative_to(REPO))
        (REPO / "bench" / "results" / "tests.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"bench_tests: wrote {args.out} and bench/results/tests.json")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
