"""Adaptive profiling (Dagster-free): sample each turn in rounds and stop once its pivot-set membership is settled.

Membership after k samples (curation/selection.py): mixed = the rewards are not all equal (reward_var > 0);
adv = mixed and the reward mean in the region of pivots.rule (AdvBounds: pivotrl below; band and std_min settle
on their own bounds the same way; variance_top_p has none and core/config refuses it with adaptive profiling).
Under pivotrl, adv = mixed and reward_mean <= lambda_diff. After n of k samples with reward sum T and D distinct
reward values, m = k - n samples are still to come, each with a reward in [0, 1], so the final sum lies in [T, T + m]:

    mixed  in   once D >= 2 (a variance never returns to 0)           out  only at m = 0 (or k = 1)
    adv    in   once D >= 2 and (T + m) / k <= lambda_diff             out  once T / k > lambda_diff, or when no
                (still hard if every remaining sample passes)               mixed turn can be hard (lambda_diff = 0,
                                                                            or k = 1), or at m = 0

The exact rule stops a turn when every configured set is settled. It is exact both ways: a settled membership
holds for every completion of the remaining rewards, and a membership that holds for every completion is settled
(tests/profiling/test_adaptive.py checks both over all counts). It never disagrees with sampling all k, but it
cannot stop a turn that has only failed (or only passed) so far: the next sample may always differ.

The posterior rule also stops a turn when the membership its n samples give (what selection computes from the
profile) would change with probability < epsilon if it were sampled to k: for binary rewards, s passes in n, a
Beta(a, b) prior on the turn's pass rate gives a Beta(a + s, b + n - s) posterior and the remaining passes a
beta-binomial; P(flip) sums its probability over the final counts whose membership differs. The prior is fitted
on the first round of every profiled turn (empirical Bayes: maximum marginal likelihood of their first
`round_size` rewards): `pooled` is one Beta for all turns, `likelihood` makes its mean a logistic function of the
expert action's log-likelihood under the reference policy (policies/base.ActionLikelihood). Its error rate: among
the turns it stops, the expected share whose membership differs from an exhaustive profile at k is at most
epsilon, if the prior describes the turns (turn_profiles.p_flip is each turn's probability; bench/bench_adaptive.py
measures the share). A turn with a reward that is not 0 or 1 is left to the exact rule.

Sampling in rounds keeps every sample's key and seed: sample i of a turn is the draw of per-sample seeding
(profiler.sample_seed), so an adaptive profile is a prefix of the exhaustive one, and raising the budget (adaptive
off, a smaller epsilon, a larger k) generates only the samples a turn lacks. Three schedulers (config
profiling.adaptive.scheduler): rounds are synchronous (every profiled turn first gets its first round, the
prior's data, then each round samples the turns still open, is scored, and the rule decides); waves are engine
calls of a fixed size, each decided as it returns (run_waves); the stream keeps single requests in an engine that
takes them one at a time and cancels them (run_stream). The decisions are recomputed from the stored rewards
whenever profiles are built, so turn_profiles says why each turn stopped (stop_reason, p_flip) without a table
of decisions.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pivot_assets.core.catalog import STOP_REASONS

# Helper columns profiler.profiles_sql computes for the rule (dropped before turn_profiles is written).
RULE_COLUMNS = ("reward_sum", "n_reward_values", "binary_rewards", "first_round_pass", "first_round_n")
PRIOR_MIN_TURNS = 20  # fewer first rounds than this: the flat Beta(1, 1) prior (it stops little, never rashly)
LOGPROB_FLOOR = -60.0  # the likelihood feature is clipped here: below it a sample equal to the action never occurs
PHI_BOUNDS = (0.05, 1000.0)  # the prior's concentration a + b


# -- the adv region: the rule in force as a predicate on a turn's final reward mean -------------------------------
@dataclass(frozen=True)
class AdvBounds:
    """The final reward means the adv set keeps under `rule` (curation/selection.py): pivotrl [0, lambda_diff];
    band (lo, hi), strict; std_min the means with sqrt(mean * (1 - mean)) >= min_std, the std of 0/1 rewards (a
    closed band around 0.5). Rewards in [0, 1] never vary more than 0/1 rewards of the same mean, so under std_min
    a mean outside the band is out for any rewards, and one inside it is in only for 0/1 rewards (`binary_only`)."""

    rule: str
    lo: float = -math.inf
    hi: float = math.inf
    open_ends: bool = False
    parameter: object = None  # the rule's setting as configured (the rollouts' identity)

    @classmethod
    def pivotrl(cls, lambda_diff: float) -> AdvBounds:
        return cls("pivotrl", hi=lambda_diff, parameter=lambda_diff)

    @classmethod
    def from_pivots(cls, pivots) -> AdvBounds:
        """The bounds of the rule in force (config pivots:); variance_top_p has none (core/config refuses it)."""
        if pivots.rule == "pivotrl":
            return cls.pivotrl(pivots.lambda_diff)
        if pivots.rule == "band":
            return cls("band", pivots.band[0], pivots.band[1], open_ends=True, parameter=list(pivots.band))
        if pivots.rule == "std_min":
            return cls("std_min", parameter=pivots.min_std)
        raise ValueError(f"pivots.rule {pivots.rule}: no per-turn bounds to settle a turn on")

    @property
    def binary_only(self) -> bool:
        return self.rule == "std_min"

    def contains(self, total, k) -> np.ndarray:
        """Whether a mixed turn with reward sum `total` over k samples is in the adv set (for 0/1 rewards under
        std_min). Computed as the profile computes its columns (profiler.profiles_sql): mean total / k, the 0/1
        variance total * (k - total) / k^2, so a sum on an end of the region is decided as selection decides it."""
        total, k = np.asarray(total, dtype=float), np.asarray(k, dtype=float)
        if self.rule == "std_min":
            return np.sqrt(np.clip(total * (k - total) / (k * k), 0.0, None)) >= self.parameter
        mean = total / k
        if self.open_ends:
            return (self.lo < mean) & (mean < self.hi)
        return (self.lo <= mean) & (mean <= self.hi)

    def inside(self, low, high, k) -> np.ndarray:
        """Whether every final sum in [low, high] is in the region (each region is an interval: its ends decide)."""
        return self.contains(low, k) & self.contains(high, k)

    def outside(self, low, high, k) -> np.ndarray:
        """Whether no final sum of a mixed turn (strictly between 0 and k) in [low, high] is in the region."""
        low = np.maximum(np.asarray(low, dtype=float), 0.0)
        high = np.minimum(np.asarray(high, dtype=float), k)
        if self.rule == "std_min":  # the variance is largest at the sum in [low, high] nearest k / 2
            return ~self.contains(np.clip(k / 2, low, high), k) | (high <= 0.0) | (low >= k)
        low, high = low / k, high / k
        if self.open_ends:
            return (high <= self.lo) | (low >= self.hi)
        lo, hi = max(self.lo, 0.0), min(self.hi, 1.0)
        # a closed end at 0 or 1 holds only unmixed turns: the mixed means are the open (0, 1)
        return (high < lo) | (low > hi) | (hi <= 0.0) | (lo >= 1.0)

    def identity(self) -> dict:
        """What the rule adds to the identity of adaptive samples: pivotrl its lambda_diff (the identity every
        pivotrl warehouse has), another rule its name and setting."""
        if self.rule == "pivotrl":
            return {"lambda_diff": self.parameter}
        return {"rule": self.rule, "rule_parameter": self.parameter}


def rule_bounds(cfg) -> AdvBounds:
    """The bounds adaptive stopping settles turns on under this config: the rule in force's when adaptive
    profiling is on (core/config refuses a rule without them), pivotrl's otherwise (nothing reads them then)."""
    if cfg.profiling.adaptive.enabled:
        return AdvBounds.from_pivots(cfg.pivots)
    return AdvBounds.pivotrl(cfg.pivots.lambda_diff)


