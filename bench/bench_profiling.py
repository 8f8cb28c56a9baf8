"""Profiling throughput: the transformers backend vs the naive way, on the same tau2-bench airline turns.

Naive = one `model.generate(num_return_sequences=K)` per turn: every prompt prefilled K times, no
reuse across the turns of a trajectory. Ours = TransformersBackend: each prompt prefilled once,
the prefix shared with the previous turn reused, many turns x K rows decoded per step.

Prints the config and a markdown table: wall time, prefill tokens computed vs the trajectories'
unique prefix tokens, generated tokens, and the FLOP floor (2 * params * tokens / measured GFLOP/s).
Also checks bf16 vs fp32 agreement on one prompt's next-token distribution.

    .venv/bin/python bench/bench_profiling.py [--trajectories 2 --turns 5 --k 4 --max-new-tokens 16]
    .venv/bin/python bench/bench_profiling.py --trajectories 3 --turns 0 --k 8 --max-new-tokens 64 --skip-naive

--vllm (needs `make setup-vllm`): the engines side by side in one run on the same turns, written into
bench/RESULTS_profiling.md (its "vLLM side by side" section): the transformers backend, `pivot run` with
`policy.backend: vllm` (vLLM in the pipeline's process), and raw `vllm.LLM.generate` on the same prompt token ids
with the same sampling parameters (the floor). The turns are the pipeline's own: a project ingests the first
--trajectories airline simulations cut after their --turns-th assistant message, and every engine gets the
GenerationRequests built from that warehouse.

    .venv/bin/python bench/bench_profiling.py --vllm [--trajectories 2 --turns 5 --k 4 --max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from pivot_assets.core.ids import turn_id  # noqa: E402
from pivot_assets.policies.base import GenerationRequest, SamplingConfig  # noqa: E402
from pivot_assets.policies.transformers_backend import (  # noqa: E402
    TransformersBackend,
    common_prefix_len,
)

DATA = REPO.parent / "shared" / "data" / "tau2-bench" / "airline_run1.json"


def load_turns(n_traj: int, n_turns: int) -> list[GenerationRequest]:
    """First `n_turns` assistant turns (0: all) of the first `n_traj` trajectories that have that many."""
    import json

    from tests.ingest.reference import iter_ingest

    requests = []
    for kind, row in iter_ingest([{"path": str(DATA), "format": "tau2"}]):
        if kind != "trajectory":
            continue
        msgs, tools = row["messages"], json.loads(row["tools"])
        idx = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        if len(idx) < max(n_turns, 1):
            continue
        tid = row["trajectory_id"]
        requests += [GenerationRequest(turn_id(tid, i), tid, i, msgs[:i], tools) for i in idx[: n_turns or None]]
        if len({r.trajectory_id for r in requests}) == n_traj:
            break
    return requests


def unique_prefix_tokens(backend: TransformersBackend, requests: list[GenerationRequest]) -> tuple[int, int]:
    """(sum of per-turn prompt tokens, tokens of the trie of each trajectory's prompts)."""
    total = unique = 0
    prev: dict[str, list[int]] = {}
    for r in sorted(requests, key=lambda r: (r.trajectory_id, r.message_index)):
        ids = backend.prompt_ids(r)
        total += len(ids)
        unique += len(ids) - common_prefix_len(prev.get(r.trajectory_id, []), ids)
        prev[r.trajectory_id] = ids
    return total, unique


def matmul_gflops(dtype: torch.dtype, n: int = 1024, reps: int = 8) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def run_ours(model_dir: str, dtype: str, requests, sampling) -> dict:
    backend = TransformersBackend(model=model_dir, dtype=dtype, batch_size=64)
    start = time.perf_counter()
    n = sum(len(b) for b in backend.generate(requests, sampling))
    wall = time.perf_counter() - start
    return {"wall_s": wall, "samples": n, "prefill": backend.stats["prefill_tokens_computed"],
            "generated": backend.stats["generated_tokens"], "backend": backend}


def run_naive(backend: TransformersBackend, requests, sampling) -> dict:
    model, tok = backend.model, backend.tokenizer
    torch.manual_seed(sampling.seed)
    prefill = generated = n = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for r in requests:
            ids = torch.tensor([backend.prompt_ids(r)])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=sampling.temperature,
                                 top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens,
                                 num_return_sequences=sampling.k, pad_token_id=tok.pad_token_id)
            prefill += sampling.k * ids.shape[1]
            new = out[:, ids.shape[1]:]
            # tokens up to and including the first stop token, per row
            for row in new.tolist():
                stop = next((i for i, t in enumerate(row) if t in backend.stop_ids), len(row) - 1)
                generated += stop + 1
            n += new.shape[0]
    return {"wall_s": time.perf_counter() - start, "samples": n, "prefill": prefill, "generated": generated}


