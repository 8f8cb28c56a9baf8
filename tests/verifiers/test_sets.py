"""verifiers/sets.py: a config's verifier sets, resolved once; a bad spec is a one-line ConfigError naming its key."""

import pytest

from pivot_assets.core.config import ConfigError, load_config
from pivot_assets.verifiers import VerifierSets


def test_reward_falls_back_to_the_profiling_set_and_exact_needs_an_ablation():
    sets = VerifierSets.from_config(load_config(overrides={"verifier": {"default": {"name": "tool_name"}}}))
    assert sets.reward is sets.profiling and sets.exact is None
    sets = VerifierSets.from_config(load_config(overrides={"training": {"reward_verifier": {"default": "exact"}},
                                                           "ablation": {}}))
    assert sets.reward.default.name == "exact" and sets.profiling.default.name == "tool_call"
    assert sets.exact.default.name == "exact"


@pytest.mark.parametrize("overrides, expected", [
    ({"verifier": {"default": {"name": "tool_cal"}}}, "verifier.default: unknown verifier 'tool_cal' (known: "),
    ({"verifier": {"domains": {"swe": {"name": "tool_name", "bogus": 1}}}},
     "verifier.domains.swe: verifier 'tool_name': unknown parameter 'bogus'"),
    ({"training": {"reward_verifier": {"default": "nope"}}}, "training.reward_verifier.default: unknown verifier 'nope'"),
    ({"ablation": {"exact_verifier": {"default": {"name": "exact", "x": 1}}}},
     "ablation.exact_verifier.default: verifier 'exact': unknown parameter 'x'"),
])
def test_a_bad_verifier_is_a_config_error_naming_the_key(tmp_path, overrides, expected):
    path = tmp_path / "pivot.yaml"
    path.write_text("warehouse: ./wh\n")
    with pytest.raises(ConfigError) as err:
        VerifierSets.from_config(load_config(path, overrides=overrides))
    assert str(err.value).startswith(f"{path}: {expected}") and "\n" not in str(err.value)
