"""Generation runs with the tiny model: store rows per shard, lineage, resume, baselines with
budget accounting, and the `dataengine generate` command."""

from __future__ import annotations

import json

import pytest
from engine_configs import tiny_engine_config
from typer.testing import CliRunner

from dataengine.cli import app
from dataengine.config import ConfigError
from dataengine.search import TokenBudget, play_episodes
from dataengine.stages import make_reward
from dataengine.stages.generate import Shard, check_no_overlap, default_run_id, generate, settings_key, shards
from dataengine.suites import generate_suite
from storage import Store


@pytest.fixture(scope="module")
def tasks():
    return generate_suite("arithmetic", n_train=4, n_heldout=0, seed=0)


def config(store, **overrides):
    return tiny_engine_config(store, **overrides)


def test_shards_name_task_ranges(tasks):
    assert [s.shard_id for s in shards(tasks, 3)] == ["tasks-000000-000002", "tasks-000003-000003"]
    assert [s.index for s in shards(tasks, 3)] == [0, 1]
    with pytest.raises(ValueError, match="shard_size"):
        shards(tasks, 0)


def test_generate_writes_trees_lineage_and_resumes(tmp_path, env, tiny, tasks):
    # Without widening and the greedy candidate the tiny model's trees sample only at their roots
    # (counted below): its K samples merge into one terminal edge.
    cfg = config(tmp_path / "store", search__widening=False, search__greedy_candidate=False)
    first = generate(cfg, tasks=tasks[:2], run_id="r1", policy=tiny, env=env, progress=False)
    assert first.shards_written == 1 and first.trees == 2
    store = Store(tmp_path / "store")
    assert store.committed_shards("tasks", "r1") == {"tasks-000000-000001"}
    # A rerun over all four tasks searches only the shard that is not committed.
    sequences = tiny.stats.sequences
    second = generate(cfg, tasks=tasks, run_id="r1", policy=tiny, env=env, progress=False)
    assert second.shards_skipped == 1 and second.shards_written == 1 and second.trees == 2
    assert tiny.stats.sequences - sequences == 2 * 2  # two roots x K=2, nothing for the skipped shard
    third = generate(cfg, tasks=tasks, run_id="r1", policy=tiny, env=env, progress=False)
    assert third.shards_written == 0 and third.shards_skipped == 2

    nodes = store.nodes().collect()
    trajs = store.trajectories().collect()
    assert set(nodes["tree_id"]) == {t.id for t in tasks}
    assert nodes.filter(nodes["node_id"] == 0).height == 4
    assert (trajs["source"] == "mcts").all() and trajs.height == nodes["terminal"].sum()
    assert first.nodes + second.nodes == nodes.height
    run = store.runs().collect().to_dicts()[0]
    assert run["kind"] == "generate" and run["model_id"] == tiny.model_id and run["seed"] == 0
    assert json.loads(run["config_json"])["engine"]["search"]["num_simulations"] == 3
    assert "final_answer" in json.loads(run["verifier_versions_json"])
    assert store.tasks().collect().height == 4


def test_a_run_refuses_a_second_shard_layout(tmp_path, env, tiny, tasks):
    """A run resumed over another task list (or with another shard size) would search tasks
    again into other shards (two trees per task id); it is refused before searching, and
    nothing stored is lost."""
    from storage.errors import StoreError

    first = generate(config(tmp_path / "store"), tasks=tasks[1:3], run_id="r1", policy=tiny, env=env, progress=False)
    store = Store(tmp_path / "store")
    before = store.nodes().collect().height
    sequences = tiny.stats.sequences
    # Shard 0 is committed with tasks 1-2; this task list puts tasks 0-1 under its id.
    with pytest.raises(StoreError, match="shard 'tasks-000000-000001' of run 'r1' holds tasks.*another task list"):
        generate(config(tmp_path / "store"), tasks=tasks, run_id="r1", policy=tiny, env=env, progress=False)
    with pytest.raises(StoreError, match="other settings"):  # the shard size moves the shards' seeds
        generate(config(tmp_path / "store", shard_size=4), tasks=tasks, run_id="r1", policy=tiny, env=env,
                 progress=False)
    assert tiny.stats.sequences == sequences  # refused before any sampling
    # ... and before the policy loads: a model folder that does not exist is never opened.
    with pytest.raises(StoreError, match="'r1' was written with other settings"):
        generate(config(tmp_path / "store", policy__model=str(tmp_path / "no-model")), tasks=tasks, run_id="r1",
                 env=env, progress=False)
    assert store.committed_shards("tasks", "r1") == {"tasks-000000-000001"}
    assert store.nodes().collect().height == before == first.nodes
    # A second writer's shard (checked again right before its commit) that holds a stored task.
    with pytest.raises(StoreError, match="already holds task 'arithmetic-train-000002'.*another process"):
        check_no_overlap(store, "r1", Shard(1, "tasks-000002-000003", tasks[2:4]))
    check_no_overlap(store, "r1", Shard(1, "tasks-000003-000003", tasks[3:4]))


