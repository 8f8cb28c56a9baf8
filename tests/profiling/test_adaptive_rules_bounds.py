"""Adaptive profiling under the band and std_min selection rules (no model): the exact rule settles a turn on the
rule's own bounds, never disagrees with all k samples, stops turns clearly outside the region early, leaves a
graded turn under std_min to k, and the rule enters the samples' identity; variance_top_p is refused in one line."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from pivot_assets.core.config import (
    AdaptiveSection,
    ConfigError,
    PivotsSection,
    load_config,
)
from pivot_assets.core.identity import adaptive_identity
from pivot_assets.profiling.adaptive import (
    AdvBounds,
    counts_table,
    decide,
    exact_settled,
    simulate,
)

REPO = Path(__file__).resolve().parents[2]
K = 8
RULES = [PivotsSection(rule="band", band=[0.2, 0.8]), PivotsSection(rule="band", band=[0.0, 0.5]),
         PivotsSection(rule="band", band=[0.5, 1.0]), PivotsSection(rule="std_min", min_std=0.4),
         PivotsSection(rule="std_min", min_std=0.3), PivotsSection(rule="std_min", min_std=0.0),
         PivotsSection(rule="std_min", min_std=0.5)]


def in_adv(rewards: list[float], pivots: PivotsSection) -> bool:
    """curation/selection.py's definitions on a turn's rewards (population variance, ddof=0)."""
    mixed = len(set(rewards)) > 1
    mean, var = float(np.mean(rewards)), float(np.var(rewards))
    if pivots.rule == "band":
        return mixed and pivots.band[0] < mean < pivots.band[1]
    return mixed and var > 0 and math.sqrt(var) >= pivots.min_std


def draws(rng, turns: int, k: int) -> dict[str, list[float]]:
    p = rng.beta(0.5, 0.5, turns)
    return {f"t{i:04d}": [float(x) for x in rng.random(k) < p[i]] for i in range(turns)}


@pytest.mark.parametrize("pivots", RULES, ids=lambda p: f"{p.rule}-{p.band if p.rule == 'band' else p.min_std}")
def test_exact_rule_is_sound_over_every_binary_count(pivots):
    """A turn settled after n of k samples has, for every 0/1 completion, the adv membership it was settled with."""
    bounds = AdvBounds.from_pivots(pivots)
    for k in range(1, 9):
        for n in range(k + 1):
            for s in range(n + 1):
                prefix = [1.0] * s + [0.0] * (n - s)
                settled, member = exact_settled([n], [s], [len(set(prefix))], k, bounds, ["adv"])
                if not settled[0]:
                    continue
                for rest in itertools.product((0.0, 1.0), repeat=k - n):
                    assert in_adv(prefix + list(rest), pivots) == bool(member["adv"][0]), (k, n, s, rest)


@pytest.mark.parametrize("pivots", RULES[:5], ids=lambda p: f"{p.rule}-{p.band if p.rule == 'band' else p.min_std}")
@pytest.mark.parametrize("scheduler", ["rounds", "waves", "stream"])
def test_turns_stopped_early_keep_the_membership_of_all_k_samples(pivots, scheduler):
    rng = np.random.default_rng(7)
    rewards = draws(rng, 300, K)
    options = AdaptiveSection(enabled=True, rule="exact", round_size=2, sets=["mixed", "adv"], scheduler=scheduler,
                              wave_samples=16)
    stops = simulate(rewards, options, K, AdvBounds.from_pivots(pivots))
    early = [t for t, n in stops.items() if n < K]
    assert early, "the exact rule stops no turn early"
    for turn in early:
        n = stops[turn]
        assert in_adv(rewards[turn][:n], pivots) == in_adv(rewards[turn], pivots), (turn, rewards[turn], n)


def test_a_turn_clearly_outside_the_band_stops_early_and_one_inside_settles_in():
    options = AdaptiveSection(enabled=True, rule="exact", round_size=2, sets=["adv"])
    bounds = AdvBounds.from_pivots(PivotsSection(rule="band", band=[0.5, 0.9]))
    rewards = {"easy": [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],  # 5 of 6: the final mean lies in [5/8, 7/8]: in
               "hard": [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # 1 of 6: at most 3/8: out
               "failing": [0.0] * 8,  # 0 of 4: at most 4/8, not above the band's low end: out
               "middle": [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]}  # 3 of 6: 3/8 to 5/8, open to the end
    stops = simulate(rewards, options, K, bounds)
    assert stops == {"easy": 6, "hard": 6, "failing": 4, "middle": K}
    band = PivotsSection(rule="band", band=[0.5, 0.9])
    assert [in_adv(rewards[t], band) for t in ("easy", "hard", "failing")] == [True, False, False]


def test_std_min_samples_a_graded_turn_to_k_and_settles_a_binary_one():
    options = AdaptiveSection(enabled=True, rule="exact", round_size=2, sets=["adv"])
    bounds = AdvBounds.from_pivots(PivotsSection(rule="std_min", min_std=0.45))
    # the adv means are [0.35, 0.65]; after 6 samples both can only end at 6/8 or above (out), but only the 0/1 turn
    # is settled: a graded turn is sampled to k
    rewards = {"binary": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0], "graded": [0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5]}
    counts = counts_table({t: r[:6] for t, r in rewards.items()}, 2, {})
    decisions = dict(zip(counts.column("turn_id").to_pylist(), decide(counts, options, K, bounds, None).settled))
    assert decisions == {"binary": True, "graded": False}
    assert simulate(rewards, options, K, bounds)["graded"] == K


def test_pivotrl_keeps_its_identity_and_another_rule_enters_it():
    options = AdaptiveSection(enabled=True)
    pivotrl = adaptive_identity(options, AdvBounds.from_pivots(PivotsSection()).identity())
    assert pivotrl == {"adaptive": {**{k: v for k, v in options.model_dump().items()
                                       if k not in ("scheduler", "wave_samples")}, "lambda_diff": 0.6}}
    band = adaptive_identity(options, AdvBounds.from_pivots(PivotsSection(rule="band", band=[0.2, 0.8])).identity())
    other = adaptive_identity(options, AdvBounds.from_pivots(PivotsSection(rule="band", band=[0.1, 0.8])).identity())
    std = adaptive_identity(options, AdvBounds.from_pivots(PivotsSection(rule="std_min", min_std=0.3)).identity())
    assert len({str(x) for x in (pivotrl, band, other, std)}) == 4
    assert adaptive_identity(AdaptiveSection(), {"rule": "band"}) == {}  # adaptive off: nothing


@pytest.mark.parametrize("rule", ["band", "std_min", "pivotrl"])
def test_adaptive_takes_the_rules_it_can_settle(rule, tmp_path):
    cfg = load_config(REPO / "pivot.yaml", overrides={"warehouse": str(tmp_path), "pivots": {"rule": rule},
                                                       "profiling": {"adaptive": {"enabled": True}}})
    assert AdvBounds.from_pivots(cfg.pivots).rule == rule


def test_adaptive_refuses_variance_top_p_in_one_line(tmp_path):
    overrides = {"warehouse": str(tmp_path), "pivots": {"rule": "variance_top_p"},
                 "profiling": {"adaptive": {"enabled": True}}}
    with pytest.raises(ConfigError, match="pivots.rule variance_top_p with profiling.adaptive.enabled: .*cannot be "
                                          "settled turn by turn; use rule pivotrl, band or std_min") as err:
        load_config(REPO / "pivot.yaml", overrides=overrides)
    assert "\n" not in str(err.value)


def test_the_rollouts_version_carries_the_rule_under_adaptive_only(tmp_path):
    """pivotrl's rollouts version is the one a bare lambda_diff gives; band's differs; adaptive off, the rule is out."""
    from pivot_assets.profiling.adaptive import rule_bounds
    from pivot_assets.profiling.profiler import PER_SAMPLE, policy_version

    def version(rule: str, enabled: bool = True) -> str:
        cfg = load_config(REPO / "pivot.yaml", overrides={
            "warehouse": str(tmp_path), "pivots": {"rule": rule},
            "profiling": {"seeding": "per_sample", "adaptive": {"enabled": enabled}}})
        return policy_version(cfg.policy, PER_SAMPLE, cfg.profiling.adaptive, rule_bounds(cfg))

    cfg = load_config(REPO / "pivot.yaml", overrides={"warehouse": str(tmp_path), "pivots": {"rule": "pivotrl"},
                                                       "profiling": {"seeding": "per_sample", "adaptive": {"enabled": True}}})
    assert version("pivotrl") == policy_version(cfg.policy, PER_SAMPLE, cfg.profiling.adaptive, cfg.pivots.lambda_diff)
    assert version("band") != version("pivotrl") != version("std_min") != version("band")
    assert version("band", enabled=False) == version("pivotrl", enabled=False)
