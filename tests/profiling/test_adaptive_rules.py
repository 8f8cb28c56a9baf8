"""Adaptive profiling's stopping rules (no model): the exact rule is exactly right over every count, the posterior's
flip probability is the beta-binomial's, the prior is recovered by its fit, and the posterior rule's error rate is
what it states on turns drawn from its prior."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import betabinom

from pivot_assets.core.config import AdaptiveSection
from pivot_assets.profiling.adaptive import (
    FLAT,
    Prior,
    counts_table,
    decide,
    exact_settled,
    fit_prior,
    flip_probability,
    prior_for,
    simulate,
)

LAMBDAS = (0.0, 0.1, 0.25, 0.5, 0.6, 0.75, 1.0)
SETS = (["mixed"], ["adv"], ["mixed", "adv"])


def membership(rewards: list[float], lambda_diff: float) -> dict[str, bool]:
    """selection.py's definitions on a turn's rewards (population variance > 0; mean <= lambda_diff)."""
    mean = sum(rewards) / len(rewards)
    mixed = len(set(rewards)) > 1
    return {"mixed": mixed, "adv": mixed and mean <= lambda_diff}


def final_memberships(prefix: list[float], k: int, lambda_diff: float, values=(0.0, 1.0)) -> list[dict]:
    """The membership at k of every completion of the prefix with rewards from `values`."""
    rest = k - len(prefix)
    return [membership(prefix + list(c), lambda_diff) for c in itertools.product(values, repeat=rest)]


def rule(prefix: list[float], k: int, lambda_diff: float, sets: list[str]):
    settled, member = exact_settled([len(prefix)], [sum(prefix)], [len(set(prefix))], k, lambda_diff, sets)
    return bool(settled[0]), {name: bool(member[name][0]) for name in sets}


@pytest.mark.parametrize("sets", SETS)
def test_exact_rule_is_exactly_right_over_every_binary_count(sets):
    """Sound: a settled turn's membership holds for every completion. Tight: when every completion agrees, the rule
    says settled (the one exception: D_adv when lambda_diff * k < 1, which a graded reward could still reach)."""
    for k in range(1, 11):
        for lambda_diff in LAMBDAS:
            for n in range(k + 1):
                for s in range(n + 1):
                    prefix = [1.0] * s + [0.0] * (n - s)
                    settled, member = rule(prefix, k, lambda_diff, sets)
                    finals = final_memberships(prefix, k, lambda_diff)
                    agree = all(all(f[name] == finals[0][name] for name in sets) for f in finals)
                    if settled:
                        assert all(all(f[name] == member[name] for name in sets) for f in finals), (k, lambda_diff, n, s)
                    elif not ("adv" in sets and 0 < lambda_diff * k < 1):
                        assert not agree, f"open although every completion agrees: k={k} lambda={lambda_diff} n={n} s={s} {sets}"


@settings(max_examples=300, deadline=None)
@given(k=st.integers(1, 8), lambda_diff=st.sampled_from(LAMBDAS), sets=st.sampled_from(SETS),
       prefix=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), max_size=8),
       completions=st.lists(st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8), min_size=1, max_size=6))
def test_exact_rule_is_sound_for_graded_rewards(k, lambda_diff, sets, prefix, completions):
    """Rewards anywhere in [0, 1]: a settled membership holds for every completion tried (the extremes included)."""
    prefix = prefix[:k]
    settled, member = rule(prefix, k, lambda_diff, sets)
    if not settled:
        return
    rest = k - len(prefix)
    for completion in [*completions, [0.0] * 8, [1.0] * 8, [prefix[-1] if prefix else 0.5] * 8]:
        final = membership(prefix + completion[:rest], lambda_diff)
        assert all(final[name] == member[name] for name in sets), (prefix, completion[:rest])


def test_flip_probability_is_the_beta_binomial_sum():
    k, lambda_diff, a, b = 8, 0.6, 0.4, 1.3
    for n in range(1, k + 1):
        for s in range(n + 1):
            now = membership([1.0] * s + [0.0] * (n - s), lambda_diff)
            m = k - n
            want = sum(betabinom.pmf(x, m, a + s, b + n - s)
                       for x in range(m + 1)
                       if membership([1.0] * (s + x) + [0.0] * (k - s - x), lambda_diff) != now)
            got = flip_probability([n], [s], [a], [b], k, lambda_diff, ["mixed", "adv"])[0]
            assert got == pytest.approx(want, abs=1e-9), (n, s)


def test_a_settled_turn_has_no_flip_probability():
    k, lambda_diff = 8, 0.6
    for n in range(1, k + 1):
        for s in range(n + 1):
            settled, _ = exact_settled([n], [s], [(s > 0) + (s < n)], k, lambda_diff, ["mixed", "adv"])
            if settled[0]:
                assert flip_probability([n], [s], [0.5], [0.5], k, lambda_diff, ["mixed", "adv"])[0] == pytest.approx(0)


def test_fit_recovers_a_pooled_prior_and_the_likelihood_slope():
    rng = np.random.default_rng(0)
    p = rng.beta(0.3, 1.2, 4000)
    passes = rng.binomial(2, p)
    prior = fit_prior("pooled", passes, 2)
    assert prior.kind == "pooled" and prior.turns == 4000
    a, b = prior.beta(np.full(1, np.nan))
    assert a[0] / (a[0] + b[0]) == pytest.approx(0.2, abs=0.03)
    assert prior.phi == pytest.approx(1.5, rel=0.35)
    # a pass rate that rises with the feature: the likelihood prior finds a positive slope
    feature = rng.uniform(-40, 0, 4000)
    p = 1 / (1 + np.exp(-(0.15 * feature + 2)))
    prior = fit_prior("likelihood", rng.binomial(2, p), 2, feature.tolist())
    assert prior.kind == "likelihood" and prior.slope > 1.0
    assert fit_prior("pooled", passes[:5], 2) == FLAT  # too few first rounds: the flat prior


def draws(rng, a: float, b: float, turns: int, k: int) -> dict[str, list[float]]:
    p = rng.beta(a, b, turns)
    return {f"t{i:05d}": [float(x) for x in rng.random(k) < p[i]] for i in range(turns)}


def test_exact_rounds_never_change_a_membership():
    rng = np.random.default_rng(1)
    k, lambda_diff = 8, 0.6
    rewards = draws(rng, 0.5, 0.5, 400, k)
    options = AdaptiveSection(enabled=True, rule="exact", round_size=2)
    stops = simulate(rewards, options, k, lambda_diff)
    assert sum(stops.values()) < 400 * k  # it does stop some turns early
    for turn, n in stops.items():
        assert n % 2 == 0 and 2 <= n <= k
        assert membership(rewards[turn][:n], lambda_diff) == membership(rewards[turn], lambda_diff)


def test_posterior_rounds_keep_their_stated_error_rate_on_turns_from_the_prior():
    """Turns drawn from a Beta: among the turns the posterior rule stops before k, the share whose membership
    differs from all k samples stays near epsilon or below (the rule is conservative: each stop has P(flip) < eps)."""
    rng = np.random.default_rng(2)
    k, lambda_diff, eps = 8, 0.6, 0.05
    rewards = draws(rng, 0.25, 0.75, 3000, k)
    options = AdaptiveSection(enabled=True, rule="posterior", round_size=2, epsilon=eps, prior="pooled")
    stops = simulate(rewards, options, k, lambda_diff)
    early = [t for t, n in stops.items() if n < k]
    flips = sum(membership(rewards[t][:stops[t]], lambda_diff) != membership(rewards[t], lambda_diff) for t in early)
    assert len(early) > 300 and sum(stops.values()) < 0.95 * 3000 * k
    assert flips / len(early) <= eps, (flips, len(early))


def test_waves_take_the_rounds_samples_under_the_exact_rule_in_full_calls():
    """The exact rule needs no prior: the scheduler without rounds stops every turn where the rounds do; its engine
    calls hold wave_samples samples until the turns not yet sampled run out (the rounds' calls shrink round by round)."""
    rng = np.random.default_rng(3)
    k, lambda_diff = 8, 0.6
    rewards = draws(rng, 0.5, 0.5, 400, k)
    rounds_calls, wave_calls = [], []
    rounds = simulate(rewards, AdaptiveSection(enabled=True, rule="exact"), k, lambda_diff, calls=rounds_calls)
    waves = simulate(rewards, AdaptiveSection(enabled=True, rule="exact", scheduler="waves", wave_samples=64), k,
                     lambda_diff, calls=wave_calls)
    assert waves == rounds
    assert max(wave_calls) == 64 and sum(wave_calls) == sum(rounds.values())
    first_short = next(i for i, n in enumerate(wave_calls) if n < 64)
    assert sum(wave_calls[:first_short]) >= 2 * 400  # every first round went out in full calls
    assert sum(wave_calls[first_short:]) < 0.1 * sum(wave_calls)  # the short calls are the tail
    assert rounds_calls == sorted(rounds_calls, reverse=True) and rounds_calls[0] == 800  # the rounds' calls shrink


@pytest.mark.scenario
def test_posterior_waves_end_settled_under_the_reported_prior_and_keep_the_error_rate():
    """Decisions are taken under a prior refitted as first rounds arrive; at the end every turn is settled under the
    prior fitted on all first rounds (the one turn_profiles reports), so a turn never takes fewer samples than the
    rounds give it, and the error rate among early stops stays within epsilon."""
    rng = np.random.default_rng(2)
    k, lambda_diff, eps = 8, 0.6, 0.05
    rewards = draws(rng, 0.25, 0.75, 3000, k)
    common = dict(enabled=True, rule="posterior", round_size=2, epsilon=eps, prior="pooled")
    rounds = simulate(rewards, AdaptiveSection(**common), k, lambda_diff)
    waves = simulate(rewards, AdaptiveSection(**common, scheduler="waves", wave_samples=64), k, lambda_diff)
    assert all(waves[t] >= rounds[t] for t in rewards) and sum(waves.values()) < 1.05 * sum(rounds.values())
    options = AdaptiveSection(**common, scheduler="waves", wave_samples=64)
    final = counts_table({t: rewards[t][:n] for t, n in waves.items()}, 2, {})
    assert all(decide(final, options, k, lambda_diff, prior_for(final, options, 2)).settled)
    early = [t for t, n in waves.items() if n < k]
    flips = sum(membership(rewards[t][:waves[t]], lambda_diff) != membership(rewards[t], lambda_diff) for t in early)
    assert len(early) > 300 and flips / len(early) <= eps, (flips, len(early))


def test_the_stream_takes_the_rounds_samples_under_the_exact_rule_with_the_engine_full():
    """Single requests instead of engine calls: the same samples per turn as the rounds (each turn's written samples
    a prefix: replay_stream checks every write), the engine kept at its capacity until the turns run out, and the
    chunks lent ahead of a turn that then settles cancelled, never written."""
    from pivot_assets.profiling.adaptive import ReplayEngine, counts_table, run_stream

    rng = np.random.default_rng(3)
    k, lambda_diff = 8, 0.6
    rewards = draws(rng, 0.5, 0.5, 400, k)
    rounds = simulate(rewards, AdaptiveSection(enabled=True, rule="exact"), k, lambda_diff)
    in_flight: list[int] = []
    options = AdaptiveSection(enabled=True, rule="exact", scheduler="stream", wave_samples=64)
    assert simulate(rewards, options, k, lambda_diff, calls=in_flight) == rounds
    assert max(in_flight) == 64 and np.mean(in_flight) > 0.9 * 64
    first_short = next(i for i, n in enumerate(in_flight) if n < 64)
    assert first_short > 0.8 * len(in_flight)  # below capacity only in the tail

    written: dict[str, list[int]] = {}
    engine = ReplayEngine()

    def write(samples):
        for s in samples:
            written.setdefault(s.turn_id, []).append(s.sample_index)
        return {"rows": len(samples)}

    stats = run_stream(sorted(rewards), lambda: counts_table({t: rewards[t][:len(i)] for t, i in written.items()}, 2, {}),
                       lambda: engine, write, lambda turns: {"rollouts_scored": 0}, options, k, lambda_diff, 64)
    assert stats["rollouts_aborted"] + stats["rollouts_dropped"] > 0 and engine.in_flight == 0
    assert {t: len(i) for t, i in written.items()} == rounds and stats["rollouts_generated"] == sum(rounds.values())
    assert all(i == list(range(len(i))) for i in written.values())


@pytest.mark.scenario
def test_posterior_stream_ends_settled_under_the_reported_prior_and_keeps_the_error_rate():
    """As the waves: decisions under a prior refitted as first chunks come in; at the end every turn is settled
    under the prior fitted on all first rounds, no turn has fewer samples than the rounds give it, and the error
    rate among early stops stays within epsilon."""
    rng = np.random.default_rng(2)
    k, lambda_diff, eps = 8, 0.6, 0.05
    rewards = draws(rng, 0.25, 0.75, 1500, k)
    common = dict(enabled=True, rule="posterior", round_size=2, epsilon=eps, prior="pooled")
    rounds = simulate(rewards, AdaptiveSection(**common), k, lambda_diff)
    options = AdaptiveSection(**common, scheduler="stream", wave_samples=64)
    stream = simulate(rewards, options, k, lambda_diff)
    assert all(stream[t] >= rounds[t] for t in rewards) and sum(stream.values()) < 1.05 * sum(rounds.values())
    final = counts_table({t: rewards[t][:n] for t, n in stream.items()}, 2, {})
    assert all(decide(final, options, k, lambda_diff, prior_for(final, options, 2)).settled)
    early = [t for t, n in stream.items() if n < k]
    flips = sum(membership(rewards[t][:stream[t]], lambda_diff) != membership(rewards[t], lambda_diff) for t in early)
    assert len(early) > 150 and flips / len(early) <= eps, (flips, len(early))


def test_the_stream_needs_an_engine_that_streams_requests_in_this_process():
    from pivot_assets.core.config import ConfigError, load_config

    stream = {"adaptive": {"enabled": True, "scheduler": "stream"}}
    assert load_config(None, overrides={"profiling": stream, "policy": {"backend": "vllm"}}).profiling.adaptive.enabled
    with pytest.raises(ConfigError, match="policy.backend transformers cannot add and cancel single requests"):
        load_config(None, overrides={"profiling": stream, "policy": {"backend": "transformers"}})
    with pytest.raises(ConfigError, match="with scale.engine ray use scheduler: waves"):
        load_config(None, overrides={"profiling": stream, "policy": {"backend": "vllm"}, "scale": {"engine": "ray"}})


def test_decide_reports_why_each_turn_stops():
    options = AdaptiveSection(enabled=True, rule="posterior", round_size=2, epsilon=0.05, sets=["mixed", "adv"])
    counts = counts_table({"done": [1, 0, 1, 0, 1, 1, 0, 1], "easy": [1, 0, 1, 1, 1, 1], "zero": [0, 0],
                           "open": [1, 0], "graded": [0.5, 0.0]}, 2, {})
    prior = Prior("pooled", intercept=-3.0, phi=0.5)  # most turns never pass: two failures are convincing
    d = decide(counts, options, 8, 0.6, prior)
    why = dict(zip(counts.column("turn_id").to_pylist(), d.stop_reason))
    flip = dict(zip(counts.column("turn_id").to_pylist(), d.p_flip))
    assert why == {"done": "k_reached", "easy": "settled", "zero": "posterior", "open": "unsettled",
                   "graded": "unsettled"}
    assert flip["done"] == 0 and flip["easy"] == 0 and flip["zero"] < 0.05 < flip["open"] and flip["graded"] is None
    off = decide(counts, AdaptiveSection(enabled=False), 8, 0.6, None)
    assert off.stop_reason == ["k_reached", "unsettled", "unsettled", "unsettled", "unsettled"]


def test_adaptive_needs_per_sample_seeds_and_runs_on_either_engine():
    from pivot_assets.core.config import ConfigError, load_config

    on = {"adaptive": {"enabled": True}}
    assert load_config(None, overrides={"profiling": on}).profiling.adaptive.enabled
    with pytest.raises(ConfigError, match="seeding: per_sample"):
        load_config(None, overrides={"profiling": {**on, "seeding": "per_turn"}})
    ray = load_config(None, overrides={"profiling": on, "scale": {"engine": "ray"}})  # rounds in each shard's job
    assert ray.profiling.adaptive.enabled and ray.scale.engine == "ray"
    with pytest.raises(ConfigError, match="unknown key 'profiling.adaptive.epsilonn'"):
        load_config(None, overrides={"profiling": {"adaptive": {"epsilonn": 0.1}}})


def test_the_scheduler_is_in_the_samples_identity_only_when_it_is_waves():
    """Waves take other samples than rounds (decisions under a refitted prior): another rollouts version; the wave
    size matters only to waves, and warehouses profiled in rounds keep their version."""
    from pivot_assets.core.config import PolicySection
    from pivot_assets.profiling.profiler import policy_version

    policy = PolicySection(dtype="float32")
    version = lambda **kw: policy_version(policy, "per_sample", AdaptiveSection(enabled=True, **kw))  # noqa: E731
    assert version() == version(wave_samples=8)
    assert version(scheduler="waves") != version()
    assert version(scheduler="waves", wave_samples=8) != version(scheduler="waves")
    assert version(scheduler="stream") not in (version(), version(scheduler="waves"))
    assert version(scheduler="stream", wave_samples=8) != version(scheduler="stream")  # requests in flight