def test_a_run_id_refuses_other_settings(tmp_path, env, tiny, tasks):
    """An explicit run id resumed with a changed output setting would mix two configurations in
    one run; it is refused before any sampling. More tasks with the same settings extend it."""
    from storage.errors import StoreError

    generate(config(tmp_path / "store"), tasks=tasks[:2], run_id="r1", policy=tiny, env=env, progress=False)
    store = Store(tmp_path / "store")
    run = store.runs().collect().to_dicts()
    assert json.loads(run[0]["config_json"])["settings_key"] == settings_key(config(tmp_path / "store"))
    sequences = tiny.stats.sequences
    with pytest.raises(StoreError, match="'r1' was written with other settings"):
        generate(config(tmp_path / "store", search__num_simulations=2), tasks=tasks, run_id="r1", policy=tiny,
                 env=env, progress=False)
    assert tiny.stats.sequences == sequences  # refused before any sampling
    # ... and before the policy loads: a model folder that does not exist is never opened.
    with pytest.raises(StoreError, match="'r1' was written with other settings"):
        generate(config(tmp_path / "store", policy__model=str(tmp_path / "no-model")), tasks=tasks, run_id="r1",
                 env=env, progress=False)
    assert store.committed_shards("tasks", "r1") == {"tasks-000000-000001"}
    assert store.runs().collect().to_dicts() == run  # the lineage row still names the first settings
    # The task count is not a setting a run must keep (a run is extended by more tasks).
    assert settings_key(config("s", num_tasks=3)) == settings_key(config("s", num_tasks=8))
    assert settings_key(config("s", search__num_simulations=2)) != settings_key(config("s"))


def test_best_of_n_and_greedy_charge_the_budget(env, tiny, tasks):
    cfg = config("unused")
    reward = make_reward(cfg, env)
    budget = TokenBudget.for_tasks(2, 10_000)
    before = tiny.stats.generated_tokens
    common = {"policy": tiny, "env": env, "reward": reward, "max_steps": 3, "max_new_tokens": 4, "top_p": 1.0, "seed": 0}
    eps = play_episodes(tasks[:2], n=3, wave=2, temperature=1.0, budget=budget, **common)
    assert [(e.task_index, e.number) for e in eps] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    # Waves of 2 then 1 episode per task: every sampled token is charged.
    assert budget.total == tiny.stats.generated_tokens - before
    assert sum(e.tokens for e in eps) <= budget.total
    for e in eps:
        assert e.state.terminal and e.reward == pytest.approx(reward.score(e.state.episode()).reward)

    # A budget smaller than one wave: one wave, then the task stops.
    small = TokenBudget.for_tasks(1, 3)
    eps = play_episodes(tasks[:1], n=8, wave=2, temperature=1.0, budget=small, **common)
    assert len(eps) == 2

    # The last wave shrinks to what the budget pays for: waves of 2, 2, then 1 (4 tokens each).
    shrink = TokenBudget.for_tasks(1, 20)
    eps = play_episodes(tasks[:1], n=8, wave=2, temperature=1.0, budget=shrink, **common)
    assert len(eps) == 5 and shrink.total == 20

    g1 = play_episodes(tasks[:2], n=1, wave=1, temperature=0.0, budget=TokenBudget.for_tasks(2, 100), **common)
    g2 = play_episodes(tasks[:2], n=1, wave=1, temperature=0.0, budget=TokenBudget.for_tasks(2, 100), **common)
    assert [e.state.messages for e in g1] == [e.state.messages for e in g2]