def as_bounds(bounds: AdvBounds | float) -> AdvBounds:
    """A bare lambda_diff is the pivotrl rule's bounds."""
    return bounds if isinstance(bounds, AdvBounds) else AdvBounds.pivotrl(float(bounds))


# -- the exact rule -----------------------------------------------------------------------------------------
def exact_settled(n, total, distinct, k: int, bounds: AdvBounds | float, sets, binary=None) -> tuple[np.ndarray, dict]:
    """Per turn: is its membership in every one of `sets` (mixed, adv) settled after n samples with reward sum
    `total` and `distinct` distinct reward values, k in all? Also {set: membership where settled}. `binary`: whether
    each turn's rewards so far are all 0 or 1 (None: all are); a rule whose region holds only for 0/1 rewards
    (std_min) settles a turn with another reward at k only."""
    bounds = as_bounds(bounds)
    n, total, distinct = (np.asarray(x, dtype=float) for x in (n, total, distinct))
    m = k - n
    mixed = distinct >= 2
    done = m <= 0
    mixed_known = mixed | done | (k <= 1)  # one sample has no variance
    in_even_if = bounds.inside(total, total + m, k)  # in for every completion of the remaining rewards
    if bounds.binary_only and binary is not None:
        in_even_if = in_even_if & np.asarray(binary, dtype=bool)
    adv_in = mixed & in_even_if
    never_adv = bounds.outside(total, total + m, k) | (k <= 1)
    if bounds.binary_only and binary is not None:
        never_adv = never_adv & np.asarray(binary, dtype=bool)
    adv_now = mixed & bounds.contains(total, np.maximum(n, 1))
    adv_known = adv_in | never_adv | done
    known = {"mixed": mixed_known, "adv": adv_known}
    settled = np.logical_and.reduce([known[s] for s in sets])
    membership = {"mixed": mixed, "adv": np.where(done, adv_now, adv_in & ~never_adv)}
    return settled, membership


