"""Configs load from YAML and TOML; errors name the file and the bad field."""

from pathlib import Path

import pytest

from dataengine.config import ConfigError, EngineConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "docs" / "configs"  # the config files docs/ commands use


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


def test_round_settings_change_later_rounds_only(tmp_path):
    """A pipeline round_settings entry holds from its round on; round 0 and earlier rounds keep the engine's."""
    from dataengine.evaluation.experiment import experiment_config
    from flows.pipeline import Journal, round_engine

    cfg = experiment_config(out=str(tmp_path), suites=["arithmetic"], model="tiny", rounds=3,
                            overrides={"engine__search__objective": "success",
                                       "round_settings__2__search.objective": "efficient_success",
                                       "round_settings__2__train.dpo.max_steps": -1,
                                       "round_settings__3__derive": {"balance_kinds": ["sft"]}})
    assert cfg.round_settings[3] == {"derive.balance_kinds": ["sft"]}
    r1, r2, r3 = (round_engine(cfg, r) for r in (1, 2, 3))
    assert r1 == cfg.engine and round_engine(cfg, 0) == cfg.engine
    assert (r2.search.objective, r2.train.dpo.max_steps) == ("efficient_success", -1)
    assert r3.search.objective == "efficient_success" and r3.derive.balance_kinds == ["sft"]
    assert r2.derive.balance_kinds == cfg.engine.derive.balance_kinds
    # Round settings are part of the journal's config: another schedule is another pipeline.
    Journal(tmp_path / "j.json", cfg).save()
    plain = experiment_config(out=str(tmp_path), suites=["arithmetic"], model="tiny", rounds=3,
                              overrides={"engine__search__objective": "success"})
    with pytest.raises(ValueError, match="another pipeline config"):
        Journal(tmp_path / "j.json", plain)


@pytest.mark.parametrize(("setting", "message"), [
    ({"round_settings__2__search.objectiv": "x"}, "no setting 'search.objectiv'"),
    ({"round_settings__2__nosuch.objective": "x"}, "no setting 'nosuch.objective'"),
    ({"round_settings__2__search.objective.deeper": "x"}, "no setting 'search.objective.deeper'"),
    ({"round_settings__2__search.objective": "most"}, "search.objective"),
    ({"round_settings__0__search.objective": "success"}, "rounds count from 1"),
    ({"round_settings__2__policy.model": "smollm2"}, "'policy.model' cannot change"),
])
def test_round_settings_refuse_bad_paths_values_and_rounds(tmp_path, setting, message):
    from dataengine.evaluation.experiment import experiment_config

    with pytest.raises(ConfigError, match=message):
        experiment_config(out=str(tmp_path), suites=["arithmetic"], model="tiny", overrides=setting)


def test_round_trainers_change_later_rounds_only(tmp_path):
    """A round_trainers entry holds from its round on; an empty one leaves the journal key as it was."""
    from dataengine.commands.experiment import experiment_overrides
    from dataengine.evaluation.experiment import experiment_config
    from dataengine.types import stable_hash
    from flows.pipeline import Journal, round_trainers

    common = dict(out=str(tmp_path), suites=["arithmetic"], model="tiny", rounds=3, trainers=["sft", "dpo"])
    cfg = experiment_config(**common, overrides={"round_trainers__2": ["sft"]})
    assert [round_trainers(cfg, r) for r in (1, 2, 3)] == [["sft", "dpo"], ["sft"], ["sft"]]
    assert experiment_config(**common, overrides=experiment_overrides(None, ["round_trainers.2=[sft]"], None)) == cfg
    later = experiment_config(**common, overrides={"round_trainers__2": ["sft"], "round_trainers__3": ["dpo", "grpo"]})
    assert [round_trainers(later, r) for r in (1, 2, 3)] == [["sft", "dpo"], ["sft"], ["dpo", "grpo"]]
    plain = experiment_config(**common)
    assert plain.round_trainers == {}
    assert Journal(tmp_path / "a.json", plain).key != Journal(tmp_path / "b.json", cfg).key
    # journals written before the field existed: the key of a config without it is unchanged
    assert Journal(tmp_path / "p.json", plain).key == stable_hash(
        plain.model_dump(mode="json", exclude={"runtime", "rounds", "round_settings", "round_trainers"}))
    for bad, message in (({"round_trainers__0": ["sft"]}, "rounds count from 1"),
                         ({"round_trainers__2": []}, "at least one trainer"),
                         ({"round_trainers__2": ["ppo"]}, "round_trainers")):
        with pytest.raises(ConfigError, match=message):
            experiment_config(**common, overrides=bad)


