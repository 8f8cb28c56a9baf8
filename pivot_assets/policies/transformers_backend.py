"""Local transformers backend (CPU by default): the embedded SmolLM2 policy or any local HF model dir.

Where the time goes, and what this backend does about it:
- Prefill. A turn's prompt is a prefix of the next turn's prompt in the same trajectory, so the
  backend keeps the KV cache of the last prompt of the current trajectory and prefills only the new
  suffix (the longest common token prefix is reused, then the cache is cropped there). Each prompt is
  prefilled once for all its K samples (the prompt KV is copied into K decode rows), never K times.
- Decode. Small models are bound by per-step overhead, not FLOPs, so many sequences (turns x K) are
  decoded per forward step, in our own loop: left-padded prompt KV in a preallocated buffer (appended
  in place, no torch.cat of the whole cache per step), a 4D padding mask, rows stopped at EOS /
  <|im_end|> and compacted away, sampling in torch.
- Determinism. Every turn has its own torch.Generator seeded from (seed, turn_id): its samples do not
  depend on the other turns of its batch beyond floating-point noise. With `rows` (the Ray engine's per-sample
  seeding) every decode row has its own generator, seeded from (its sample's seed, turn_id) exactly as a K=1
  call under that seed would be: the K rows of a turn share one prefill and one decode loop, and draw what K
  separate single-sample calls would draw.
- The expert action's likelihood (a request with `expert`): after the prompt's prefill, the expert's assistant
  message is run through the model on the same cache (teacher forcing, no decoding) and its tokens' log-probs are
  summed. The cache then holds prompt + action, which the trajectory's next turn reuses as its prefix: the action's
  tokens are prefilled once, as they would be for that next turn anyway.
- Device. The model, the KV buffers, every index/mask tensor of the decode loop and the generators live on
  `device` (cpu | cuda | cuda:N): nothing crosses devices per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import torch

from pivot_assets.core.ids import seeded_int

from .base import (ActionLikelihood, GenerationRequest, Sample, SampleBatch, SamplingConfig, new_stats,
                   order_by_trajectory)
from .models import (PromptFormat, cache_keyword, decode_completion, expert_action_ids, load_model,
                     policy_fingerprint, render_prompt, stop_token_ids)
from .thinking import ThoughtBudget, apply_thinking, opens_thought

PREFILL_CHUNK = 2048  # tokens per prefill forward: bounds the attention scratch memory on long prompts
RowSeeds = dict[str, list[tuple[int, int]]]  # turn_id -> [(sample_index, seed), ...]: one decode row each


def turn_generator(seed: int, turn_id: str, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator on `device` seeded by (seed, turn_id): a turn's samples are reproducible on their own.

    torch.multinomial needs the generator on the device of the probabilities it samples from."""
    return torch.Generator(device=device).manual_seed(seeded_int(seed, turn_id))


