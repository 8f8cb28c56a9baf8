"""Adaptive profiling (Dagster-free): sample each turn in rounds and stop once its pivot-set membership is settled.

Membership after k samples (curation/selection.py): mixed = the rewards are not all equal (reward_var > 0);
adv = mixed and reward_mean <= lambda_diff. After n of k samples with reward sum T and D distinct reward values,
m = k - n samples are still to come, each with a reward in [0, 1], so the final sum lies in [T, T + m]:

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
off, a smaller epsilon, a larger k) generates only the samples a turn lacks. The rounds are synchronous: every
profiled turn first gets its first round (the prior's data), then each round samples the turns still open, is
scored, and the rule decides. The decisions are recomputed from the stored rewards whenever profiles are built,
so turn_profiles says why each turn stopped (stop_reason, p_flip) without a table of decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pivot_assets.core.catalog import STOP_REASONS

# Helper columns profiler.profiles_sql computes for the rule (dropped before turn_profiles is written).
RULE_COLUMNS = ("reward_sum", "n_reward_values", "binary_rewards", "first_round_pass", "first_round_n")
PRIOR_MIN_TURNS = 20  # fewer first rounds than this: the flat Beta(1, 1) prior (it stops little, never rashly)
LOGPROB_FLOOR = -60.0  # the likelihood feature is clipped here: below it a sample equal to the action never occurs
PHI_BOUNDS = (0.05, 1000.0)  # the prior's concentration a + b


# -- the exact rule -----------------------------------------------------------------------------------------
def exact_settled(n, total, distinct, k: int, lambda_diff: float, sets) -> tuple[np.ndarray, dict]:
    """Per turn: is its membership in every one of `sets` (mixed, adv) settled after n samples with reward sum
    `total` and `distinct` distinct reward values, k in all? Also {set: membership where settled}."""
    n, total, distinct = (np.asarray(x, dtype=float) for x in (n, total, distinct))
    m = k - n
    mixed = distinct >= 2
    done = m <= 0
    mixed_known = mixed | done | (k <= 1)  # one sample has no variance
    hard_even_if_all_pass = (total + m) / k <= lambda_diff
    adv_in = mixed & hard_even_if_all_pass
    never_adv = (total / k > lambda_diff) | (lambda_diff <= 0) | (k <= 1)
    adv_now = mixed & (total / np.maximum(n, 1) <= lambda_diff)
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
def flip_probability(n, passes, a, b, k: int, lambda_diff: float, sets) -> np.ndarray:
    """P(the membership in `sets` that n samples with `passes` passes give differs from the one at k samples),
    the remaining k - n passes beta-binomial under the Beta(a + passes, b + n - passes) posterior."""
    from scipy.special import betaln, gammaln

    n, s, a, b = (np.asarray(v, dtype=float) for v in (n, passes, a, b))
    m = np.maximum(k - n, 0)
    mixed_now = (s > 0) & (s < n)
    now = {"mixed": mixed_now, "adv": mixed_now & (s / np.maximum(n, 1) <= lambda_diff)}
    a_post, b_post = a + s, b + (n - s)
    p_flip = np.zeros(len(n))
    for x in range(int(m.max(initial=0)) + 1):
        possible = x <= m
        log_pmf = (gammaln(m + 1) - gammaln(x + 1) - gammaln(np.maximum(m - x, 0) + 1)
                   + betaln(a_post + x, b_post + m - x) - betaln(a_post, b_post))
        final = s + x
        mixed_k = (final > 0) & (final < k)
        later = {"mixed": mixed_k, "adv": mixed_k & (final / k <= lambda_diff)}
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


def decide(counts: pa.Table, options, k: int, lambda_diff: float, prior: Prior | None) -> Decisions:
    """The rule in force on each turn's counts (profiler.profiles_sql rows). `options`: profiling.adaptive."""
    n = counts.column("k").to_numpy().astype(float)
    col = {c: counts.column(c).to_numpy(zero_copy_only=False) for c in RULE_COLUMNS + ("n_pass",)}
    at_k = n >= k
    if not options.enabled:
        reasons = np.where(at_k, "k_reached", "unsettled")
        return Decisions(at_k, reasons.tolist(), [None] * len(n))
    exact, _ = exact_settled(n, col["reward_sum"], col["n_reward_values"], k, lambda_diff, options.sets)
    settled, reasons = at_k | exact, np.where(at_k, "k_reached", np.where(exact, "settled", "unsettled"))
    p_flip: list[float | None] = [None] * len(n)
    if options.rule == "posterior" and prior is not None:
        a, b = prior.beta(counts.column("expert_logprob").to_numpy(zero_copy_only=False))
        flips = flip_probability(n, col["n_pass"], a, b, k, lambda_diff, options.sets)
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


