"""Configs load from YAML and TOML; errors name the file and the bad field."""

import pytest

from dataengine.config import ConfigError, EngineConfig, load_config


def test_defaults_validate():
    cfg = load_config()
    assert isinstance(cfg, EngineConfig)
    assert cfg.search.pb_c_init == 1.25 and cfg.search.pb_c_base == 19652.0


def test_yaml_and_toml_give_the_same_config(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text("seed: 3\nsearch:\n  num_simulations: 32\n  algorithm: gumbel\n")
    t = tmp_path / "run.toml"
    t.write_text("seed = 3\n[search]\nnum_simulations = 32\nalgorithm = 'gumbel'\n")
    assert load_config(y) == load_config(t)
    assert load_config(y).search.num_simulations == 32


def test_overrides_apply_after_the_file(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text("search:\n  num_simulations: 32\n")
    cfg = load_config(y, search__num_simulations=8, seed=5)
    assert cfg.search.num_simulations == 8 and cfg.seed == 5


@pytest.mark.parametrize(
    "text, field",
    [
        ("search:\n  num_simulations: -1\n", "search.num_simulations"),
        ("search:\n  algorithm: beam\n", "search.algorithm"),
        ("policy:\n  modle: smollm2\n", "policy.modle"),
        ("sandbox:\n  timeout_s: soon\n", "sandbox.timeout_s"),
        ("derive:\n  balance_by: metadata.level\n", "derive.balance_by"),
    ],
)
def test_bad_field_is_named(tmp_path, text, field):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert field in str(err.value) and str(p) in str(err.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    p = tmp_path / "broken.toml"
    p.write_text("seed = = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    q = tmp_path / "run.ini"
    q.write_text("x")
    with pytest.raises(ConfigError, match="unknown suffix"):
        load_config(q)
    r = tmp_path / "list.yaml"
    r.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(r)