def test_round_set_option_parses_round_path_and_yaml_value():
    import typer

    from dataengine.commands.experiment import _round_settings

    assert _round_settings(["2:engine.search.objective=efficient_success", "2:derive.balance_kinds=[sft]",
                            "3:train.dpo.max_steps=-1"]) == {
        2: {"search.objective": "efficient_success", "derive.balance_kinds": ["sft"]}, 3: {"train.dpo.max_steps": -1}}
    for bad in ("search.objective=x", "two:search.objective=x", "2:search.objective"):
        with pytest.raises(typer.BadParameter, match="ROUND:engine.dotted.name=value"):
            _round_settings([bad])


# docs/configs/experiment-arithmetic.yaml spelled as --set / --round-set flags.
EXPERIMENT_SETS = [
    "engine.search.max_generated_tokens=1000", "engine.search.num_actions=2", "engine.search.num_simulations=64",
    "engine.search.value=reference", "engine.search.objective=success", "engine.search.widen_arguments=true",
    "engine.search.pb_c_init=0.5", "engine.search.solved_policy=stop", "engine.shard_size=16",
    "engine.search.trees_per_batch=16", "engine.search.greedy_candidate=true", "engine.policy.temperature=0.7", "engine.policy.max_new_tokens=48",
    "engine.eval.max_new_tokens=48", "engine.eval.search=false", "engine.train.sft.num_train_epochs=2",
    "engine.train.sft.max_steps=66", "engine.train.dpo.max_steps=16", "engine.derive.balance_by=level,decision",
    "round_trainers.2=[sft]",
]
EXPERIMENT_ROUND_SETS = [
    "2:search.objective=efficient_success", "2:derive.sft_fewest_steps=true",
]


def test_experiment_config_file_equals_the_readme_flags(tmp_path):
    """docs/configs/experiment-arithmetic.yaml is the flags' pipeline: same config, same journal key
    (so either spelling resumes the other's run)."""
    from dataengine.commands.experiment import experiment_overrides
    from dataengine.evaluation.experiment import experiment_config
    from flows.pipeline import Journal, round_engine, round_trainers

    common = dict(out=str(tmp_path), suites=["arithmetic"], rounds=2, train_tasks=40, heldout_tasks=100,
                  model="smollm2", trainers=["sft", "dpo"])
    flags = experiment_config(**common, overrides=experiment_overrides(None, EXPERIMENT_SETS, EXPERIMENT_ROUND_SETS))
    path = CONFIGS / "experiment-arithmetic.yaml"
    from_file = experiment_config(**common, overrides=experiment_overrides(path, None, None))
    assert from_file == flags
    assert Journal(tmp_path / "j.json", from_file).key == Journal(tmp_path / "j.json", flags).key
    r2 = round_engine(from_file, 2)
    assert (r2.search.objective, r2.derive.sft_fewest_steps) == ("efficient_success", True)
    assert round_engine(from_file, 1).search.objective == "success"
    # round 2 trains SFT only (no DPO)
    assert round_trainers(from_file, 1) == ["sft", "dpo"] and round_trainers(from_file, 2) == ["sft"]
    # --set still overrides the file
    changed = experiment_config(**common, overrides=experiment_overrides(path, ["engine.search.num_simulations=8"], None))
    assert changed.engine.search.num_simulations == 8


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_validates(tmp_path, name):
    """The config files docs/ commands point at load: those with an `engine` section as pipeline
    configs through `dataengine experiment --config`, the others as engine configs
    (`dataengine generate --config`)."""
    from dataengine.commands.experiment import experiment_overrides
    from dataengine.config import load_config, read_mapping
    from dataengine.evaluation.experiment import experiment_config

    path = CONFIGS / name
    if "engine" in read_mapping(path):
        cfg = experiment_config(out=str(tmp_path), suites=["units"], overrides=experiment_overrides(path, None, None))
        assert cfg.round_settings and cfg.engine.search.num_simulations == 64
    else:
        assert load_config(path).search.num_simulations == 64