def test_generate_baselines_write_sources(tmp_path, env, tiny, tasks):
    bon = generate(config(tmp_path / "store", generate__method="best_of_n", generate__n=2), tasks=tasks[:2], policy=tiny,
                   env=env, progress=False)
    greedy = generate(config(tmp_path / "store", generate__method="greedy"), tasks=tasks[:2], policy=tiny, env=env,
                      progress=False)
    assert bon.run_id != greedy.run_id and bon.simulations == 0 and bon.trajectories == 4 and greedy.trajectories == 2
    trajs = Store(tmp_path / "store").trajectories().collect()
    assert sorted(set(trajs["source"])) == ["best_of_n", "greedy"]
    assert (trajs["num_generated_tokens"] > 0).all()
    with pytest.raises(ConfigError, match="generate.method"):
        config(tmp_path / "store", generate__method="beam")


def test_cli_generate(tmp_path):
    runner = CliRunner()
    out = tmp_path / "store"
    cfg = tmp_path / "run.yaml"
    cfg.write_text("search:\n  num_actions: 2\n  value: zero\npolicy:\n  max_new_tokens: 4\n  device: cpu\n")
    # The file sets K=2; the --k flag overrides it.
    args = ["generate", "--config", str(cfg), "--suite", "arithmetic", "--tasks", "2", "--model", "tiny", "--sims", "2",
            "--k", "3", "--out", str(out), "--no-progress", "--run-id", "cli-1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "cli-1" in result.output and Store(out).committed_shards("tasks", "cli-1")
    engine = json.loads(Store(out).runs().collect()["config_json"][0])["engine"]
    assert engine["search"]["num_actions"] == 3 and engine["search"]["value"] == "zero"
    assert engine["policy"]["max_new_tokens"] == 4 and engine["num_tasks"] == 2
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "already committed" in again.output

    bad = runner.invoke(app, ["generate", "--method", "beam", "--out", str(out)])
    assert bad.exit_code != 0 and "generate.method" in bad.output
    bad = runner.invoke(app, ["generate", "--suite", "nosuch", "--out", str(out), "--model", "tiny"])
    assert bad.exit_code != 0 and "unknown suite" in bad.output
    bad = runner.invoke(app, ["generate", "--value", "oracle", "--out", str(out)])
    assert bad.exit_code != 0 and "search.value" in bad.output
    cfg.write_text("search:\n  num_action: 2\n")
    bad = runner.invoke(app, ["generate", "--config", str(cfg), "--out", str(out)])
    assert bad.exit_code != 0 and "num_action" in bad.output and "run.yaml" in bad.output


def test_run_id_follows_the_prompt_template(tmp_path, tasks, monkeypatch):
    import dataengine.chat_template as chat_template
    cfg = config(tmp_path / "store")
    before = default_run_id(cfg, tasks[:2])
    assert default_run_id(cfg, tasks[:2]) == before
    assert chat_template.prompt_fingerprint(True) != chat_template.prompt_fingerprint(False)
    monkeypatch.setattr(chat_template, "prompt_fingerprint", lambda few_shot=True: "another-template")
    assert default_run_id(cfg, tasks[:2]) != before


def test_run_id_follows_every_output_setting(tmp_path, tasks):
    """A rerun with another --rollouts, --n, method, prior, value head or temperature must not
    resume the old run; the store folder and the derive/eval/train sections do not matter."""
    base = default_run_id(config(tmp_path / "a"), tasks[:2])
    changed = {
        "generate__rollouts": 3, "generate__n": 5, "generate__method": "best_of_n", "generate__prior": "frequency",
        "policy__temperature": 0.5, "search__num_simulations": 4, "seed": 1, "reward__weights": {"format": 0.1},
    }
    for key, value in changed.items():
        assert default_run_id(config(tmp_path / "a", **{key: value}), tasks[:2]) != base, key
    assert default_run_id(config(tmp_path / "b"), tasks[:2]) == base
    same = {"derive__margin": 0.5, "eval__num_tasks": 3, "train__dpo__beta": 0.3,
            "sandbox__workers": 4}
    for key, value in same.items():
        assert default_run_id(config(tmp_path / "a", **{key: value}), tasks[:2]) == base, key
    head = tmp_path / "v.pt"
    head.write_bytes(b"one")
    with_head = default_run_id(config(tmp_path / "a", generate__value_model=str(head)), tasks[:2])
    head.write_bytes(b"two")
    assert default_run_id(config(tmp_path / "a", generate__value_model=str(head)), tasks[:2]) != with_head


def test_run_id_follows_a_checkpoint_folders_weights(tmp_path, tasks):
    """A checkpoint folder retrained in place is another policy: its runs must not resume."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    weights = folder / "model.safetensors"
    weights.write_bytes(b"first weights")
    first = default_run_id(config(tmp_path / "a", policy__model=str(folder)), tasks[:2])
    assert default_run_id(config(tmp_path / "a", policy__model=str(folder)), tasks[:2]) == first
    weights.write_bytes(b"retrained weights")  # another size: the digest memo keys on size and mtime
    assert default_run_id(config(tmp_path / "a", policy__model=str(folder)), tasks[:2]) != first


def test_cli_rerun_with_other_rollouts_starts_a_new_run(tmp_path):
    runner = CliRunner()
    out = tmp_path / "store"
    args = ["generate", "--suite", "arithmetic", "--tasks", "1", "--model", "tiny", "--sims", "2", "--k", "2",
            "--value", "rollout", "--max-new-tokens", "4", "--max-depth", "2", "--device", "cpu", "--store", str(out),
            "--no-progress"]
    first = runner.invoke(app, [*args, "--rollouts", "1"])
    second = runner.invoke(app, [*args, "--rollouts", "2"])
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert "already committed" not in second.output
    runs = set(Store(out).runs().collect()["run_id"])
    assert len(runs) == 2


def test_levels_select_tasks_and_change_the_run_id(tmp_path):
    from dataengine.stages.generate import config_tasks

    hard = config(tmp_path / "s", num_tasks=3, levels=[3])
    assert [t.metadata["level"] for t in config_tasks(hard)] == [3, 3, 3]
    assert default_run_id(hard, config_tasks(hard)) != default_run_id(config(tmp_path / "s", num_tasks=3), config_tasks(hard))
    bad = CliRunner().invoke(app, ["generate", "--level", "7", "--model", "tiny", "--store", str(tmp_path / "s"),
                                   "--no-progress"])
    assert bad.exit_code == 2 and "unknown level 7" in bad.output


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path, env, tasks):
    """A run stopped after its first shard and resumed by a fresh process (a new
    policy with an empty prefix cache) writes the same node and trajectory rows, bit for bit
    (logprob, prior, q included), as one uninterrupted run."""
    from dataengine.policy import make_policy

    overrides = {"search__num_simulations": 6, "policy__max_new_tokens": 8}
    whole = config(tmp_path / "whole", **overrides)
    generate(whole, tasks=tasks, run_id="r", policy=make_policy("hf", "tiny"), env=env, progress=False)
    parts = config(tmp_path / "parts", **overrides)
    generate(parts, tasks=tasks[:2], run_id="r", policy=make_policy("hf", "tiny"), env=env, progress=False)
    resumed = generate(parts, tasks=tasks, run_id="r", policy=make_policy("hf", "tiny"), env=env, progress=False)
    assert resumed.shards_skipped == 1 and resumed.shards_written == 1

    def rows(store, table):
        frame = getattr(Store(tmp_path / store), table)().collect()
        frame = frame.drop([c for c in frame.columns if c in ("created_at", "written_at")])
        return frame.sort(frame.columns[:4]).to_dicts()

    for table in ("nodes", "trajectories"):
        a, b = rows("whole", table), rows("parts", table)
        assert len(a) == len(b) > 0
        assert a == b
    logprobs = [r["logprob"] for r in rows("whole", "nodes") if r["logprob"] is not None]
    assert len(set(logprobs)) > 1  # real, varied log-probs were compared