def annotate(counts: pa.Table, options, k: int, lambda_diff: float) -> tuple[pa.Table, Prior | None]:
    """turn_profiles from the profile rows: stop_reason and p_flip added, the rule's helper columns dropped."""
    prior = prior_for(counts, options, min(options.round_size, k))
    d = decide(counts, options, k, lambda_diff, prior)
    out = counts.drop_columns(list(RULE_COLUMNS))
    out = out.append_column("stop_reason", pa.array(d.stop_reason, pa.string()))
    return out.append_column("p_flip", pa.array(d.p_flip, pa.float64())), prior


# -- rounds ---------------------------------------------------------------------------------------------------
def next_round(turns: list[str], counts: pa.Table, options, k: int, lambda_diff: float) -> tuple[dict[str, range], Prior | None]:
    """{turn: the sample indices of its next round} (empty when every turn is settled) and the prior in force.

    First, every turn without its first round gets it (and nothing is decided: the prior needs every first round);
    then each open turn gets the samples up to its next multiple of round_size (at most k)."""
    r = min(options.round_size, k)
    have = dict(zip(counts.column("turn_id").to_pylist(), counts.column("k").to_pylist()))
    first = {t: range(have.get(t, 0), r) for t in turns if have.get(t, 0) < r}
    if first:
        return first, None
    prior = prior_for(counts, options, r)
    d = decide(counts, options, k, lambda_diff, prior)
    wanted = set(turns)
    todo = {}
    for turn, n, settled in zip(counts.column("turn_id").to_pylist(), counts.column("k").to_pylist(), d.settled):
        if turn in wanted and not settled and n < k:
            todo[turn] = range(n, min(k, (n // r + 1) * r))
    return todo, prior


def simulate(rewards: dict[str, list[float]], options, k: int, lambda_diff: float,
             logprob: dict[str, float | None] | None = None, calls: list[int] | None = None) -> dict[str, int]:
    """Replay the scheduler of `options` on stored rewards (each turn's rewards in sample order, at least k of
    them): how many samples each turn would get, and in `calls` the samples of each engine call. The pipeline's own
    decisions on the same rewards (bench/bench_adaptive.py)."""
    turns = sorted(rewards)
    have: dict[str, int] = {}
    while True:
        counts = counts_table({t: rewards[t][: have[t]] for t in have}, options.round_size, logprob or {})
        if options.scheduler == "waves":
            todo = next_wave(turns, counts, options, k, lambda_diff,
                             prior_for(counts, options, min(options.round_size, k)))
        else:
            todo, _ = next_round(turns, counts, options, k, lambda_diff)
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
               score: Callable[[list[str]], dict], options, k: int, lambda_diff: float,
               log: Callable[[str], None] | None = None) -> dict:
    """Score what is unscored, decide, generate the next round; until no turn is open. Engine-agnostic: `generate`
    writes the rows of {turn: sample indices}, `score` scores the turns' unscored samples, `counts` reads the
    rule's columns per turn (profiler.Profiler)."""
    stats = {"rounds": 0, "rollouts_generated": 0, "generated_tokens": 0, "rollouts_scored": 0, "generation_s": 0.0}
    prior = None
    while True:
        stats["rollouts_scored"] += score(turns)["rollouts_scored"]
        todo, fitted = next_round(turns, counts(), options, k, lambda_diff)
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
def next_wave(order: list[str], counts: pa.Table, options, k: int, lambda_diff: float,
              prior: Prior | None) -> dict[str, range]:
    """{turn: sample indices} for the next engine call: about `options.wave_samples` samples (at least one turn's
    chunk), empty when every turn is settled. First the next chunk (up to the next multiple of round_size) of every
    sampled turn the rule leaves open, in `order`; then the first rounds of turns not sampled yet, in `order`
    (trajectory order: a conversation's turns go together, while their shared prefix is in the engine's cache)."""
    r = min(options.round_size, k)
    have = dict(zip(counts.column("turn_id").to_pylist(), counts.column("k").to_pylist()))
    settled = dict(zip(counts.column("turn_id").to_pylist(), decide(counts, options, k, lambda_diff, prior).settled))
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
              score: Callable[[list[str]], dict], options, k: int, lambda_diff: float,
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
        todo = next_wave(order, table, options, k, lambda_diff, prior)
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
