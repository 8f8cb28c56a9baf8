"""One vLLM engine for checkpoints scored in turn vs an engine per checkpoint (evaluation's EngineSlot).

For each checkpoint given (default: the embedded policy, then itself again: the engine is kept): an engine started
on it (wall seconds of the start) draws a fixed set of seeded samples; then ONE engine goes through the checkpoints
in turn, each loaded into its running weights (policies/factory.EngineSlot, vLLM's in-place reload and an emptied
prefix cache), and draws the same samples. The table: start vs reload seconds, and whether each reloaded draw is
the started engine's draw, sample for sample. Checkpoints of different families get engines of their own (the
slot's `starts` column says so).

    .venv/bin/python bench/bench_engine_reload.py --models DIR_A DIR_B [...] --out bench/RESULTS_engine_reload.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pivot_assets.core.hardware import describe_cpu  # noqa: E402
from pivot_assets.policies.base import GenerationRequest, SamplingConfig  # noqa: E402
from pivot_assets.policies.factory import EngineSlot  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}, "required": ["city"]}}}]
CITIES = ("Paris", "Lima", "Oslo", "Hanoi", "Accra", "Quito", "Perth", "Riga")


def requests() -> list[GenerationRequest]:
    return [GenerationRequest(f"t{i}", f"T{i}", 1, [{"role": "user", "content": f"What is the weather in {c}?"}], TOOLS)
            for i, c in enumerate(CITIES)]


def draw(engine, sampling: SamplingConfig) -> dict:
    rows = {r.turn_id: [(i, 1000 + i) for i in range(sampling.k)] for r in requests()}
    return {(s.turn_id, s.sample_index): s.completion
            for batch in engine.generate(requests(), sampling, rows=rows) for s in batch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["embedded", "embedded"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(REPO / "bench" / "RESULTS_engine_reload.md"))
    args = ap.parse_args()
    policy = {"backend": "vllm", "dtype": args.dtype}
    sampling = SamplingConfig(k=args.k, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    load_start = os.getloadavg()

    started: list[tuple[float, dict]] = []
    for model in args.models:  # an engine per checkpoint: the baseline
        t0 = time.perf_counter()
        with EngineSlot(policy, threads=1) as slot:
            engine = slot.engine_for(model)
            start_s = time.perf_counter() - t0
            started.append((start_s, draw(engine, sampling)))
        print(f"{model}: engine started in {start_s:.1f} s", flush=True)

    rows = []
    with EngineSlot(policy, threads=1) as slot:  # one engine through the checkpoints in turn
        for i, model in enumerate(args.models):
            before = (slot.starts, slot.reloads)
            t0 = time.perf_counter()
            engine = slot.engine_for(model)
            switch_s = time.perf_counter() - t0
            same = draw(engine, sampling) == started[i][1]
            how = "start" if slot.starts > before[0] else "reload" if slot.reloads > before[1] else "kept"
            rows.append((model, started[i][0], how, switch_s, same))
            print(f"{model}: {how} in {switch_s:.1f} s, draw equal to its own engine's: {same}", flush=True)
        starts, reloads = slot.starts, slot.reloads

    load_end = os.getloadavg()
    lines = ["# One engine for checkpoints in turn (bench/bench_engine_reload.py)", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU: {describe_cpu()}; {os.cpu_count()} cores; "
             f"vLLM's CPU build, dtype {args.dtype}, one engine core thread. Load average at start "
             f"{load_start[0]:.2f} / {load_start[1]:.2f}, at end {load_end[0]:.2f} / {load_end[1]:.2f} (the machine "
             "was shared: these are wall seconds).", "",
             f"Command: `{' '.join(['.venv/bin/python', *sys.argv])}`", "",
             f"Each draw: {len(CITIES)} prompts x K={args.k}, {args.max_new_tokens} new tokens, a seed per sample.", "",
             "| checkpoint | own engine: start (s) | one engine: how | one engine: seconds | draw equal |",
             "|---|---|---|---|---|"]
    lines += [f"| `{Path(m).name if '/' in m else m}` | {s:.1f} | {how} | {w:.1f} | {same} |"
              for m, s, how, w, same in rows]
    lines += ["", f"One engine: {starts} start(s), {reloads} reload(s) for {len(args.models)} checkpoints; "
              f"an engine per checkpoint: {len(args.models)} starts, {sum(s for _, s, *_ in rows):.0f} s of starts."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