def filter_logits(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Temperature-scaled logits with the top-p tail set to -inf (rows are independent)."""
    logits = logits.float() / temperature
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def sample_rows(logits: torch.Tensor, groups: list[tuple[torch.Generator, torch.Tensor]], sampling: SamplingConfig) -> torch.Tensor:
    """Next token per row. `groups`: (generator, row indices) per turn; greedy when temperature == 0."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits, sampling.temperature, sampling.top_p), dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for gen, rows in groups:
        out[rows] = torch.multinomial(probs[rows], 1, generator=gen).squeeze(-1)
    return out


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _buffer_layer_class():
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """One layer's KV over a preallocated [rows, heads, capacity, dim] buffer; decode appends in place
        (DynamicLayer would torch.cat the whole cache every step)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
            super().__init__()
            self.kbuf, self.vbuf, self.n = keys, values, length
            self.device = keys.device
            self.is_initialized = True
            self._refresh()

        def _refresh(self) -> None:
            self.keys, self.values = self.kbuf[:, :, : self.n], self.vbuf[:, :, : self.n]

        def update(self, key_states, value_states, *args, **kwargs):
            t = key_states.shape[-2]
            self.kbuf[:, :, self.n : self.n + t] = key_states
            self.vbuf[:, :, self.n : self.n + t] = value_states
            self.n += t
            self._refresh()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.n

        def select_rows(self, rows: torch.Tensor) -> None:
            self.kbuf, self.vbuf = self.kbuf[rows], self.vbuf[rows]
            self._refresh()

    return BufferLayer


@dataclass
class _Prefilled:
    request: GenerationRequest
    n_prompt: int
    opens_thought: bool  # the rendered prompt ends inside an opened <think> (the template opened it)
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, heads, n_prompt, dim]
    last_logits: torch.Tensor  # [vocab]
    likelihood: ActionLikelihood | None = None  # of the request's expert action, when it carried one


class PromptCache:
    """Prompt KV and last logits of turns, kept across `generate` calls within a byte budget, least recently used
    out first: a turn sampled again in a later adaptive round skips its prefill (re-prefilling every round made
    adaptive profiling slower than exhaustive on this backend)."""

    def __init__(self, budget_bytes: int):
        from collections import OrderedDict

        self.budget, self.used = budget_bytes, 0
        self._entries: OrderedDict = OrderedDict()  # turn_id -> (ids, kv, last_logits, bytes)

    def get(self, turn_id: str, ids: list[int]):
        entry = self._entries.get(turn_id)
        if entry is None or entry[0] != ids:
            return None
        self._entries.move_to_end(turn_id)
        return entry[1], entry[2]

    def put(self, turn_id: str, ids: list[int], kv, last_logits: torch.Tensor) -> None:
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if self.budget <= 0 or size > self.budget:
            return
        if turn_id in self._entries:
            self.used -= self._entries.pop(turn_id)[3]
        # own copies: the views a prefill returns would keep the whole trajectory's cache alive
        kv = [(k.clone(), v.clone()) for k, v in kv]
        self._entries[turn_id] = (list(ids), kv, last_logits, size)
        self.used += size
        while self.used > self.budget:
            self.used -= self._entries.popitem(last=False)[1][3]


class TransformersBackend:
    """K samples per turn from a local causal LM with prompt-prefix reuse and batched decode.

    batch_size: most decode rows (turns x K) per forward step. kv_budget_gb: most memory for the
    decode KV buffer (rows x (longest prompt + max_new_tokens)); a batch holds at least one turn.
    prompt_cache_gb: memory for prompts kept across calls (PromptCache; 0: none), for a caller that samples the
    same turns again (adaptive rounds).
    """

    def __init__(self, model: str = "embedded", dtype: str = "float32", batch_size: int = 32,
                 kv_budget_gb: float = 4.0, device: str = "cpu", fmt: PromptFormat = PromptFormat(),
                 thinking_budget: int | None = None, prompt_cache_gb: float = 0.0):
        self.model_name = model
        self.model, self.tokenizer = load_model(model, dtype=dtype, device=device, fmt=fmt)
        self.device = torch.device(device)
        self.fmt, self.thinking_budget = fmt, thinking_budget
        self.batch_size = batch_size
        self.kv_budget_bytes = kv_budget_gb * (1 << 30)
        self.fingerprint = policy_fingerprint(model, fmt)
        self.stats = new_stats()
        self.stats["thoughts_forced_closed"] = 0
        self.stats["expert_tokens_scored"] = 0  # teacher-forced expert-action tokens (ActionLikelihood)
        self.stats["experts_unscorable"] = 0  # expert messages the template does not render after the prompt
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        self.cache_kw = cache_keyword(self.model)
        self._traj_id: str | None = None
        self._traj_ids: list[int] = []
        self._traj_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.prompts = PromptCache(int(prompt_cache_gb * (1 << 30)))
        self.stats["prompt_cache_hits"] = 0  # turns whose whole prefill a previous call's kept prompt served

    # ---- setup -----------------------------------------------------------------------------------
    def _kv_bytes_per_token_row(self) -> int:
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        itemsize = next(self.model.parameters()).element_size()
        return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * itemsize

    def prompt_text(self, request: GenerationRequest) -> str:
        return render_prompt(self.tokenizer, request.messages, request.tools)

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """Token ids of a turn's rendered prompt (no extra BOS: the template carries its own markers)."""
        return self.tokenizer(self.prompt_text(request), add_special_tokens=False)["input_ids"]

    def expert_action_ids(self, request: GenerationRequest, prompt_text: str) -> list[int] | None:
        ids = expert_action_ids(self.tokenizer, request, prompt_text, self.stop_ids)
        self.stats["experts_unscorable"] += int(request.expert is not None and ids is None)
        return ids

    # ---- public ----------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig,
                 rows: RowSeeds | None = None) -> Iterator[list[Sample]]:
        """Yield all K samples of each batch of turns (turns of a trajectory kept together, in order), as a
        SampleBatch with the likelihoods of the requests' expert actions.

        `rows`: turn_id -> [(sample_index, seed), ...]: instead of K samples from one generator per turn, one
        sample per listed row, each from its own generator seeded by (seed, turn_id)."""
        ordered = order_by_trajectory(requests)
        start = time.perf_counter()  # wall_s counts our work (rendering included), not the caller's between yields
        for batch in self._batches(ordered, sampling, rows):
            with torch.inference_mode():
                prefilled = [self.prefill(req, ids, opened, action, sampling.temperature)
                             for req, ids, opened, action in batch]
                samples = self._decode(prefilled, sampling, rows)
            self.stats["wall_s"] += time.perf_counter() - start
            yield SampleBatch(samples, [p.likelihood for p in prefilled if p.likelihood is not None])
            start = time.perf_counter()
        self._reset_trajectory()

    def _batches(self, ordered: list[GenerationRequest], sampling: SamplingConfig, rows: RowSeeds | None = None):
        row_bytes = self._kv_bytes_per_token_row()
        batch: list[tuple[GenerationRequest, list[int], bool, list[int] | None]] = []
        longest = n_rows = 0
        for req in ordered:
            text = self.prompt_text(req)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            k = len(rows[req.turn_id]) if rows is not None else sampling.k
            need = (n_rows + k) * (max(longest, len(ids)) + sampling.max_new_tokens) * row_bytes
            if batch and (n_rows + k > self.batch_size or need > self.kv_budget_bytes):
                yield batch
                batch, longest, n_rows = [], 0, 0
            batch.append((req, ids, opens_thought(text), self.expert_action_ids(req, text)))
            longest, n_rows = max(longest, len(ids)), n_rows + k
        if batch:
            yield batch

    # ---- prefill with prefix reuse -----------------------------------------------------------------
    def _reset_trajectory(self) -> None:
        self._traj_id, self._traj_ids, self._traj_kv = None, [], None

    def prefill(self, request: GenerationRequest, ids: list[int], opened: bool = False,
                action: list[int] | None = None, temperature: float = 1.0) -> _Prefilled:
        """Prompt KV and last-position logits of one turn, prefilling only what the cache lacks; with `action`
        (the expert action's ids), its teacher-forced likelihood too (the cache then also holds the action)."""
        if not ids:
            raise ValueError(f"turn {request.turn_id}: empty prompt")
        kept = None if action else self.prompts.get(request.turn_id, ids)
        if kept is not None:
            kv, last_logits = kept
            self._traj_id, self._traj_ids, self._traj_kv = request.trajectory_id, list(ids), kv
            self.stats["turns"] += 1
            self.stats["prompt_tokens_total"] += len(ids)
            self.stats["cache_hits"] += 1
            self.stats["prompt_cache_hits"] += 1
            return _Prefilled(request, len(ids), opened, kv, last_logits, None)
        if request.trajectory_id != self._traj_id:
            self._reset_trajectory()
        # keep >= 1 token to run: the last position's logits are needed even for a fully cached prompt
        reuse = min(common_prefix_len(self._traj_ids, ids), len(ids) - 1)
        kv = [(k[:, :, :reuse], v[:, :, :reuse]) for k, v in self._traj_kv] if reuse and self._traj_kv else None
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
        suffix = torch.tensor([ids[reuse:]], dtype=torch.long, device=self.device)
        for start in range(0, suffix.shape[1], PREFILL_CHUNK):
            out = self.model(input_ids=suffix[:, start : start + PREFILL_CHUNK], **{self.cache_kw: cache},
                             use_cache=True, logits_to_keep=1)
        last_logits = out.logits[0, -1].float()
        likelihood = None
        if action:
            likelihood = self._teacher_force(request.turn_id, cache, last_logits, action, temperature)
        self._traj_id, self._traj_ids = request.trajectory_id, list(ids) + list(action or [])
        self._traj_kv = [(layer.keys, layer.values) for layer in cache.layers]
        n = len(ids)
        self.stats["turns"] += 1
        self.stats["prompt_tokens_total"] += n
        self.stats["prefill_tokens_computed"] += n - reuse + len(action or [])
        self.stats["cache_hits"] += int(reuse > 0)
        prompt_kv = [(k[:, :, :n], v[:, :, :n]) for k, v in self._traj_kv] if action else self._traj_kv
        self.prompts.put(request.turn_id, ids, prompt_kv, last_logits)
        return _Prefilled(request, n, opened, prompt_kv, last_logits, likelihood)

    def _teacher_force(self, turn_id: str, cache, last_logits: torch.Tensor, action: list[int],
                       temperature: float) -> ActionLikelihood:
        """Sum of log p(action[j] | prompt, action[:j]) at the sampling temperature, the action run through the
        model on the prompt's cache (which it extends): position j-1's logits score token j."""
        scale = temperature if temperature > 0 else 1.0
        ids = torch.tensor([action], dtype=torch.long, device=self.device)
        total, previous = 0.0, last_logits[None]
        for start in range(0, len(action), PREFILL_CHUNK):
            chunk = ids[:, start : start + PREFILL_CHUNK]
            logits = self.model(input_ids=chunk, **{self.cache_kw: cache}, use_cache=True).logits[0].float()
            scoring = torch.cat([previous, logits[:-1]])  # the logits that predict each token of the chunk
            total += torch.log_softmax(scoring / scale, dim=-1).gather(-1, chunk[0, :, None]).sum().item()
            previous = logits[-1:]
        self.stats["expert_tokens_scored"] += len(action)
        return ActionLikelihood(turn_id=turn_id, logprob=total, n_tokens=len(action))

    # ---- batched decode ----------------------------------------------------------------------------
    def _decode_cache(self, prefilled: list[_Prefilled], counts: list[int], capacity: int):
        from transformers.cache_utils import Cache

        longest = max(p.n_prompt for p in prefilled)
        starts = [sum(counts[:j]) for j in range(len(counts))]
        buffer_layer = _buffer_layer_class()
        layers = []
        for li in range(len(prefilled[0].kv)):
            k0 = prefilled[0].kv[li][0]
            shape = (sum(counts), k0.shape[1], capacity, k0.shape[3])
            kbuf = torch.zeros(shape, dtype=k0.dtype, device=k0.device)
            vbuf = torch.zeros(shape, dtype=k0.dtype, device=k0.device)
            for j, p in enumerate(prefilled):  # left-pad: every prompt ends at position `longest`
                kk, vv = p.kv[li]
                kbuf[starts[j] : starts[j] + counts[j], :, longest - p.n_prompt : longest] = kk
                vbuf[starts[j] : starts[j] + counts[j], :, longest - p.n_prompt : longest] = vv
            layers.append(buffer_layer(kbuf, vbuf, longest))
        return Cache(layers=layers), longest

    def _row_plan(self, prefilled: list[_Prefilled], sampling: SamplingConfig, rows: RowSeeds | None):
        """Rows per turn, each row's sample index, the generators and each row's generator (group): K rows and one
        generator per turn, or with `rows` the listed samples, one generator each."""
        dev = self.device
        if rows is None:
            counts = [sampling.k] * len(prefilled)
            indices = [i for _ in prefilled for i in range(sampling.k)]
            gens = [turn_generator(sampling.seed, p.request.turn_id, dev) for p in prefilled]
            group_of_row = torch.arange(len(prefilled), device=dev).repeat_interleave(sampling.k)
        else:
            plan = [rows[p.request.turn_id] for p in prefilled]
            counts = [len(r) for r in plan]
            indices = [i for r in plan for i, _ in r]
            gens = [turn_generator(seed, p.request.turn_id, dev) for p, r in zip(prefilled, plan) for _, seed in r]
            group_of_row = torch.arange(len(gens), device=dev)
        return counts, indices, gens, group_of_row

    def _decode(self, prefilled: list[_Prefilled], sampling: SamplingConfig, rows: RowSeeds | None = None) -> list[Sample]:
        max_new = sampling.max_new_tokens
        counts, indices, gens, group_of_row = self._row_plan(prefilled, sampling, rows)
        n_rows = len(indices)
        cache, longest = self._decode_cache(prefilled, counts, max(p.n_prompt for p in prefilled) + max_new)
        dev = self.device
        per_row = torch.tensor(counts, device=dev)
        valid = torch.zeros(n_rows, longest + max_new, dtype=torch.bool, device=dev)
        start = 0
        for p, c in zip(prefilled, counts):
            valid[start : start + c, longest - p.n_prompt :] = True
            start += c
        positions = torch.tensor([p.n_prompt for p in prefilled], device=dev).repeat_interleave(per_row)
        budget = (ThoughtBudget(self.tokenizer, self.thinking_budget,
                                [p.opens_thought for p, c in zip(prefilled, counts) for _ in range(c)])
                  if self.thinking_budget else None)
        tokens: list[list[int]] = [[] for _ in range(n_rows)]
        stopped = [False] * n_rows
        active = torch.arange(n_rows, device=dev)  # original row index of each live buffer row
        logits = torch.stack([p.last_logits for p in prefilled]).repeat_interleave(per_row, dim=0)
        for step in range(max_new):
            groups = [(gens[g], (group_of_row[active] == g).nonzero().squeeze(-1))
                      for g in group_of_row[active].unique().tolist()]
            nxt = sample_rows(logits, groups, sampling)
            if budget is not None:
                nxt = torch.tensor([budget.override(r, t, tokens[r]) for r, t in zip(active.tolist(), nxt.tolist())],
                                   dtype=torch.long, device=dev)
            for row, tok in zip(active.tolist(), nxt.tolist()):
                tokens[row].append(tok)
                stopped[row] = tok in self.stop_ids
                if budget is not None:
                    budget.observe(row, tokens[row])
            self.stats["generated_tokens"] += len(active)
            live = torch.tensor([not stopped[r] for r in active.tolist()], device=dev)
            if step == max_new - 1 or not live.any():
                break
            if not live.all():  # compact: finished rows leave the batch (their KV is dropped)
                for layer in cache.layers:
                    layer.select_rows(live.nonzero().squeeze(-1))
                active, nxt = active[live], nxt[live]
            kv_len = cache.get_seq_length() + 1
            mask = valid[active, :kv_len][:, None, None, :]
            out = self.model(input_ids=nxt[:, None], position_ids=(positions[active] + step)[:, None],
                             attention_mask=mask, **{self.cache_kw: cache}, use_cache=True)
            logits = out.logits[:, -1]
        if budget is not None:
            self.stats["thoughts_forced_closed"] += len(budget.forced_rows)
        return self._samples([p for p, c in zip(prefilled, counts) for _ in range(c)], tokens, indices)

    def _samples(self, turn_of_row: list[_Prefilled], tokens: list[list[int]], indices: list[int]) -> list[Sample]:
        samples = []
        for p, toks, index in zip(turn_of_row, tokens, indices):
            text, stop = decode_completion(self.tokenizer, toks, self.stop_ids)
            samples.append(Sample(
                turn_id=p.request.turn_id,
                sample_index=index,
                completion=apply_thinking(text, self.fmt.thinking),
                n_prompt_tokens=p.n_prompt,
                n_completion_tokens=len(toks),
                finish_reason="stop" if stop else "length",
            ))
        self.stats["samples"] += len(samples)
        return samples
