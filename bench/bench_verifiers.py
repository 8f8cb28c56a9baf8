"""Verifier throughput on pairs drawn from REAL tool calls in ../shared/data (one core, single process).

Real calls: every function_call in the NeMo-Gym rollouts (inputs, outputs, expected actions; with the row's
tools, so schema validation runs) and every assistant tool call of the tau2-bench airline run (no tools).
Each pair's expected action is a real call (as JSON text, as stored in the turns table); the candidate is one of:
  reserialized  same call, keys shuffled, integral numbers as 1.0, extra JSON whitespace (bare JSON)
  hermes        same call re-serialized inside <think>..</think><tool_call>..</tool_call>
  wrong_arg     one argument value changed (or an argument dropped)
  wrong_tool    another real tool name, same arguments
  text          a plain-text reply
  openai        the same call as an OpenAI chat message dict with tool_calls (arguments as JSON text)

Usage: .venv/bin/python bench/bench_verifiers.py [--pairs 100000] [--seed 0]
Prints a markdown table; results are recorded in bench/RESULTS_verifiers.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pivot_assets.verifiers import build_verifier  # noqa: E402
from pivot_assets.verifiers import parsing, tool_call, canonical, string_similarity  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
KINDS = ("reserialized", "hermes", "wrong_arg", "wrong_tool", "text", "openai")


def _args_dict(raw):
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, dict) else None


def real_calls() -> list[tuple[str, dict, list | None]]:
    """(name, arguments, tools) of every real tool call in the shared data."""
    calls = []
    for path in sorted(glob.glob(str(DATA / "nemo-gym" / "*" / "*" / "data" / "*.jsonl"))):
        for line in open(path, encoding="utf-8"):
            row = json.loads(line)
            rcp = row.get("responses_create_params") or {}
            tools = rcp.get("tools") or None
            items = rcp.get("input") if isinstance(rcp.get("input"), list) else []
            items = items + ((row.get("response") or {}).get("output") or [])
            ea = row.get("expected_action")
            if isinstance(ea, dict):
                items = items + ([ea] if ea.get("type") == "function_call" else ea.get("calls") or [])
            for it in items:
                if isinstance(it, dict) and it.get("type") == "function_call":
                    args = _args_dict(it.get("arguments"))
                    if args is not None:
                        calls.append((it["name"], args, tools))
    tau2 = DATA / "tau2-bench" / "airline_run1.json"
    if tau2.exists():
        for sim in json.loads(tau2.read_text())["simulations"]:
            for m in sim["messages"]:
                for c in m.get("tool_calls") or []:
                    args = _args_dict(c.get("arguments"))
                    if args is not None:
                        calls.append((c["name"], args, None))
    return calls


def _shuffled(obj, rng):
    if isinstance(obj, dict):
        keys = list(obj)
        rng.shuffle(keys)
        return {k: _shuffled(obj[k], rng) for k in keys}
    if isinstance(obj, list):
        return [_shuffled(v, rng) for v in obj]
    return obj


def _reserialize(args: dict, rng) -> str:
    """Same arguments, different text: shuffled keys, 1 -> 1.0, spaced separators."""
    text = json.dumps(_shuffled(args, rng), indent=rng.choice([None, 1, 2]), separators=(" , ", " :  "))
    if rng.random() < 0.5:  # integral numbers written as floats where no string is touched
        text = text.replace(": 1,", ": 1.0,").replace(":  1 ", ":  1.0 ")
    return text


def _wrong_arg(args: dict, rng) -> dict:
    if not args:
        return {"unexpected": 1}
    out = dict(args)
    key = rng.choice(list(out))
    v = out[key]
    if rng.random() < 0.25:
        del out[key]
    elif isinstance(v, bool):
        out[key] = not v
    elif isinstance(v, (int, float)):
        out[key] = v + 7
    elif isinstance(v, str):
        out[key] = v[::-1] + "x"
    else:
        out[key] = "changed"
    return out


def make_pairs(calls, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    names = sorted({c[0] for c in calls})
    pairs = []
    for i in range(n):
        name, args, tools = calls[rng.randrange(len(calls))]
        expected = json.dumps({"type": "function_call", "name": name, "arguments": json.dumps(args)})
        kind = KINDS[i % len(KINDS)]
        if kind == "reserialized":
            cand = '{"arguments": ' + _reserialize(args, rng) + f', "name": {json.dumps(name)}}}'
        elif kind == "hermes":
            cand = ("<think>the user wants this</think>\n<tool_call>\n"
                    + json.dumps({"name": name, "arguments": json.loads(_reserialize(args, rng))}) + "\n</tool_call>")
        elif kind == "wrong_arg":
            cand = "<tool_call>" + json.dumps({"name": name, "arguments": _wrong_arg(args, rng)}) + "</tool_call>"
        elif kind == "wrong_tool":
            other = rng.choice([x for x in names if x != name] or ["other"])
            cand = json.dumps({"name": other, "arguments": args})
        elif kind == "text":
            cand = rng.choice(["Sure, let me check that for you.", "Could you confirm your user id?",
                               "I have updated the reservation as requested."])
        else:
            cand = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function",
                 "function": {"name": name, "arguments": _reserialize(args, rng)}}]}
        pairs.append({"expected_action": expected, "candidate": cand, "tools": tools, "kind": kind})
    return pairs


def clear_caches() -> None:
    for fn in (parsing._prepare_text_cached, parsing._prepare_expected_text, tool_call.schema_info,
               tool_call.compiled_validator,
               tool_call._validation_error_cached, tool_call._tools_index_from_text, canonical.normalize_text,
               canonical.word_counts, string_similarity.shell_normalize):
        fn.cache_clear()


def timed(verifier, pairs) -> tuple[float, float, list]:
    """(wall seconds, CPU seconds of this process, scores) with every verifier cache cleared first."""
    clear_caches()
    t0, c0 = time.perf_counter(), time.process_time()
    scores = verifier.score_many(pairs)
    return time.perf_counter() - t0, time.process_time() - c0, scores


def calibration_us() -> float:
    """Microseconds for sum(range(1000)) here: a yardstick for how fast (or how contended) this core is."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    calls = real_calls()
    if not calls:
        sys.exit(f"no real tool calls found under {DATA}")
    pairs = make_pairs(calls, args.pairs, args.seed)
    distinct = len({json.dumps(p["candidate"], sort_keys=True) for p in pairs})
    print(f"{len(calls)} real calls ({len({c[0] for c in calls})} tools, "
          f"{sum(c[2] is not None for c in calls)} with tool schemas); {len(pairs)} pairs, "
          f"{distinct} distinct candidates\n")
    print(f"calibration: sum(range(1000)) = {calibration_us():.1f} us on this core "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
    print("| verifier | pairs | wall s | CPU s | scores/s (wall) | scores/s (CPU) | mean reward |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    results = {}
    for spec in ({"name": "tool_call"}, {"name": "tool_call", "mode": "f1"}, {"name": "exact"},
                 {"name": "string_similarity", "mode": "commands"}, {"name": "tool_name"}):
        v = build_verifier(spec)
        secs, cpu, scores = timed(v, pairs)
        results[json.dumps(spec)] = scores
        mean = sum(s.reward for s in scores) / len(scores)
        print(f"| `{json.dumps(spec)}` | {len(pairs)} | {secs:.2f} | {cpu:.2f} | {len(pairs) / secs:,.0f} | "
              f"{len(pairs) / cpu:,.0f} | {mean:.3f} |")
    # Warm caches: the profiling stage scores K samples per turn and GRPO re-scores repeats.
    v = build_verifier({"name": "tool_call"})
    v.score_many(pairs)
    t0, c0 = time.perf_counter(), time.process_time()
    v.score_many(pairs)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"| `tool_call` (warm caches, 2nd pass) | {len(pairs)} | {secs:.2f} | {cpu:.2f} | {len(pairs) / secs:,.0f} | "
          f"{len(pairs) / cpu:,.0f} | |")

    print("\n`tool_call` by candidate kind (cold caches; reward mean, top reasons):\n")
    print("| kind | n | scores/s (CPU) | mean reward | reasons |")
    print("|---|---:|---:|---:|---|")
    scores = results[json.dumps({"name": "tool_call"})]
    for kind in KINDS:
        sub = [p for p in pairs if p["kind"] == kind]
        _, cpu, _ = timed(build_verifier({"name": "tool_call"}), sub)
        ks = [s for s, p in zip(scores, pairs) if p["kind"] == kind]
        reasons = Counter(s.reason for s in ks).most_common(3)
        print(f"| {kind} | {len(ks)} | {len(sub) / cpu:,.0f} | {sum(s.reward for s in ks) / len(ks):.3f} | "
              + ", ".join(f"{r} {c}" for r, c in reasons) + " |")


if __name__ == "__main__":
    main()