# -- the prior ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prior:
    """A Beta prior on each turn's pass rate: mean sigmoid(intercept + slope * z), z the standardized clipped
    expert log-likelihood (0 where unknown), concentration phi = a + b."""

    kind: str  # flat | pooled | likelihood
    intercept: float = 0.0
    slope: float = 0.0
    phi: float = 2.0
    center: float = 0.0
    scale: float = 1.0
    turns: int = 0  # first rounds it was fitted on

    def beta(self, logprob) -> tuple[np.ndarray, np.ndarray]:
        z = self.standardized(logprob)
        mean = 1.0 / (1.0 + np.exp(-(self.intercept + self.slope * z)))
        return mean * self.phi, (1.0 - mean) * self.phi

    def standardized(self, logprob) -> np.ndarray:
        x = np.array(logprob, dtype=float)  # None (no likelihood) -> nan -> z = 0
        z = (np.clip(x, LOGPROB_FLOOR, 0.0) - self.center) / self.scale
        return np.where(np.isnan(z), 0.0, z) if self.kind == "likelihood" else np.zeros_like(z)

    def as_metadata(self) -> dict:
        return {f"prior_{k}": (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


FLAT = Prior("flat", phi=2.0)


def fit_prior(kind: str, passes, n: int, logprob=None) -> Prior:
    """Maximum marginal likelihood of the first-round passes (each of n samples) under a beta-binomial whose
    Beta's mean is pooled or a logistic function of the likelihood feature. Too few turns: FLAT."""
    from scipy.optimize import minimize
    from scipy.special import betaln, expit

    passes = np.asarray(passes, dtype=float)
    if len(passes) < PRIOR_MIN_TURNS or n < 2:
        return FLAT
    x = np.full(len(passes), np.nan) if logprob is None else np.array(logprob, dtype=float)
    known = ~np.isnan(x)
    use_feature = kind == "likelihood" and known.sum() >= PRIOR_MIN_TURNS
    clipped = np.clip(x, LOGPROB_FLOOR, 0.0)
    center = float(np.nanmean(clipped)) if use_feature else 0.0
    scale = float(np.nanstd(clipped)) or 1.0 if use_feature else 1.0
    z = np.where(known, (clipped - center) / scale, 0.0) if use_feature else np.zeros(len(passes))
    log_choose = np.array([math.lgamma(n + 1) - math.lgamma(s + 1) - math.lgamma(n - s + 1) for s in passes])

    def negative_log_likelihood(theta):
        mean = np.clip(expit(theta[0] + theta[1] * z), 1e-9, 1 - 1e-9)
        phi = math.exp(theta[2])
        a, b = mean * phi, (1 - mean) * phi
        return -float(np.sum(log_choose + betaln(passes + a, n - passes + b) - betaln(a, b)))

    rate = np.clip(passes.mean() / n, 0.01, 0.99)
    start = np.array([math.log(rate / (1 - rate)), 0.0, 0.0])
    bounds = [(-12, 12), (-10, 10) if use_feature else (0, 0), tuple(math.log(v) for v in PHI_BOUNDS)]
    best = minimize(negative_log_likelihood, start, method="L-BFGS-B", bounds=bounds)
    return Prior("likelihood" if use_feature else "pooled", float(best.x[0]), float(best.x[1]),
                 float(math.exp(best.x[2])), center, scale, len(passes))


# -- the posterior rule ----------------------------------------------------------------------------------------
def flip_probability(n, passes, a, b, k: int, bounds: AdvBounds | float, sets) -> np.ndarray:
    """P(the membership in `sets` that n samples with `passes` passes give differs from the one at k samples),
    the remaining k - n passes beta-binomial under the Beta(a + passes, b + n - passes) posterior."""
    from scipy.special import betaln, gammaln

    bounds = as_bounds(bounds)
    n, s, a, b = (np.asarray(v, dtype=float) for v in (n, passes, a, b))
    m = np.maximum(k - n, 0)
    mixed_now = (s > 0) & (s < n)
    now = {"mixed": mixed_now, "adv": mixed_now & bounds.contains(s, np.maximum(n, 1))}
    a_post, b_post = a + s, b + (n - s)
    p_flip = np.zeros(len(n))
    for x in range(int(m.max(initial=0)) + 1):
        possible = x <= m
        log_pmf = (gammaln(m + 1) - gammaln(x + 1) - gammaln(np.maximum(m - x, 0) + 1)
                   + betaln(a_post + x, b_post + m - x) - betaln(a_post, b_post))
        final = s + x
        mixed_k = (final > 0) & (final < k)
        later = {"mixed": mixed_k, "adv": mixed_k & bounds.contains(final, k)}
        flips = np.logical_or.reduce([later[name] != now[name] for name in sets])
        p_flip += np.where(possible & flips, np.exp(np.where(possible, log_pmf, 0.0)), 0.0)
    return np.clip(p_flip, 0.0, 1.0)


# -- decisions ------------------------------------------------------------------------------------------------
@dataclass
class Decisions:
    """Per turn (in the order of the counts): settled, why sampling stops (or not), P(flip) (None: not computed)."""

    settled: np.ndarray
    stop_reason: list[str]
    p_flip: list[float | None]


def decide(counts: pa.Table, options, k: int, bounds: AdvBounds | float, prior: Prior | None) -> Decisions:
    """The rule in force on each turn's counts (profiler.profiles_sql rows). `options`: profiling.adaptive."""
    n = counts.column("k").to_numpy().astype(float)
    col = {c: counts.column(c).to_numpy(zero_copy_only=False) for c in RULE_COLUMNS + ("n_pass",)}
    at_k = n >= k
    if not options.enabled:
        reasons = np.where(at_k, "k_reached", "unsettled")
        return Decisions(at_k, reasons.tolist(), [None] * len(n))
    exact, _ = exact_settled(n, col["reward_sum"], col["n_reward_values"], k, bounds, options.sets,
                             binary=col["binary_rewards"].astype(bool))
    settled, reasons = at_k | exact, np.where(at_k, "k_reached", np.where(exact, "settled", "unsettled"))
    p_flip: list[float | None] = [None] * len(n)
    if options.rule == "posterior" and prior is not None:
        a, b = prior.beta(counts.column("expert_logprob").to_numpy(zero_copy_only=False))
        flips = flip_probability(n, col["n_pass"], a, b, k, bounds, options.sets)
        binary = col["binary_rewards"].astype(bool)
        flips = np.where(settled, 0.0, flips)
        stop = ~settled & binary & (flips < options.epsilon)
        reasons = np.where(stop, "posterior", reasons)
        settled = settled | stop
        p_flip = [float(v) if ok else None for v, ok in zip(flips, binary | at_k | exact)]
    assert set(reasons.tolist()) <= set(STOP_REASONS)
    return Decisions(settled, reasons.tolist(), p_flip)


def prior_for(counts: pa.Table, options, round_size: int) -> Prior | None:
    """The posterior rule's prior, fitted on the turns' first rounds (binary rewards only); None for the exact rule."""
    if not options.enabled or options.rule != "posterior":
        return None
    full = pc.and_(pc.equal(counts.column("first_round_n"), round_size), counts.column("binary_rewards"))
    first = counts.filter(full)
    return fit_prior(options.prior, first.column("first_round_pass").to_numpy(), round_size,
                     first.column("expert_logprob").to_pylist())


def annotate(counts: pa.Table, options, k: int, bounds: AdvBounds | float) -> tuple[pa.Table, Prior | None]:
    """turn_profiles from the profile rows: stop_reason and p_flip added, the rule's helper columns dropped."""
    prior = prior_for(counts, options, min(options.round_size, k))
    d = decide(counts, options, k, bounds, prior)
    out = counts.drop_columns(list(RULE_COLUMNS))
    out = out.append_column("stop_reason", pa.array(d.stop_reason, pa.string()))
    return out.append_column("p_flip", pa.array(d.p_flip, pa.float64())), prior


# -- rounds ---------------------------------------------------------------------------------------------------
def next_round(turns: list[str], counts: pa.Table, options, k: int, bounds: AdvBounds | float) -> tuple[dict[str, range], Prior | None]:
    """{turn: the sample indices of its next round} (empty when every turn is settled) and the prior in force.

    First, every turn without its first round gets it (and nothing is decided: the prior needs every first round);
    then each open turn gets the samples up to its next multiple of round_size (at most k)."""
    r = min(options.round_size, k)
    have = dict(zip(counts.column("turn_id").to_pylist(), counts.column("k").to_pylist()))
    first = {t: range(have.get(t, 0), r) for t in turns if have.get(t, 0) < r}
    if first:
        return first, None
    prior = prior_for(counts, options, r)
    d = decide(counts, options, k, bounds, prior)
    wanted = set(turns)
    todo = {}
    for turn, n, settled in zip(counts.column("turn_id").to_pylist(), counts.column("k").to_pylist(), d.settled):
        if turn in wanted and not settled and n < k:
            todo[turn] = range(n, min(k, (n // r + 1) * r))
    return todo, prior


def simulate(rewards: dict[str, list[float]], options, k: int, bounds: AdvBounds | float,
             logprob: dict[str, float | None] | None = None, calls: list[int] | None = None) -> dict[str, int]:
    """Replay the scheduler of `options` on stored rewards (each turn's rewards in sample order, at least k of
    them): how many samples each turn would get, and in `calls` the samples of each engine call. The pipeline's own
    decisions on the same rewards (bench/bench_adaptive.py)."""
    turns = sorted(rewards)
    if options.scheduler == "stream":
        return replay_stream(rewards, options, k, bounds, logprob or {}, calls)
    have: dict[str, int] = {}
    while True:
        counts = counts_table({t: rewards[t][: have[t]] for t in have}, options.round_size, logprob or {})
        if options.scheduler == "waves":
            todo = next_wave(turns, counts, options, k, bounds,
                             prior_for(counts, options, min(options.round_size, k)))
        else:
            todo, _ = next_round(turns, counts, options, k, bounds)
        if not todo:
            return have
        if calls is not None:
            calls.append(sum(len(r) for r in todo.values()))
        for turn, indices in todo.items():
            have[turn] = indices.stop


def counts_table(rewards: dict[str, list[float]], round_size: int, logprob: dict[str, float | None]) -> pa.Table:
    """The rule's columns (as profiles_sql computes them) from each turn's rewards in sample order."""
    rows = []
    for turn, values in sorted(rewards.items()):
        first = values[:round_size]
        rows.append({"turn_id": turn, "k": len(values), "n_pass": sum(v >= 1.0 for v in values),
                     "reward_sum": float(sum(values)), "n_reward_values": len(set(values)),
                     "binary_rewards": all(v in (0.0, 1.0) for v in values),
                     "first_round_pass": sum(v >= 1.0 for v in first), "first_round_n": len(first),
                     "expert_logprob": logprob.get(turn)})
    schema = pa.schema([("turn_id", pa.string()), ("k", pa.int32()), ("n_pass", pa.int32()),
                        ("reward_sum", pa.float64()), ("n_reward_values", pa.int32()), ("binary_rewards", pa.bool_()),
                        ("first_round_pass", pa.int32()), ("first_round_n", pa.int32()),
                        ("expert_logprob", pa.float64())])
    return pa.Table.from_pylist(rows, schema=schema)


def run_rounds(turns: list[str], counts: Callable[[], pa.Table], generate: Callable[[dict[str, range]], dict],
               score: Callable[[list[str]], dict], options, k: int, bounds: AdvBounds | float,
               log: Callable[[str], None] | None = None) -> dict:
    """Score what is unscored, decide, generate the next round; until no turn is open. Engine-agnostic: `generate`
    writes the rows of {turn: sample indices}, `score` scores the turns' unscored samples, `counts` reads the
    rule's columns per turn (profiler.Profiler)."""
    stats = {"rounds": 0, "rollouts_generated": 0, "generated_tokens": 0, "rollouts_scored": 0, "generation_s": 0.0}
    prior = None
    while True:
        stats["rollouts_scored"] += score(turns)["rollouts_scored"]
        todo, fitted = next_round(turns, counts(), options, k, bounds)
        prior = fitted or prior
        if not todo:
            break
        stats["rounds"] += 1
        if log:
            log(f"adaptive round {stats['rounds']}: {len(todo)} turns open, {sum(len(r) for r in todo.values())} "
                "samples to generate")
        done = generate(todo)
        stats["rollouts_generated"] += done.get("rollouts_generated", 0)
        stats["generated_tokens"] += done.get("generated_tokens", 0)
        stats["generation_s"] += done.get("generation_s", 0.0)
    if prior is not None:
        stats.update(prior.as_metadata())
    return stats


# -- waves: the scheduler without a round barrier --------------------------------------------------------------
def next_wave(order: list[str], counts: pa.Table, options, k: int, bounds: AdvBounds | float,
              prior: Prior | None) -> dict[str, range]:
    """{turn: sample indices} for the next engine call: about `options.wave_samples` samples (at least one turn's
    chunk), empty when every turn is settled. First the next chunk (up to the next multiple of round_size) of every
    sampled turn the rule leaves open, in `order`; then the first rounds of turns not sampled yet, in `order`
    (trajectory order: a conversation's turns go together, while their shared prefix is in the engine's cache)."""
    r = min(options.round_size, k)
    have = dict(zip(counts.column("turn_id").to_pylist(), counts.column("k").to_pylist()))
    settled = dict(zip(counts.column("turn_id").to_pylist(), decide(counts, options, k, bounds, prior).settled))
    started = [(t, range(have[t], min(k, (have[t] // r + 1) * r))) for t in order
               if have.get(t, 0) >= r and have[t] < k and not settled[t]]
    fresh = [(t, range(have.get(t, 0), r)) for t in order if have.get(t, 0) < r]
    todo: dict[str, range] = {}
    size = 0
    for turn, indices in started + fresh:
        if todo and size + len(indices) > options.wave_samples:
            break
        todo[turn], size = indices, size + len(indices)
    return todo


def run_waves(order: list[str], counts: Callable[[], pa.Table], generate: Callable[[dict[str, range]], dict],
              score: Callable[[list[str]], dict], options, k: int, bounds: AdvBounds | float,
              log: Callable[[str], None] | None = None) -> dict:
    """Engine calls of a fixed size instead of rounds: after each call its samples are scored, the rule decides on
    every sampled turn, and the call's freed room goes to the next turns, so no call waits for a round's last turn
    and no call shrinks until the last turns. The prior is refitted before every call on the first rounds in so
    far (flat until PRIOR_MIN_TURNS have one), so the last decisions use the prior `annotate` fits on every turn:
    the run ends with every turn settled under the rule turn_profiles reports (a turn stopped under an earlier fit
    and open under a later one is sampled on)."""
    r = min(options.round_size, k)
    stats = {"waves": 0, "rollouts_generated": 0, "generated_tokens": 0, "rollouts_scored": 0, "generation_s": 0.0,
             "wave_samples_mean": 0.0, "prior_fits": 0}
    prior, to_score, sizes = None, list(order), []
    while True:
        stats["rollouts_scored"] += score(to_score)["rollouts_scored"]
        table = counts()
        prior = prior_for(table, options, r)
        if prior is not None and prior.kind != FLAT.kind:
            stats["prior_fits"] += 1
            stats.setdefault("prior_first_fit_turns", prior.turns)
        todo = next_wave(order, table, options, k, bounds, prior)
        if not todo:
            break
        stats["waves"] += 1
        sizes.append(sum(len(v) for v in todo.values()))
        if log and (stats["waves"] == 1 or stats["waves"] % 20 == 0):
            log(f"adaptive wave {stats['waves']}: {len(todo)} turns, {sizes[-1]} samples")
        done = generate(todo)
        for key in ("rollouts_generated", "generated_tokens", "generation_s"):
            stats[key] += done.get(key, 0)
        to_score = list(todo)
    stats["wave_samples_mean"] = round(sum(sizes) / len(sizes), 1) if sizes else 0.0
    if prior is not None:
        stats.update(prior.as_metadata())
    return stats


# -- stream: single requests in flight, no engine call to wait for -----------------------------------------------
class RequestStream(Protocol):
    """An engine that takes one sample at a time and hands each back when it finishes (policies/vllm_backend.py
    VLLMBackend.stream: vLLM's add_request / step / abort_request)."""

    in_flight: int

    def add(self, turn_id: str, index: int) -> None: ...

    def abort(self, keys: list[tuple[str, int]]) -> None: ...

    def step(self) -> list: ...  # the samples finished in this engine step (turn_id, sample_index)

    def close(self) -> dict: ...  # cancel what is still in flight; the stream's own figures


def chunk_end(n: int, r: int, k: int) -> int:
    """The end of the chunk a turn with n samples is sampled to next: the next multiple of the round size (at most k);
    the rounds' and the waves' chunk, so every scheduler stops a turn at the same counts under the exact rule."""
    return min(k, (n // r + 1) * r)


class StreamScheduler:
    """Keeps `capacity` single-sample requests in the engine. A turn's samples are held until the chunk the rule
    asked for is complete; complete chunks are written (one part), scored and decided together once a quarter of
    the capacity is in, or at once when nothing else can be admitted. A settled turn's requests still in flight are
    aborted and what it drew beyond its chunk is dropped; an open turn's next chunk is admitted. Admission: the next
    chunks of open turns, then the first chunks of fresh turns (in `order`: a conversation's turns together, while
    the engine caches their prefix); capacity nothing needs is lent to the chunk after the one a turn is being
    sampled to (one chunk ahead at most; aborted if the turn settles). A turn's written samples are the chunks the
    rule asked for, in order: a prefix of the exhaustive profile, and under the exact rule the rounds' and the
    waves' samples. The prior is refitted at every decision on the first rounds in so far (as run_waves does)."""

    def __init__(self, order: list[str], counts: pa.Table, options, k: int, bounds: AdvBounds | float, capacity: int):
        self.order, self.options, self.k, self.bounds = order, options, k, bounds
        self.position = {t: i for i, t in enumerate(order)}
        self.r, self.capacity = min(options.round_size, k), max(1, capacity)
        self.flush_samples = max(self.r, self.capacity // 4)  # decide in groups: a decision costs a scoring query
        self.have: dict[str, int] = {}  # samples written per turn
        self.added: dict[str, int] = {}  # requests added per turn: indices below this are written, held or in flight
        self.flying: dict[str, set[int]] = {}
        self.held: dict[str, dict[int, object]] = {}  # finished samples not written yet
        self.active: list[str] = []  # started turns the rule leaves open, in `order`
        self._open: set[str] = set()  # the same, as a set
        self.next_fresh = 0  # order[next_fresh:] holds the turns not started yet
        self.prior: Prior | None = None
        self.stats = {"stream_steps": 0, "decisions": 0, "rollouts_aborted": 0, "rollouts_dropped": 0,
                      "in_flight_mean": 0.0, "prior_fits": 0}
        self._in_flight_sum = 0
        self.decide_all(counts)
        self.stats["decisions"] = 0  # the starting state is not a decision on samples this run drew

    def has_work(self) -> bool:
        """Whether any turn is open or not sampled yet (else the engine need not start)."""
        return bool(self.active) or any(self.have.get(t, 0) == 0 for t in self.order[self.next_fresh:])

    def decide_all(self, counts: pa.Table) -> None:
        """The rule on every sampled turn's written samples, under the prior refitted on them."""
        self.prior = prior_for(counts, self.options, self.r)
        if self.prior is not None and self.prior.kind != FLAT.kind:
            self.stats["prior_fits"] += 1
            self.stats.setdefault("prior_first_fit_turns", self.prior.turns)
        settled = decide(counts, self.options, self.k, self.bounds, self.prior).settled
        active = []
        for turn, n, done in zip(counts.column("turn_id").to_pylist(), counts.column("k").to_pylist(), settled):
            self.have[turn] = n
            self.added[turn] = max(self.added.get(turn, 0), n)
            if 0 < n and (n < self.r or (n < self.k and not done)):  # unsampled turns: admitted as fresh
                active.append(turn)
        self.active = sorted(active, key=lambda t: self.position.get(t, len(self.order)))
        self._open = set(self.active)
        self.stats["decisions"] += 1

    def is_open(self, turn: str) -> bool:
        return turn in self._open or self.have.get(turn, 0) == 0

    def chunk(self, turn: str) -> range:
        """The samples the rule asks of a turn now (its written samples up to the next chunk end)."""
        n = self.have.get(turn, 0)
        return range(n, chunk_end(n, self.r, self.k))

    # -- admission --------------------------------------------------------------------------------------------
    def admit(self, engine: RequestStream) -> None:
        room = self.capacity - engine.in_flight
        for turn in self.active:  # open turns' next chunks
            room = self._add(engine, turn, self.chunk(turn).stop, room)
        while room > 0 and self.next_fresh < len(self.order):  # fresh turns' first chunks
            turn = self.order[self.next_fresh]
            if self.have.get(turn, 0) > 0:  # sampled by an earlier run: the rule already knows it
                self.next_fresh += 1
                continue
            room = self._add(engine, turn, self.chunk(turn).stop, room)
            if self.added.get(turn, 0) >= self.chunk(turn).stop:
                self.active.append(turn)
                self._open.add(turn)
                self.next_fresh += 1
        for turn in self.active:  # lent: one chunk ahead of a turn in flight
            if self.flying.get(turn) and self.added[turn] == self.chunk(turn).stop < self.k:
                room = self._add(engine, turn, chunk_end(self.added[turn], self.r, self.k), room)

    def _add(self, engine: RequestStream, turn: str, stop: int, room: int) -> int:
        start = self.added.get(turn, self.have.get(turn, 0))
        for i in range(start, min(stop, start + max(room, 0))):
            engine.add(turn, i)
            self.flying.setdefault(turn, set()).add(i)
            self.added[turn] = i + 1
            room -= 1
        return room

    # -- returns and decisions ---------------------------------------------------------------------------------
    def take(self, samples: list) -> None:
        for s in samples:
            self.flying.get(s.turn_id, set()).discard(s.sample_index)
            self.held.setdefault(s.turn_id, {})[s.sample_index] = s

    def complete(self) -> list[str]:
        """The open turns whose asked-for chunk is all held."""
        return [t for t, got in self.held.items() if self.is_open(t) and all(i in got for i in self.chunk(t))]

    def should_decide(self, ready: list[str], engine: RequestStream) -> bool:
        """Enough complete chunks to be worth a decision, or room in the engine nothing asked for (after admit)."""
        if not ready:
            return False
        return sum(len(self.chunk(t)) for t in ready) >= self.flush_samples or engine.in_flight < self.capacity

    def ready_samples(self, ready: list[str]) -> list:
        """The complete chunks' samples (taken out of `held`); what a turn drew beyond its chunk stays held."""
        return [self.held[turn].pop(i) for turn in ready for i in self.chunk(turn)]

    def settle(self, engine: RequestStream) -> None:
        """After a decision: what settled turns still have in flight is aborted, what they hold is dropped."""
        for turn in [t for t in {*self.flying, *self.held} if not self.is_open(t)]:
            flying = sorted(self.flying.pop(turn, ()))
            if flying:
                engine.abort([(turn, i) for i in flying])
            self.stats["rollouts_aborted"] += len(flying)
            self.stats["rollouts_dropped"] += len(self.held.pop(turn, {}))
            self.added[turn] = self.have.get(turn, 0)

    def record_step(self, engine: RequestStream) -> None:
        self.stats["stream_steps"] += 1
        self._in_flight_sum += engine.in_flight

    def finish(self) -> dict:
        steps = self.stats["stream_steps"]
        self.stats["in_flight_mean"] = round(self._in_flight_sum / steps, 1) if steps else 0.0
        if self.prior is not None:
            self.stats.update(self.prior.as_metadata())
        return self.stats


def run_stream(order: list[str], counts: Callable[[], pa.Table], open_stream: Callable[[], RequestStream],
               write: Callable[[list], dict], score: Callable[[list[str]], dict], options, k: int, bounds: AdvBounds | float,
               capacity: int, log: Callable[[str], None] | None = None) -> dict:
    """The stream scheduler (StreamScheduler) over an engine's single requests. `open_stream` starts the engine's
    stream (called only when some turn needs samples), `write` stores samples as one part (and returns its counts),
    `score` scores the turns' unscored samples, `counts` reads the rule's columns."""
    score(order)  # samples written by an earlier, interrupted run
    plan = StreamScheduler(order, counts(), options, k, bounds, capacity)
    stats = {"rollouts_generated": 0, "generated_tokens": 0, "rollouts_scored": 0, "generation_s": 0.0,
             "decide_s": 0.0}  # decide_s: writing, scoring and deciding, while the engine waits
    if not plan.has_work():
        return {**stats, **plan.finish()}
    engine = open_stream()
    try:
        _stream_loop(plan, engine, write, score, counts, stats, log)
    finally:  # nothing of this run stays in the engine, whatever stopped it
        closed = engine.close()
    stats.update(generation_s=round(stats["generation_s"], 2), decide_s=round(stats["decide_s"], 2))
    return {**stats, **plan.finish(), **closed}


def _stream_loop(plan: StreamScheduler, engine: RequestStream, write, score, counts, stats: dict, log) -> None:
    while True:
        plan.admit(engine)
        ready = plan.complete()
        if plan.should_decide(ready, engine):
            t0 = time.perf_counter()
            written = write(plan.ready_samples(ready))
            stats["rollouts_generated"] += written.get("rows", 0)
            stats["generated_tokens"] += written.get("tokens", 0)
            stats["rollouts_scored"] += score(ready)["rollouts_scored"]
            plan.decide_all(counts())
            plan.settle(engine)
            stats["decide_s"] += time.perf_counter() - t0
            if log and plan.stats["decisions"] % 20 == 0:
                log(f"adaptive stream: {plan.stats['decisions']} decisions, {stats['rollouts_generated']} samples "
                    f"written, {engine.in_flight} in flight")
            continue
        if engine.in_flight == 0:
            break
        t0 = time.perf_counter()
        plan.take(engine.step())
        stats["generation_s"] += time.perf_counter() - t0
        plan.record_step(engine)


# -- the stream replayed on stored rewards (simulate) --------------------------------------------------------------
@dataclass
class ReplayedSample:
    turn_id: str
    sample_index: int


class ReplayEngine:
    """An engine replayed on stored rewards for simulate(): each request takes 1-4 steps (a fixed function of its
    turn and index, as completions differ in length), abort drops it."""

    def __init__(self):
        self.due: dict[tuple[str, int], int] = {}
        self.now = 0

    @property
    def in_flight(self) -> int:
        return len(self.due)

    def add(self, turn_id: str, index: int) -> None:
        self.due[(turn_id, index)] = self.now + 1 + zlib.crc32(f"{turn_id}#{index}".encode()) % 4

    def abort(self, keys: list[tuple[str, int]]) -> None:
        for key in keys:
            self.due.pop(key, None)

    def step(self) -> list[ReplayedSample]:
        self.now += 1
        done = [key for key, at in self.due.items() if at <= self.now]
        for key in done:
            del self.due[key]
        return [ReplayedSample(*key) for key in done]

    def close(self) -> dict:
        self.due.clear()
        return {}


def replay_stream(rewards: dict[str, list[float]], options, k: int, bounds: AdvBounds | float,
                  logprob: dict[str, float | None], calls: list[int] | None = None) -> dict[str, int]:
    """run_stream on stored rewards: how many samples each turn is written; `calls` gets the requests in flight
    at each engine step."""
    engine, written = ReplayEngine(), {}

    def write(samples: list) -> dict:
        for s in samples:
            assert s.sample_index == written.get(s.turn_id, 0), "a turn's written samples are a prefix"
            written[s.turn_id] = s.sample_index + 1
        return {"rows": len(samples)}

    def counts() -> pa.Table:
        return counts_table({t: rewards[t][:n] for t, n in written.items()}, options.round_size, logprob)

    if calls is not None:
        plain = engine.step

        def counted() -> list[ReplayedSample]:
            calls.append(engine.in_flight)
            return plain()
        engine.step = counted
    run_stream(sorted(rewards), counts, lambda: engine, write, lambda turns: {"rollouts_scored": 0}, options, k,
               bounds, options.wave_samples)
    return written
