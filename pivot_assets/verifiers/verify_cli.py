"""`pivot verify`: score JSONL pairs and say why each sample got its reward.

Input lines:  {"expected_action": action, "candidate": raw text or action, "tools": [...]?, "state": [...]?,
               "domain": str?}
Output lines, one per input line, in order: {"reward": float, "reason": str, "detail": str}, or
{"error": "..."} for a line that cannot be scored (bad JSON, missing keys, malformed expert action).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, TextIO

from .llm_judge import judge_stats
from .parsing import prepare_expected
from .registry import DomainVerifiers, build_verifier

_CHUNK = 1024  # lines scored per batch: bounded memory, and a judge still sees batches


def _check_line(line: str) -> tuple[dict | None, str | None]:
    """A parsed input row, or (None, error) explaining why this line cannot be scored."""
    if not line.strip():
        return None, "empty line"
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as e:
        return None, f"invalid JSON: {str(e)[:120]}"
    if not isinstance(row, dict):
        return None, "line must be a JSON object"
    for key in ("expected_action", "candidate"):
        if key not in row:
            return None, f"missing key {key!r}"
    if row.get("domain") is not None and not isinstance(row["domain"], str):
        return None, "'domain' must be a string"
    if row.get("state") is not None and not isinstance(row["state"], list):
        return None, "'state' must be a list of messages"
    if row.get("tools") is not None and not isinstance(row["tools"], (list, str)):
        return None, "'tools' must be a list or its JSON text"
    expected, err = prepare_expected(row["expected_action"])
    if expected is None:
        return None, err
    return row, None


def verify_jsonl(in_lines: Iterable[str], out: TextIO, verifiers: DomainVerifiers,
                 verifier_name: str | None = None) -> dict:
    """Score every input line and write one output line per input line; returns counts.

    verifier_name: a registered verifier (default parameters) used for every line, overriding the domains.
    """
    override = build_verifier({"name": verifier_name}) if verifier_name else None
    counts: Counter = Counter()
    reasons: Counter = Counter()
    reward_sum = 0.0

    def flush(chunk: list[tuple[dict | None, str | None]]) -> None:
        nonlocal reward_sum
        rows = [row for row, _ in chunk if row is not None]
        scores = override.score_many(rows) if override else verifiers.score_rows(rows)
        it = iter(scores)
        for row, err in chunk:
            if row is None:
                counts["errors"] += 1
                out.write(json.dumps({"error": err}) + "\n")
                continue
            s = next(it)
            counts["scored"] += 1
            reasons[s.reason] += 1
            reward_sum += s.reward
            out.write(json.dumps({"reward": s.reward, "reason": s.reason, "detail": s.detail}) + "\n")

    chunk: list[tuple[dict | None, str | None]] = []
    for line in in_lines:
        counts["lines"] += 1
        chunk.append(_check_line(line))
        if len(chunk) >= _CHUNK:
            flush(chunk)
            chunk = []
    if chunk:
        flush(chunk)
    judges = Counter()
    for v in [override] if override else [verifiers.default, *verifiers.domains.values()]:
        judges.update(judge_stats(v))
    return {
        "lines": counts["lines"], "scored": counts["scored"], "errors": counts["errors"],
        "mean_reward": reward_sum / counts["scored"] if counts["scored"] else None,
        "reasons": dict(reasons), "judge": dict(judges),
    }


def load_verifier_section(config_path: str | None) -> dict | None:
    """The `verifier:` section of a pivot.yaml (None when no file is given or the section is absent)."""
    if not config_path:
        return None
    import yaml

    data = yaml.safe_load(Path(config_path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{config_path}: top level must be a mapping")
    return data.get("verifier")


def main(argv: list[str] | None = None) -> int:
    """`pivot verify [--config F] [--verifier NAME] --input pairs.jsonl [--output out.jsonl]`."""
    ap = argparse.ArgumentParser(prog="pivot verify", description=__doc__.split("\n")[0])
    ap.add_argument("--config", help="pivot.yaml whose `verifier:` section picks verifiers per domain")
    ap.add_argument("--verifier", help="use this verifier (default parameters) for every line")
    ap.add_argument("--input", required=True, help="JSONL pairs ('-' for stdin)")
    ap.add_argument("--output", default="-", help="JSONL verdicts ('-' for stdout)")
    args = ap.parse_args(argv)
    try:
        verifiers = DomainVerifiers(load_verifier_section(args.config))
        if args.verifier:
            build_verifier({"name": args.verifier})
    except (ValueError, OSError) as e:
        print(f"pivot verify: {e}", file=sys.stderr)
        return 2
    src = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8", errors="surrogateescape")
    dst = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8", errors="surrogatepass")
    try:
        counts = verify_jsonl(src, dst, verifiers, args.verifier)
    finally:
        if src is not sys.stdin:
            src.close()
        if dst is not sys.stdout:
            dst.close()
    print(json.dumps(counts), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