def bf16_agreement(model_dir: str, backend32: TransformersBackend, request) -> str:
    """Next-token distributions of one prompt in fp32 vs bf16: max |dlogit|, KL, top-1 agreement."""
    from pivot_assets.policies.models import load_model

    model16, _ = load_model(model_dir, dtype="bfloat16")
    ids = torch.tensor([backend32.prompt_ids(request)])
    with torch.inference_mode():
        l32 = backend32.model(input_ids=ids, logits_to_keep=8).logits[0].float()
        l16 = model16(input_ids=ids, logits_to_keep=8).logits[0].float()
    p32, lp16 = torch.log_softmax(l32, -1), torch.log_softmax(l16, -1)
    kl = (p32.exp() * (p32 - lp16)).sum(-1)
    top1 = (l32.argmax(-1) == l16.argmax(-1)).float().mean().item()
    return (f"bf16 vs fp32 on the last 8 positions of a {ids.shape[1]}-token prompt: max |dlogit| "
            f"{(l32 - l16).abs().max().item():.3f}, mean KL {kl.mean().item():.4f} nats, top-1 agreement {top1:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=2)
    ap.add_argument("--turns", type=int, default=5, help="first N turns per trajectory (0: all)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--skip-bf16", action="store_true")
    ap.add_argument("--skip-naive", action="store_true", help="only our backend (throughput on bigger runs)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for every run (1: see TransformersBackend)")
    ap.add_argument("--vllm", action="store_true", help="transformers vs vLLM through `pivot run` vs raw vLLM")
    ap.add_argument("--dtype", default="float32", help="--vllm: the dtype of every engine (auto: bf16 where native)")
    ap.add_argument("--compile", action="store_true", help="--vllm: let vLLM torch.compile (default: enforce_eager)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not DATA.is_file():
        sys.exit(f"shared data missing: {DATA}")
    if args.vllm:
        return engines_side_by_side(args)
    from pivot_assets.policies.models import ensure_embedded_hf_dir

    model_dir = str(ensure_embedded_hf_dir())
    sampling = SamplingConfig(k=args.k, temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    requests = load_turns(args.trajectories, args.turns)
    print(f"config: {args.trajectories} tau2 airline trajectories x first {args.turns} turns = {len(requests)} turns, "
          f"K={args.k}, max_new_tokens={args.max_new_tokens}, temperature=1.0, torch threads={torch.get_num_threads()}, "
          f"load avg {os.getloadavg()[0]:.1f}")
    gf32, gf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    ours = run_ours(model_dir, "float32", requests, sampling)
    backend = ours.pop("backend")
    params = sum(p.numel() for p in backend.model.parameters())
    total, unique = unique_prefix_tokens(backend, requests)
    rows = [("ours fp32", ours)]
    if not args.skip_bf16:
        bf = run_ours(model_dir, "bfloat16", requests, sampling)
        bf.pop("backend")
        rows.append(("ours bf16", bf))
    naive = None if args.skip_naive else run_naive(backend, requests, sampling)
    if naive:
        rows.append(("naive generate fp32", naive))
    print(f"\nmatmul: fp32 {gf32:.0f} GFLOP/s, bf16 {gf16:.0f} GFLOP/s (1024^3, measured now); params {params / 1e6:.1f}M")
    print(f"prompt tokens: summed per turn {total}, unique prefix tokens {unique} ({total / unique:.1f}x)\n")
    print("| run | wall s | samples | samples/s | prefill tokens | prefill / unique | generated tokens | FLOP floor s | x faster than naive |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        gflops = gf16 if "bf16" in name else gf32
        floor = 2 * params * (r["prefill"] + r["generated"]) / (gflops * 1e9)
        speedup = f"{naive['wall_s'] / r['wall_s']:.1f}" if naive else "-"
        print(f"| {name} | {r['wall_s']:.1f} | {r['samples']} | {r['samples'] / r['wall_s']:.2f} | {r['prefill']} | "
              f"{r['prefill'] / unique:.2f} | {r['generated']} | {floor:.1f} | {speedup} |")
    print()
    print(bf16_agreement(model_dir, backend, requests[-1]))



# -- --vllm: the engines side by side --------------------------------------------------------------------------
RESULTS = REPO / "bench" / "RESULTS_profiling.md"
SECTION_START, SECTION_END = "<!-- vllm-side-by-side -->", "<!-- /vllm-side-by-side -->"


def write_subset(path: Path, n_traj: int, n_turns: int) -> None:
    """The first n_traj airline simulations, each cut after its n_turns-th assistant message (0: whole)."""
    results = json.loads(DATA.read_text())
    sims = []
    for sim in results["simulations"][:n_traj]:
        roles = [m.get("role") for m in sim["messages"]]
        at = [i for i, r in enumerate(roles) if r == "assistant"]
        cut = at[n_turns - 1] + 1 if n_turns and len(at) >= n_turns else len(roles)
        sims.append({**sim, "messages": sim["messages"][:cut]})
    path.write_text(json.dumps({**results, "simulations": sims}))


def pivot_cli(root: Path, *argv: str) -> float:
    env = {**os.environ, "DAGSTER_HOME": str(root / "home")}
    env.pop("PIVOT_CONFIG", None)
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "pivot"), *argv], cwd=root, env=env, capture_output=True,
                          text=True)
    if proc.returncode:
        sys.exit(f"pivot {' '.join(argv)} failed: {proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def rollouts_metadata(root: Path) -> dict:
    os.environ["DAGSTER_HOME"] = str(root / "home")
    import dagster as dg

    record = dg.DagsterInstance.get().fetch_materializations(dg.AssetKey("rollouts"), limit=1).records[0]
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


def run_raw_vllm(backend_args: dict, prompt_ids: list[list[int]], requests, sampling) -> dict:
    """The floor: one vllm.LLM.generate over every prompt, the backend's own SamplingParams (the same seeds, stops
    and n), no rendering, no Parquet, no pipeline."""
    from pivot_assets.policies.openai_backend import request_seed
    from pivot_assets.policies.vllm_backend import VLLMBackend

    engine = VLLMBackend(**backend_args)
    params = [engine.sampling_params(sampling, sampling.k, request_seed(sampling.seed, r.turn_id)) for r in requests]
    before = engine._engine_counters()
    t0 = time.perf_counter()
    outputs = engine.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling_params=params, use_tqdm=False)
    wall = time.perf_counter() - t0
    after = engine._engine_counters()
    engine.close()
    return {"wall_s": wall, "samples": sum(len(o.outputs) for o in outputs),
            "prefill": int((after["submitted"] - before["submitted"]) - (after["cached"] - before["cached"])),
            "generated": sum(len(c.token_ids) for o in outputs for c in o.outputs)}


def engines_side_by_side(args) -> None:
    from pivot_assets.core.config import load_config
    from pivot_assets.core.engines import missing
    from pivot_assets.core.hardware import describe_cpu, resolve_dtype
    from pivot_assets.core.warehouse import Warehouse
    from pivot_assets.policies.base import SamplingConfig
    from pivot_assets.profiling.profiler import generation_requests, select_turns

    if missing("vllm"):
        sys.exit(missing("vllm"))
    load_start = os.getloadavg()
    dtype = resolve_dtype(args.dtype, "cpu").dtype
    engine_args = {"kv_cache_memory_bytes": 2 << 30, "max_model_len": 8192, **({} if args.compile else {"enforce_eager": True})}
    root = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    write_subset(root / "airline.json", args.trajectories, args.turns)
    (root / "home").mkdir()
    (root / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # one engine call for every turn, as the raw floor makes: batch_size >= turns x K
    (root / "pivot.yaml").write_text(json.dumps({
        "warehouse": "./wh", "inputs": [{"path": str(root / "airline.json"), "format": "tau2"}],
        "policy": {"backend": "vllm", "model": "embedded", "dtype": dtype, "k": args.k, "temperature": 1.0, "top_p": 1.0,
                   "max_new_tokens": args.max_new_tokens, "seed": 0, "batch_size": 100_000, "engine_args": engine_args},
        "runtime": {"threads": args.threads}}))
    ingest_s = pivot_cli(root, "run", "--select", "trajectories,turns")
    cfg = load_config(root / "pivot.yaml")
    wh = Warehouse(cfg.warehouse_dir)
    requests = generation_requests(wh, select_turns(wh, None))
    sampling = SamplingConfig.from_policy(cfg.policy)
    print(f"config: {args.trajectories} tau2 airline trajectories cut after {args.turns or 'all'} assistant turns = "
          f"{len(requests)} turns, K={args.k}, max_new_tokens={args.max_new_tokens}, {dtype}, "
          f"vLLM {'compiled' if args.compile else 'eager'}, threads {args.threads}; load avg {load_start[0]:.1f}")

    ours = run_ours("embedded", dtype, requests, sampling)
    backend = ours.pop("backend")
    total, unique = unique_prefix_tokens(backend, requests)
    prompt_ids = [backend.prompt_ids(r) for r in requests]
    del backend
    raw = run_raw_vllm({"model": "embedded", "dtype": dtype, "threads": args.threads, "engine_args": engine_args},
                       prompt_ids, requests, sampling)
    run_s = pivot_cli(root, "run", "--select", "rollouts")
    meta = rollouts_metadata(root)
    piped = {"wall_s": meta["generation_s"], "samples": meta["rollouts_generated"],
             "prefill": meta["prefill_tokens_computed"], "generated": meta["generated_tokens"]}
    load_end = os.getloadavg()
    rows = [("transformers backend", ours), ("vLLM through `pivot run`", piped), ("raw `vllm.LLM.generate` (floor)", raw)]
    lines = [
        f"`.venv/bin/python bench/bench_profiling.py --vllm --trajectories {args.trajectories} --turns {args.turns} "
        f"--k {args.k} --max-new-tokens {args.max_new_tokens} --dtype {args.dtype}{' --compile' if args.compile else ''}`",
        "",
        f"{len(requests)} turns ({args.trajectories} tau2 airline trajectories cut after {args.turns or 'all'} assistant "
        f"turns), K={args.k}, max_new_tokens={args.max_new_tokens}, temperature 1.0, {dtype}; vLLM "
        f"{'with torch.compile' if args.compile else 'eager'}, {args.threads} engine-core thread(s); vllm "
        f"{_version('vllm')}, transformers {_version('transformers')}. {describe_cpu()}. Load average "
        f"{load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end (a shared machine: other jobs ran).",
        f"Prompt tokens summed per turn {total:,}; unique prefix tokens (the trie of each trajectory's prompts) {unique:,}.",
        "",
        "| engine | samples | generation s | samples/s | x raw vLLM | prefill tokens computed | prefill / unique | generated tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        rate = r["samples"] / r["wall_s"]
        lines.append(f"| {name} | {r['samples']} | {r['wall_s']:.1f} | {rate:.2f} | "
                     f"{rate / (raw['samples'] / raw['wall_s']):.2f} | {r['prefill']:,} | {r['prefill'] / unique:.2f} | "
                     f"{r['generated']:,} |")
    lines += ["", f"`pivot run --select rollouts` end to end (process start, Dagster, engine load, generation, parts): "
                  f"{run_s:.1f} s; its generation alone {meta['generation_s']:.1f} s. Ingest {ingest_s:.1f} s."]
    text = "\n".join(lines)
    print("\n" + text)
    write_section(text)


def _version(package: str) -> str:
    import importlib

    return importlib.import_module(package).__version__


def write_section(text: str) -> None:
    """Replace the side-by-side section of RESULTS_profiling.md (appended the first time)."""
    body = RESULTS.read_text() if RESULTS.is_file() else ""
    block = f"{SECTION_START}\n{text}\n{SECTION_END}"
    if SECTION_START in body:
        head, rest = body.split(SECTION_START, 1)
        body = head + block + rest.split(SECTION_END, 1)[1]
    else:
        body = body.rstrip() + "\n\n## vLLM side by side (latest `--vllm` run, written by the bench)\n\n" + block + "\n"
    RESULTS.write_text(body)
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
