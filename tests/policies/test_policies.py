"""Policy layer: tool chat template, prompt rendering, transformers backend (embedded model, tiny runs)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from pivot_assets.core.config import PolicySection
from pivot_assets.policies.base import GenerationRequest, SamplingConfig
from pivot_assets.policies.factory import build_backend
from pivot_assets.policies.models import (
    TOOL_CHAT_TEMPLATE,
    policy_fingerprint,
    render_action,
    render_prompt,
    to_template_messages,
)

TOOLS = [{"type": "function", "function": {
    "name": "get_user", "description": "Look up a user by id",
    "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}]


def _msg(role, content=None, tool_calls=None, tool_call_id=None, reasoning=None):
    return {"role": role, "content": content, "reasoning": reasoning, "tool_calls": tool_calls, "tool_call_id": tool_call_id}


MESSAGES = [
    _msg("system", "You are an airline agent."),
    _msg("user", "My id is u_77. What is my name?"),
    _msg("assistant", None, [{"id": "c1", "name": "get_user", "arguments": '{"id":"u_77"}'}], reasoning="look it up"),
    _msg("tool", '{"name":"Ann"}', tool_call_id="c1"),
    _msg("assistant", "Your name is Ann."),
    _msg("user", "Thanks!"),
]


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_model_dir))


@pytest.fixture(scope="module")
def backend(embedded_model_dir):
    from pivot_assets.policies.transformers_backend import TransformersBackend

    return TransformersBackend(model=str(embedded_model_dir), batch_size=8)


# ---- template and rendering -----------------------------------------------------------------------

def test_prompt_lists_tools_and_roundtrips_tool_call_json(tokenizer):
    prompt = render_prompt(tokenizer, MESSAGES[:4], TOOLS)
    tools_block = re.search(r"<tools>\n(.*)\n</tools>", prompt, re.S).group(1)
    assert json.loads(tools_block) == TOOLS[0]
    calls = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", prompt.split("<|im_start|>user")[1], re.S)
    assert [json.loads(c) for c in calls] == [{"name": "get_user", "arguments": {"id": "u_77"}}]
    assert "<tool_response>\n{\"name\":\"Ann\"}\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert "look it up" not in prompt  # reasoning is dropped


def test_render_action_is_what_the_template_renders(tokenizer):
    from pivot_assets.core.shapes import action_from_message

    for index in (2, 4):
        _, action = action_from_message(MESSAGES[index])
        full = render_prompt(tokenizer, MESSAGES[: index + 1], TOOLS)
        before = render_prompt(tokenizer, MESSAGES[:index], TOOLS)
        assert full.startswith(before)
        assert full[len(before):] == render_action(action) + "<|im_end|>\n" + "<|im_start|>assistant\n"
    batch = {"type": "function_call_batch", "calls": [
        {"type": "function_call", "name": "a", "arguments": "{}"}, {"type": "function_call", "name": "b", "arguments": {"x": 1}}]}
    assert render_action(batch) == '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}\n</tool_call>'


def test_each_turn_prompt_is_a_prefix_of_the_next(tokenizer):
    prompts = [render_prompt(tokenizer, MESSAGES[:i], TOOLS) for i in (2, 4, 6)]
    for a, b in zip(prompts, prompts[1:]):
        assert b.startswith(a[: -len("<|im_start|>assistant\n")])


def test_template_messages_parse_arguments_and_reject_bad_json():
    out = to_template_messages(MESSAGES[:3])
    assert out[2]["tool_calls"][0]["function"] == {"name": "get_user", "arguments": {"id": "u_77"}}
    assert "reasoning" not in out[2]
    bad = [_msg("assistant", None, [{"id": "x", "name": "f", "arguments": "{not json"}])]
    with pytest.raises(ValueError, match="'f'.*not JSON"):
        to_template_messages(bad)
    with pytest.raises(ValueError, match="JSON object"):
        to_template_messages([_msg("assistant", None, [{"id": "x", "name": "f", "arguments": "[1]"}])])


def test_embedded_conversion_is_cached_and_leaves_no_temp_dirs(embedded_model_dir):
    from pivot_assets.policies.models import ensure_embedded_hf_dir

    assert ensure_embedded_hf_dir(embedded_model_dir.parent) == embedded_model_dir
    assert not list(embedded_model_dir.parent.glob(".convert-*"))
    assert (embedded_model_dir / "config.json").is_file() and list(embedded_model_dir.glob("*.safetensors"))


def test_a_model_is_identified_by_content_not_by_place(embedded_model_dir, tmp_path):
    """A model dir copied elsewhere (a moved warehouse, another machine) keeps its fingerprint; no path is in it."""
    import json
    import os
    import shutil

    moved = tmp_path / "elsewhere" / "sft_policy"
    shutil.copytree(embedded_model_dir, moved, copy_function=os.link)
    fp = policy_fingerprint(str(embedded_model_dir))
    assert policy_fingerprint(str(moved)) == fp and fp.startswith("local|w:")
    assert str(embedded_model_dir) not in fp and "/" not in fp
    # a saved config that records where it was loaded from is the same model
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").unlink()  # a hard link: never write through it into the shared dir
    (moved / "config.json").write_text(json.dumps({**config, "_name_or_path": str(tmp_path)}))
    assert policy_fingerprint(str(moved)) == fp


def test_fingerprints(embedded_model_dir):
    fp = policy_fingerprint("embedded")
    assert fp.startswith("embedded|w:") and fp == policy_fingerprint("embedded")
    assert policy_fingerprint(str(embedded_model_dir)) != fp
    assert SamplingConfig(k=4).fingerprint != SamplingConfig(k=8).fingerprint
    assert SamplingConfig.from_policy(PolicySection(k=3, temperature=0.7)) == SamplingConfig(k=3, temperature=0.7)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="policy.backend"):
        build_backend({"backend": "nope"})
    assert "<tool_call>" in TOOL_CHAT_TEMPLATE


# ---- transformers backend --------------------------------------------------------------------------

def _requests():
    """Two trajectories; turns at message 2 and 4 share their prefix (index 4 extends index 2)."""
    other = [_msg("user", "Say hi.")]
    return [
        GenerationRequest("a4", "A", 4, MESSAGES[:4], TOOLS),
        GenerationRequest("b1", "B", 1, other, []),
        GenerationRequest("a2", "A", 2, MESSAGES[:2], TOOLS),
    ]


def _run(backend, sampling):
    batches = list(backend.generate(_requests(), sampling))
    return batches, [s for b in batches for s in b]


@pytest.mark.scenario
def test_sample_counts_shapes_and_determinism(backend):
    assert backend.tokenizer.chat_template == TOOL_CHAT_TEMPLATE and backend.tokenizer.pad_token is not None
    sampling = SamplingConfig(k=3, temperature=1.0, max_new_tokens=3, seed=7)
    batches, samples = _run(backend, sampling)
    assert len(samples) == 3 * 3
    for b in batches:  # a yield holds all K samples of each of its turns
        ids = [s.turn_id for s in b]
        assert all(ids.count(t) == 3 for t in set(ids))
    by_turn = {}
    for s in samples:
        by_turn.setdefault(s.turn_id, []).append(s.sample_index)
        assert s.finish_reason in ("stop", "length") and 1 <= s.n_completion_tokens <= 3
        assert s.finish_reason == "stop" or s.n_completion_tokens == 3
    assert {t: sorted(v) for t, v in by_turn.items()} == {"a2": [0, 1, 2], "a4": [0, 1, 2], "b1": [0, 1, 2]}
    _, again = _run(backend, sampling)
    assert [s.completion for s in again] == [s.completion for s in samples]
    _, other_seed = _run(backend, SamplingConfig(k=3, temperature=1.0, max_new_tokens=3, seed=8))
    assert [s.completion for s in other_seed] != [s.completion for s in samples]


@pytest.mark.scenario
def test_kept_prompts_serve_a_later_round_without_prefill_and_draw_the_same_samples(embedded_model_dir):
    """keep_prompts (adaptive rounds): a turn sampled again in a later call reuses its prompt's KV (no prefill) and
    draws exactly the samples a backend without kept prompts draws for the same (turn, sample index, seed) rows."""
    from pivot_assets.policies.transformers_backend import TransformersBackend

    sampling = SamplingConfig(k=4, temperature=1.0, max_new_tokens=6, seed=3)
    requests = _requests()
    first = {r.turn_id: [(0, 100), (1, 101)] for r in requests}  # round 1: samples 0 and 1 (per-row seeds)
    later = {r.turn_id: [(2, 102), (3, 103)] for r in requests}  # round 2: samples 2 and 3
    kept = TransformersBackend(model=str(embedded_model_dir), batch_size=8, prompt_cache_gb=1.0)
    list(kept.generate(requests, sampling, rows=first))
    before = dict(kept.stats)
    ours = {(x.turn_id, x.sample_index): x.completion for b in kept.generate(requests, sampling, rows=later) for x in b}
    assert kept.stats["prefill_tokens_computed"] == before["prefill_tokens_computed"]  # no prompt prefilled again
    assert kept.stats["prompt_cache_hits"] - before["prompt_cache_hits"] == len(requests)
    plain = TransformersBackend(model=str(embedded_model_dir), batch_size=8)
    theirs = {(x.turn_id, x.sample_index): x.completion for b in plain.generate(requests, sampling, rows=later) for x in b}
    assert ours == theirs and len(ours) == 2 * len(requests)


def test_prompt_cache_stays_within_its_budget():
    from pivot_assets.policies.transformers_backend import PromptCache

    one = [(torch.zeros(1, 2, 10, 4), torch.zeros(1, 2, 10, 4))]  # 640 bytes of KV
    cache = PromptCache(budget_bytes=1500)
    cache.put("a", [1, 2], one, torch.zeros(3))
    cache.put("b", [3], one, torch.zeros(3))
    assert cache.get("a", [1, 2]) is not None  # a is now the most recent
    cache.put("c", [4], one, torch.zeros(3))  # over budget: b, the least recently used, goes
    assert cache.get("b", [3]) is None and cache.get("a", [1, 2]) is not None and cache.get("c", [4]) is not None
    assert cache.used <= 1500 and cache.get("a", [1, 9]) is None  # another prompt under the same turn: a miss


def test_prefix_reuse_counts_and_matches_fresh_prefill(backend):
    reqs = sorted(_requests()[::2], key=lambda r: r.message_index)  # trajectory A: turn 2 then turn 4
    ids = [backend.prompt_ids(r) for r in reqs]
    before = dict(backend.stats)
    with torch.inference_mode():
        backend._reset_trajectory()
        backend.prefill(reqs[0], ids[0])
        reused = backend.prefill(reqs[1], ids[1])
        backend._reset_trajectory()
        fresh = backend.prefill(reqs[1], ids[1])
        backend._reset_trajectory()
    computed = backend.stats["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    from pivot_assets.policies.transformers_backend import common_prefix_len

    shared = common_prefix_len(ids[0], ids[1])
    assert shared >= len(ids[0]) - 2  # turn 2's prompt is (up to a BPE boundary) a prefix of turn 4's
    assert computed == len(ids[0]) + (len(ids[1]) - shared) + len(ids[1])
    assert backend.stats["cache_hits"] - before["cache_hits"] == 1
    assert torch.allclose(reused.last_logits, fresh.last_logits, atol=1e-3, rtol=0)
    for (k1, v1), (k2, v2) in zip(reused.kv, fresh.kv):
        assert torch.allclose(k1, k2, atol=1e-3) and torch.allclose(v1, v2, atol=1e-3)


@pytest.mark.scenario
def test_batched_greedy_decode_matches_generate(backend):
    """Left-padded batch of two prompts of different lengths == HF generate on each prompt alone."""
    sampling = SamplingConfig(k=2, temperature=0.0, max_new_tokens=6)
    reqs = _requests()[1:]  # b1 (short) and a2 (long): different lengths in one decode batch
    samples = [s for b in backend.generate(reqs, sampling) for s in b]
    tok = backend.tokenizer
    for req in reqs:
        ids = torch.tensor([backend.prompt_ids(req)])
        with torch.inference_mode():
            ref = backend.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
        ref_tokens = ref[0, ids.shape[1]:].tolist()
        stops = [i for i, t in enumerate(ref_tokens) if t in backend.stop_ids]
        want = tok.decode(ref_tokens[: stops[0]] if stops else ref_tokens, skip_special_tokens=False)
        got = [s.completion for s in samples if s.turn_id == req.turn_id]
        assert got == [want, want]


@pytest.mark.scenario
def test_per_row_seeds_draw_what_one_call_per_sample_draws(backend):
    """The Ray engine's seeding: sample i of a turn is drawn under its own seed. One call with a generator per row
    (one prefill per turn, the rows decoded together) gives the completions of one K=1 call per seed, also when a
    turn asks for only some of its samples (what resume leaves)."""
    seeds = {0: 101, 1: 202, 2: 303}
    reqs = _requests()

    def sampling(k, seed=0):
        return SamplingConfig(k=k, temperature=1.0, max_new_tokens=12, seed=seed)

    one_by_one = {}
    for i, seed in seeds.items():
        for s in (s for b in backend.generate(reqs, sampling(1, seed)) for s in b):
            one_by_one[(s.turn_id, i)] = s.completion
    rows = {"a4": [(2, seeds[2])], "b1": [(0, seeds[0]), (2, seeds[2])], "a2": [(i, x) for i, x in seeds.items()]}
    before = backend.stats["turns"]
    together = [s for b in backend.generate(reqs, sampling(3), rows=rows) for s in b]
    assert backend.stats["turns"] - before == 3  # one prefill per turn, not one per sample
    assert sorted((s.turn_id, s.sample_index) for s in together) == sorted((t, i) for t, r in rows.items() for i, _ in r)
    assert {(s.turn_id, s.sample_index): s.completion for s in together} == {
        (s.turn_id, s.sample_index): one_by_one[(s.turn_id, s.sample_index)] for s in together}
    assert len({one_by_one[("a2", i)] for i in seeds}) > 1  # the seeds really draw different samples


@pytest.mark.scenario
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_expert_likelihood_equals_direct_teacher_forcing_and_leaves_the_samples_alone(backend, temperature):
    """The expert action's log-likelihood from the prefill equals one forward over prompt + action (position j-1's
    tempered log-softmax scoring token j, the end-of-turn token included), and sampling from a cache that also
    holds the action draws exactly what sampling without it draws."""
    from dataclasses import replace

    from pivot_assets.policies.base import likelihoods_of

    experts = {"a2": MESSAGES[2], "a4": MESSAGES[4], "b1": _msg("assistant", "Hi!")}
    requests = [replace(r, expert=experts[r.turn_id]) for r in _requests()]
    sampling = SamplingConfig(k=2, temperature=temperature, max_new_tokens=10, seed=3)
    batches = list(backend.generate(requests, sampling))
    got = {x.turn_id: x for b in batches for x in likelihoods_of(b)}
    assert set(got) == set(experts)
    tok = backend.tokenizer
    for r in requests:
        prompt = render_prompt(tok, r.messages, r.tools)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        full = tok.apply_chat_template(to_template_messages([*r.messages, r.expert]), tools=r.tools or None,
                                       tokenize=False, add_generation_prompt=False)
        action = tok(full[len(prompt):], add_special_tokens=False)["input_ids"]
        action = action[: action.index(tok.convert_tokens_to_ids("<|im_end|>")) + 1]
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor([prompt_ids + action])).logits[0].float()
        direct = torch.log_softmax(logits[len(prompt_ids) - 1 : -1] / temperature, -1).gather(
            -1, torch.tensor(action)[:, None]).sum().item()
        assert got[r.turn_id].n_tokens == len(action)
        assert got[r.turn_id].logprob == pytest.approx(direct, abs=1e-3)
    plain = [s.completion for b in backend.generate(_requests(), sampling) for s in b]
    assert [s.completion for b in batches for s in b] == plain


@pytest.mark.gpu
@pytest.mark.vllm
def test_vllm_backend_samples_every_turn_on_a_gpu(embedded_model_dir):
    """The CPU engine is tested in test_vllm.py; this is the same backend on a CUDA device."""
    from pivot_assets.policies.vllm_backend import VLLMBackend

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (and vllm's CUDA build, the [gpu] extra)")
    backend = VLLMBackend(model=str(embedded_model_dir), dtype="float32", device="cuda",
                          engine_args={"gpu_memory_utilization": 0.3})
    samples = [s for b in backend.generate(_requests(), SamplingConfig(k=4, max_new_tokens=16)) for s in b]
    assert len(samples) == 3 * 4
    assert sorted({(s.turn_id, s.sample_index) for s in samples}) == sorted((t, i) for t in ("a2", "a4", "b1") for i in range(4))
    assert all(s.finish_reason in ("stop", "length") and s.n_completion_tokens <= 16 for s in samples)
    assert backend.fingerprint == policy_fingerprint(str(embedded_model_dir))
