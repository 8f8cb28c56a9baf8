"""pivot.yaml validation: every mistake is one line that names the key or path."""

import pytest

from pivot_assets.core.config import ConfigError, load_config


def write(tmp_path, text):
    p = tmp_path / "pivot.yaml"
    p.write_text(text)
    return p


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIVOT_CONFIG", raising=False)
    cfg = load_config()
    assert cfg.inputs is None
    assert cfg.warehouse_dir == tmp_path / "warehouse"
    assert cfg.policy.k == 8 and cfg.pivots.lambda_diff == 0.6


def test_relative_paths_resolve_against_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("{}\n")
    p = write(tmp_path, "warehouse: ./wh\ninputs:\n  - path: data/*.jsonl\n    domain: airline\n")
    monkeypatch.chdir("/")
    cfg = load_config(p)
    assert cfg.warehouse_dir == tmp_path / "wh"
    assert cfg.resolve(cfg.inputs[0].path) == tmp_path / "data" / "*.jsonl"
    assert cfg.inputs[0].format == "auto" and cfg.inputs[0].domain == "airline"


def test_env_var_picks_the_file(tmp_path, monkeypatch):
    p = write(tmp_path, "policy: {k: 3}\n")
    monkeypatch.setenv("PIVOT_CONFIG", str(p))
    assert load_config().policy.k == 3


@pytest.mark.parametrize(
    "text, expected",
    [
        ("warehous: ./x\n", "unknown key 'warehous'"),
        ("policy: {kk: 3}\n", "unknown key 'policy.kk'"),
        ("policy: {k: many}\n", "policy.k"),
        ("pivots: {lambda_diff: 1.5}\n", "pivots.lambda_diff"),
        ("inputs:\n  - path: nowhere/*.jsonl\n", "inputs.0.path: no such file"),
        ("inputs:\n  - path: x.jsonl\n    format: csv\n", "inputs.0.format"),
        ("verifier: {defaults: {name: exact}}\n", "unknown key 'verifier.defaults'"),
        ("policy: [1, 2\n", "invalid YAML"),
        ("- a\n- b\n", "top level must be a mapping"),
    ],
)
def test_errors_are_one_line_and_name_the_key(tmp_path, text, expected):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    msg = str(err.value)
    assert expected in msg
    assert "\n" not in msg


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
