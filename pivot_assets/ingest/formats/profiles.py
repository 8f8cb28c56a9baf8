"""A pivot row's own profile (Dagster-free): the reference policy's pass rate a NeMo-Gym pivot row carries.

NVIDIA's released pivot sets (Conversational-Tool-Use-Pivot-v1) and this project's NeMo-Gym export
(curation/exports.nemo_gym_rows) give each row
    pass_rate          n_pass / k
    pass_rate_total    k, the samples drawn
    pass_rate_passed   n_pass, the samples that passed
    <model>_info       {rewards?, reward_mean, reward_std, reward_var}: the profile object, named after the model
                       that sampled (NeMo-RL's pivot data script reads `qwen_235b_info.reward_mean`)
`row_profile` turns them into one profile {model, k, n_pass, reward_mean, reward_var, reward_std, rewards}; a row
with none of them (or all null: an unprofiled turn) has none. A malformed field is a RecordError ("bad_profile:
..."): the responses adapter raises it, so the row is quarantined with that reason, never ingested without its
profile.
Derivation: k from pass_rate_total, else the length of rewards; n_pass from pass_rate_passed, else the rewards
that reach 1, else pass_rate * k (when that is a whole number); reward_mean / reward_var from the profile object, else from rewards (population variance, as
profiling/profiler.profiles_sql), else from the pass rate (binary rewards: var = mean * (1 - mean)).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .records import RecordError

PASS_RATE_KEYS = ("pass_rate", "pass_rate_total", "pass_rate_passed")
PROFILE_SUFFIX = "_info"
INFO_KEYS = ("rewards", "reward_mean", "reward_std", "reward_var")
TOLERANCE = 1e-6  # stated rounding slack for figures written elsewhere (a pass rate printed to 6 digits)


def row_profile(value: dict) -> dict | None:
    """The row's profile, None when it carries none; RecordError("bad_profile", ...) when a field is malformed."""
    model, info = _profile_object(value)
    rates = {key: value.get(key) for key in PASS_RATE_KEYS}
    if all(v is None for v in rates.values()) and all(info.get(key) is None for key in INFO_KEYS):
        return None
    rewards = _rewards(info.get("rewards"))
    k = _count(rates["pass_rate_total"], "pass_rate_total", minimum=1)
    k = len(rewards) if k is None and rewards is not None else k
    if k is None:
        raise RecordError("bad_profile", "no sample count: pass_rate_total is missing and there are no rewards")
    if rewards is not None and len(rewards) != k:
        raise RecordError("bad_profile", f"{len(rewards)} rewards but pass_rate_total {k}")
    n_pass = _count(rates["pass_rate_passed"], "pass_rate_passed", minimum=0)
    n_pass = sum(r >= 1.0 for r in rewards) if n_pass is None and rewards is not None else n_pass
    if n_pass is not None and n_pass > k:
        raise RecordError("bad_profile", f"pass_rate_passed {n_pass} > pass_rate_total {k}")
    pass_rate = _unit(rates["pass_rate"], "pass_rate")
    if n_pass is None and pass_rate is not None:
        n_pass = round(pass_rate * k)
    if n_pass is None:
        raise RecordError("bad_profile", "no pass count: pass_rate_passed, rewards and pass_rate are all missing")
    if pass_rate is not None and abs(pass_rate - n_pass / k) > TOLERANCE:
        raise RecordError("bad_profile", f"pass_rate {pass_rate} is not pass_rate_passed / pass_rate_total = {n_pass}/{k}")
    mean, var = _moments(info, rewards, n_pass / k)
    return {"model": model, "k": k, "n_pass": n_pass, "reward_mean": mean, "reward_var": var,
            "reward_std": math.sqrt(var), "rewards": rewards}


def _profile_object(value: dict) -> tuple[str | None, dict]:
    """(model, profile object) from the one `<model>_info` key holding reward figures; (None, {}) when none."""
    found = []
    for key, block in value.items():
        if not isinstance(key, str) or not key.endswith(PROFILE_SUFFIX) or len(key) == len(PROFILE_SUFFIX):
            continue
        if isinstance(block, str) and block[:1] == "{":  # Parquet / HF datasets may hold it as JSON text
            try:
                block = json.loads(block)
            except json.JSONDecodeError as e:
                raise RecordError("bad_profile", f"{key} is not JSON ({e.msg})") from None
        if isinstance(block, dict) and any(name in block for name in INFO_KEYS):
            found.append((key[: -len(PROFILE_SUFFIX)], block))
        elif block is not None and not isinstance(block, dict):
            raise RecordError("bad_profile", f"{key} is a {type(block).__name__}, expected an object")
    if len(found) > 1:
        raise RecordError("bad_profile", f"two profile objects ({', '.join(m + PROFILE_SUFFIX for m, _ in found)})")
    return found[0] if found else (None, {})


def _moments(info: dict, rewards: list[float] | None, pass_rate: float | None) -> tuple[float, float]:
    mean = _unit(info.get("reward_mean"), "reward_mean")
    var = _number(info.get("reward_var"), "reward_var")
    std = _number(info.get("reward_std"), "reward_std")
    if rewards is not None:
        from_rewards = sum(rewards) / len(rewards)
        mean = from_rewards if mean is None else mean
        var = sum((r - from_rewards) ** 2 for r in rewards) / len(rewards) if var is None else var
    mean = pass_rate if mean is None else mean
    if mean is None:
        raise RecordError("bad_profile", "no reward mean: reward_mean, rewards and pass_rate are all missing")
    if var is None and std is not None:
        var = std * std
    var = mean * (1 - mean) if var is None else var
    if not 0 <= var <= 0.25 + TOLERANCE:
        raise RecordError("bad_profile", f"reward_var {var} outside [0, 0.25] (the variance of [0, 1] rewards)")
    if std is not None and abs(std - math.sqrt(var)) > TOLERANCE:
        raise RecordError("bad_profile", f"reward_std {std} is not sqrt(reward_var {var})")
    return mean, min(var, 0.25)


def _rewards(value: Any) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise RecordError("bad_profile", f"rewards is {_shown(value)}, expected a non-empty list of numbers")
    return [_unit(r, f"rewards[{i}]") for i, r in enumerate(value)]


def _count(value: Any, name: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RecordError("bad_profile", f"{name} is {_shown(value)}, expected an integer >= {minimum}")
    return value


def _unit(value: Any, name: str) -> float | None:
    number = _number(value, name)
    if number is not None and not 0.0 <= number <= 1.0:
        raise RecordError("bad_profile", f"{name} is {number}, outside [0, 1]")
    return number


def _number(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError("bad_profile", f"{name} is {_shown(value)}, expected a finite number")
    if value < 0:
        raise RecordError("bad_profile", f"{name} is {value}, expected >= 0")
    return float(value)


def _shown(value: Any) -> str:
    return repr(value)[:40] if isinstance(value, (str, int, float, bool)) else f"a {type(value).__name__}"
