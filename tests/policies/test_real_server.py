"""The openai backend against a real OpenAI-compatible server: `transformers serve` (transformers' serving extra)
serving the embedded model's cached HF dir on 127.0.0.1, started and stopped by the fixture.

What is checked: the prompt the server renders is the transformers backend's (same prompt token count, same greedy
completion) for a state with tool calls and tool results; the server returns one choice when asked for n=K, so
the backend asks again until each turn has K samples; a few turns profiled through the `pivot` CLI with
`policy.backend: openai`. The canned stub in test_openai_backend.py keeps the fault tests (503s, bad models).
"""

from __future__ import annotations

import time

import duckdb
import pytest

from pivot_assets.policies.base import GenerationRequest, SamplingConfig
from pivot_assets.policies.factory import build_backend
from pivot_assets.policies.openai_backend import OpenAIBackend
from tests.model_server import transformers_serve

pytestmark = pytest.mark.scenario
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
STATE = [
    {"role": "system", "content": "You are a weather assistant.", "tool_calls": None, "tool_call_id": None},
    {"role": "user", "content": "Weather in Paris, then Rome?", "tool_calls": None, "tool_call_id": None},
    {"role": "assistant", "content": None, "tool_call_id": None,
     "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'}]},
    {"role": "tool", "content": '{"temp_c": 18, "sky": "clear"}', "tool_call_id": "c1", "tool_calls": None},
]


@pytest.fixture(scope="module")
def served(embedded_model_dir, tmp_path_factory):
    """(base_url, model name, startup seconds) of a `transformers serve` process on a free 127.0.0.1 port."""
    with transformers_serve(embedded_model_dir, tmp_path_factory.mktemp("serve") / "serve.log") as server:
        yield server.base_url, server.model, server.startup_s


def _requests(n: int) -> list[GenerationRequest]:
    return [GenerationRequest(f"turn{i}", "T", len(STATE), STATE[:-2] if i % 2 else STATE, TOOLS) for i in range(n)]


def test_server_renders_the_transformers_backend_prompt(served):
    """Same prompt tokens and the same greedy completion as the local backend, for a state with a tool call and
    its result: the server renders with the template in the model dir, which is what `auto` resolves to here."""
    base_url, model, startup = served
    print(f"\ntransformers serve startup: {startup:.1f} s")
    requests = _requests(2)
    greedy = SamplingConfig(k=1, temperature=0.0, max_new_tokens=24)
    remote = {s.turn_id: s for b in OpenAIBackend(base_url, model, concurrency=1).generate(requests, greedy) for s in b}
    local_backend = build_backend({"model": "embedded", "dtype": "float32"})
    local = {s.turn_id: s for b in local_backend.generate(requests, greedy) for s in b}
    for req in requests:
        assert remote[req.turn_id].n_prompt_tokens == len(local_backend.prompt_ids(req)), req.turn_id
        assert remote[req.turn_id].completion == local[req.turn_id].completion, req.turn_id


def test_backend_counts_choices_and_asks_again(served):
    """transformers serve answers n=K with one choice: the backend asks again until every turn has K samples."""
    base_url, model, _ = served
    k, requests = 3, _requests(2)
    backend = OpenAIBackend(base_url, model, concurrency=1)
    t0 = time.perf_counter()
    samples = [s for b in backend.generate(requests, SamplingConfig(k=k, max_new_tokens=16, seed=5)) for s in b]
    wall = time.perf_counter() - t0
    print(f"\ntransformers serve: {len(samples)} samples in {wall:.1f} s = {len(samples) / wall:.2f} samples/s "
          f"({backend.stats['requests']} requests, 16 new tokens each)")
    assert sorted((s.turn_id, s.sample_index) for s in samples) == [(r.turn_id, i) for r in requests for i in range(k)]
    assert backend.stats["requests"] > len(requests)  # fewer than n came back: it asked again
    assert backend.stats["samples"] == k * len(requests) and backend.stats["turns"] == len(requests)
    assert all(s.n_prompt_tokens > 0 and s.completion for s in samples)


def test_profile_turns_through_the_pivot_cli(served, tmp_path, monkeypatch):
    """A few turns profiled by the pipeline (ingest -> rollouts -> rollout_rewards -> turn_profiles) with the
    served model: rollouts keyed by the openai fingerprint, K samples per turn, every sample scored."""
    from pivot_jobs.cli import main as pivot

    base_url, model, _ = served
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pivot.yaml").write_text(
        "warehouse: ./wh\nsample: {n_trajectories: 2, seed: 3}\n"
        f"policy: {{backend: openai, base_url: '{base_url}', model: '{model}', k: 2, max_new_tokens: 12, "
        "limit_turns: 3, concurrency: 1}\n")
    assert pivot(["run", "--select", "trajectories,turns,rollouts,rollout_rewards,turn_profiles"]) == 0
    wh = tmp_path / "wh"
    rows = duckdb.sql(f"select policy_fp, turn_id, sample_index from read_parquet('{wh}/rollouts/**/*.parquet')").fetchall()
    assert len(rows) == 3 * 2 and {r[0] for r in rows} == {f"openai|{base_url}|{model}"}
    profiles = duckdb.sql(f"select k from read_parquet('{wh}/turn_profiles.parquet')").fetchall()
    assert [k for (k,) in profiles] == [2, 2, 2]
    reasons = duckdb.sql(f"select turn_id, reason from read_parquet('{wh}/rollout_rewards/**/*.parquet')").fetchall()
    assert len(reasons) == 6
    # the truncation view binds on a profiling-only warehouse and counts these samples
    con = duckdb.connect(str(wh / "pivot.duckdb"), read_only=True)
    funnel = {stage: n for _, stage, n, _ in con.sql("select * from truncation_funnel").fetchall()}
    assert funnel["profiled"] == 3
    assert funnel["with_truncated_samples"] == len({t for t, r in reasons if r == "TRUNCATED"})
    con.close()
