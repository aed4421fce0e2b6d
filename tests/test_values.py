"""Value estimators with the tiny model: rollouts, the AI critic, the value head (fitted from a
real generate run with `dataengine train value`, rendered the same at fit and use, refused over
another model or tokenizer), the Q mix."""

from __future__ import annotations

import copy
import json

import polars as pl
import pytest
import torch
from engine_configs import tiny_engine_config
from typer.testing import CliRunner

from dataengine.cli import app
from dataengine.env import ToolEnv
from dataengine.policy import Conversation, Policy, Sample, make_policy
from dataengine.policy.hf import HFPolicy
from dataengine.search import search_batch
from dataengine.search.run import run_shard, write_shard
from dataengine.stages import make_reward
from dataengine.stages.generate import generate as generate_run
from dataengine.suites.arithmetic import SUITE
from dataengine.suites.base import generate
from dataengine.tools.sandbox import Sandbox
from dataengine.types import Message
from dataengine.values import (
    AICritic,
    RolloutValue,
    ValueModel,
    mix_q,
    q_targets_from_nodes,
    rank_scores,
    state_conversation,
    store_q_targets,
    tokenizer_id,
)
from storage import Store


@pytest.fixture(scope="module")
def policy():
    return make_policy("hf", "tiny")


@pytest.fixture(scope="module")
def tasks():
    return generate(SUITE, 3, 0, seed=0)


def test_mix_q():
    assert mix_q(1.0, 0.0, 0.25) == 0.25
    assert mix_q(0.2, 0.6, 1.0) == 0.2
    with pytest.raises(ValueError, match="mix weight"):
        mix_q(0.0, 0.0, 1.5)


def test_rank_scores():
    assert rank_scores([0.1, 0.7, 0.2]) == [0.0, 1.0, 0.5]
    assert rank_scores([0.5, 0.5]) == [0.5, 0.5]
    assert rank_scores([0.3]) == [1.0]


def test_rollouts_batched_with_budget(policy, tasks):
    calls = {"n": 0}

    def reward(episode):
        calls["n"] += 1
        # A reward that depends on the rollout: steps taken, so it is not constant.
        return 1.0 / (1 + len(episode.steps))

    with Sandbox(workers=1) as sandbox:
        env = ToolEnv(sandbox, max_steps=8)
        states = [env.reset(t) for t in tasks]
        before = policy.stats.calls
        est = RolloutValue(policy, env, reward, rollouts=3, max_steps=2, max_new_tokens=8, seed=1).estimate(states)
        # The tiny model writes no tool call, so every rollout ends after one step (a final
        # answer): one policy call for all 9 rollouts, reward 1/2 each.
        assert policy.stats.calls - before == 1
        assert [e.n for e in est] == [3, 3, 3]
        for e in est:
            assert e.details["rewards"] == [0.5, 0.5, 0.5] and e.details["unfinished"] == 0
            assert e.value == 0.5
        assert calls["n"] == 9
        terminal = env.step(states[0], "42").state
        assert RolloutValue(policy, env, reward).estimate([terminal])[0].details == {"terminal": True}


def test_critic_scores_candidates(policy, tasks):
    # A random model spreads its mass over the whole vocabulary: accept any label mass.
    critic = AICritic(policy, min_label_mass=0.0)
    state = Conversation.from_task(tasks[0])
    cands = ['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "The answer is 3.", "I do not know."]
    out = critic.rank([state, state], [cands, cands[:2]])
    assert len(out[0].scores) == 3 and len(out[1].scores) == 2
    for r in out:
        assert not r.fallback
        assert sorted(r.scores)[0] == 0.0 and sorted(r.scores)[-1] == 1.0
        assert sum(r.probs) == pytest.approx(1.0)
    # Debiased: scoring the reversed list gives the same ranking of the same candidates.
    rev = critic.rank([state], [list(reversed(cands))])[0]
    assert rev.probs == pytest.approx(list(reversed(out[0].probs)), abs=1e-6)
    text = critic.prompt(state, cands).messages[1].content
    assert "A) <tool_call>" in text and "C) I do not know." in text


def test_critic_falls_back_when_labels_get_no_mass(policy, tasks):
    critic = AICritic(policy, min_label_mass=1.1)  # unreachable: forces the fallback
    out = critic.rank([Conversation.from_task(tasks[0])], [["x", "y"]])[0]
    assert out.fallback and out.scores == [0.5, 0.5]
    with pytest.raises(ValueError, match="one candidate list per state"):
        critic.rank([Conversation.from_task(tasks[0])], [])


CALL = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'


class CallingTiny(HFPolicy):
    """The tiny model, whose first sample at a task's first turn is replaced by an `add` call:
    the random model only writes final answers, and the trees need non-terminal states with
    tool calls and tool results to value."""

    def sample(self, convs, k, **options):
        rows = super().sample(convs, k, **options)
        for conv, row in zip(convs, rows):
            if not any(m.role == "assistant" for m in conv.messages):
                s = row[0]
                row[0] = Sample(CALL, s.token_ids, s.logprobs, s.logprob, s.num_tokens, "stop")
        return rows

    def sample_together(self, requests, *, max_new_tokens=128):
        # One `sample` per request, so the call is put in here too (the greedy candidate's requests).
        return Policy.sample_together(self, requests, max_new_tokens=max_new_tokens)


class RecordingHead(ValueModel):
    """A real value head that also keeps the text of every state it computed features for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def features(self, states):
        self.seen += [self.render(s) for s in states]
        return super().features(states)


def engine_config(store, **overrides):
    return tiny_engine_config(store, **{"policy__max_new_tokens": 6, "search__num_simulations": 6, **overrides})


@pytest.fixture(scope="module")
def calling(policy):
    return CallingTiny(policy.model, policy.tokenizer)


@pytest.fixture(scope="module")
def searched(tmp_path_factory, calling, env, tasks):
    """A store with run "r0": a real generate run (value zero) over two arithmetic tasks."""
    root = tmp_path_factory.mktemp("values")
    generate_run(engine_config(root / "store"), tasks=tasks[:2], run_id="r0", policy=calling, env=env, progress=False)
    return root


@pytest.fixture(scope="module")
def head_file(searched):
    """`dataengine train value` on run r0 for the tiny model."""
    out = searched / "v.pt"
    result = CliRunner().invoke(app, ["train", "value", "--store", str(searched / "store"), "--run", "r0",
                                      "--model", "tiny", "--device", "cpu", "--out", str(out), "--l2", "0.01",
                                      "--min-visits", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["runs"] == ["r0"] and summary["n"] >= 3 and summary["min_visits"] == 1
    return out


@pytest.fixture(scope="module")
def other_model(policy, tmp_path_factory):
    """A checkpoint folder of the tiny model with one weight changed: another model id."""
    folder = tmp_path_factory.mktemp("other") / "tiny-other"
    model = copy.deepcopy(policy.model)
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return make_policy("hf", str(folder))


def test_q_targets_carry_the_tasks_tools(tasks):
    rows, task_rows = [], [{"run_id": "r", "task_id": t.id, "task_json": t.model_dump_json()} for t in tasks]
    for i, t in enumerate(tasks):
        msgs = [m.model_dump(mode="json") for m in t.messages]
        rows.append({"run_id": "r", "task_id": t.id, "node_id": 0, "messages_json": json.dumps(msgs), "q": 0.5 + i,
                     "reward": None, "terminal": False, "visits": 3})
        rows.append({"run_id": "r", "task_id": t.id, "node_id": 1, "messages_json": json.dumps(msgs), "q": 0.9,
                     "reward": 0.2, "terminal": False, "visits": 1})
        rows.append({"run_id": "r", "task_id": t.id, "node_id": 2, "messages_json": json.dumps(msgs), "q": 1.0,
                     "reward": 1.0, "terminal": True, "visits": 4})
    states, targets = q_targets_from_nodes(rows, task_rows)
    # Terminal nodes are left out; the target is V = q - reward (the root's q is its V).
    assert targets == pytest.approx([0.5, 0.7, 1.5, 0.7, 2.5, 0.7])
    assert all(s.tools == tuple(tasks[i // 2].tools) and s.tools for i, s in enumerate(states))
    assert states[0] == Conversation.from_task(tasks[0])
    assert len(q_targets_from_nodes(rows, task_rows, min_visits=2)[0]) == 3
    with pytest.raises(ValueError, match="not in the tasks rows"):
        q_targets_from_nodes(rows, task_rows[1:])


def test_features_do_not_depend_on_the_batch(policy, tasks):
    head = ValueModel(policy, max_batch_tokens=10_000)
    state = Conversation.from_task(tasks[0])
    longer = state.extend(Message(role="assistant", content="let me think " * 20))
    together = head.features([state, longer, Conversation.from_task(tasks[1])])
    one_by_one = ValueModel(policy, max_batch_tokens=1)  # every state alone
    assert torch.allclose(together, one_by_one.features([state, longer, Conversation.from_task(tasks[1])]), atol=1e-5)
    # The feature is the model's final hidden state at the last prompt token of the policy's prompt.
    ids = torch.tensor([policy.encode(state)])
    with torch.no_grad():
        full = policy.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
    assert torch.allclose(together[0], full, atol=1e-5)
    assert head.render(state) == policy.render(state)
    with pytest.raises(TypeError, match="hf-backend policy"):
        ValueModel(object())


def test_value_model_fits_and_round_trips(policy, tasks, tmp_path):
    states = [Conversation.from_task(t).extend(Message(role="assistant", content="ok" if i % 2 else "nonsense " * 5))
              for i, t in enumerate(generate(SUITE, 12, 0, seed=1))]
    targets = [float(i % 2) for i in range(12)]
    vm = ValueModel(policy, l2=1e-3)
    fit = vm.fit(states, targets)
    assert fit["n"] == 12 and fit["mse"] < 0.05 < fit["baseline_mse"] and "cv_mse" not in fit
    # Held out by task: each fold's head is fitted without the held-out states' tasks. The
    # targets here follow the reply, not the task, so a held-out task's states are still
    # predicted better than by the mean; the errors are computed on other states than `mse`.
    grouped = vm.fit(states, targets, groups=[str(i // 2) for i in range(12)], folds=3)
    assert grouped["cv_folds"] == 3 and grouped["mse"] == fit["mse"]
    assert grouped["cv_mse"] > grouped["mse"] and grouped["cv_mse"] < grouped["cv_baseline_mse"]
    with pytest.raises(ValueError, match="one group per state"):
        vm.fit(states, targets, groups=["a"])
    preds = vm.predict(states)
    assert all(0.0 <= p <= 1.0 for p in preds)
    assert sum((p > 0.5) == (t > 0.5) for p, t in zip(preds, targets)) >= 11
    vm.save(tmp_path / "head.pt", {"runs": ["x"]})
    loaded = ValueModel(policy).load(tmp_path / "head.pt")
    assert loaded.predict(states[:2]) == pytest.approx(preds[:2], abs=1e-4)  # batch-size float noise
    assert loaded.info == {"runs": ["x"]} and loaded.predict([]) == []
    with pytest.raises(RuntimeError, match="not fitted"):
        ValueModel(policy).predict(states)
    (tmp_path / "junk.pt").write_bytes(b"not a head")
    with pytest.raises(ValueError, match="junk.pt is not a ValueModel head"):
        ValueModel(policy).load(tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="missing.pt is not a file"):
        ValueModel(policy).load(tmp_path / "missing.pt")


def test_head_is_refused_over_another_model_or_tokenizer(policy, other_model, head_file):
    mine = ValueModel(policy).identity()
    # Other weights, same tokenizer: the message names both model ids.
    assert ValueModel(other_model).identity()["tokenizer_id"] == mine["tokenizer_id"]
    with pytest.raises(ValueError) as err:
        ValueModel(other_model).load(head_file)
    assert mine["model_id"] in str(err.value) and other_model.model_id in str(err.value)
    # Same weights, another chat template (no example episodes): both tokenizer ids are named.
    plain = make_policy("hf", "tiny", fewshot=False)
    assert plain.model_id == policy.model_id
    theirs = tokenizer_id(plain.tokenizer)
    assert theirs != mine["tokenizer_id"]
    with pytest.raises(ValueError) as err:
        ValueModel(plain).load(head_file)
    assert mine["tokenizer_id"] in str(err.value) and theirs in str(err.value)
    assert ValueModel(policy).load(head_file).weight is not None


def test_fit_reads_what_the_search_feeds(searched, head_file, calling, env, tasks):
    """The text the head reads for a stored node at fit time is the text the search fed it for
    that node, tool calls, tool results and the tools listing included."""
    cfg = engine_config(searched / "store", search__value="value_model")
    store = Store(searched / "store")
    head = RecordingHead(calling).load(head_file)
    out = run_shard("tasks-000000-000001", tasks[:2], method="mcts", policy=calling, env=env,
                    reward=make_reward(cfg, env), config=cfg, seed=0, value_model=head)
    write_shard(store, out, "r-vm")
    rows = [r for r in store.nodes().filter(pl.col("run_id") == "r-vm").collect().to_dicts() if not r["terminal"]]
    assert any(r["depth"] > 0 for r in rows)  # states after a tool call and its result
    task_rows = store.tasks().filter(pl.col("run_id") == "r-vm").collect().to_dicts()
    states, _ = q_targets_from_nodes(rows, task_rows)
    fit_texts = [head.render(s) for s in states]
    assert set(fit_texts) == set(head.seen)
    assert store_q_targets(store, ["r-vm"])[0] == states
    for text, state in zip(fit_texts, states):
        assert all(t.name in text for t in state.tools)
    assert any("<tool_response>" in t and "add" in t for t in fit_texts)
    # What the search stored as each node's value is the head's prediction for the fit's state.
    assert [r["value_estimate"] for r in rows] == pytest.approx(head.predict(states), abs=1e-5)


def test_train_value_refuses_bad_runs(searched, tmp_path):
    args = ["train", "value", "--store", str(searched / "store"), "--model", "tiny", "--device", "cpu",
            "--out", str(tmp_path / "v.pt")]
    result = CliRunner().invoke(app, [*args, "--run", "nope"])
    assert result.exit_code != 0 and "nope" in result.output and "r0" in result.output
    result = CliRunner().invoke(app, [*args, "--run", "r0", "--min-visits", "1000"])
    assert result.exit_code != 0 and "1000 visits" in result.output
    assert not (tmp_path / "v.pt").exists()


def test_generate_takes_the_head(searched, head_file, other_model, tmp_path, tasks):
    store = tmp_path / "store"
    args = ["generate", "--suite", "arithmetic", "--tasks", "1", "--model", "tiny", "--device", "cpu", "--sims", "2",
            "--k", "2", "--max-new-tokens", "4", "--value", "value_model", "--store", str(store), "--no-progress"]
    first = CliRunner().invoke(app, [*args, "--value-model", str(head_file)])
    assert first.exit_code == 0, first.output
    # Another head (other bytes) is another run; the same command with the same head resumes.
    refit = tmp_path / "v2.pt"
    ValueModel(make_policy("hf", "tiny")).load(head_file).save(refit, {"copy": True})
    assert CliRunner().invoke(app, [*args, "--value-model", str(refit)]).exit_code == 0
    again = CliRunner().invoke(app, [*args, "--value-model", str(head_file)])
    assert again.exit_code == 0 and "already committed" in again.output
    runs = Store(store).runs().collect().to_dicts()
    assert len({r["run_id"] for r in runs}) == 2
    assert {json.loads(r["config_json"])["engine"]["generate"]["value_model"] for r in runs} == {str(head_file), str(refit)}
    nodes = Store(store).nodes().collect()
    assert nodes.filter(nodes["node_id"] == 0)["value_estimate"].is_not_null().all()
    # A head fitted over another model is refused with both ids named.
    foreign = tmp_path / "foreign.pt"
    vm = ValueModel(other_model, l2=0.1)
    vm.fit([Conversation.from_task(t) for t in tasks], [0.0, 0.5, 1.0])
    vm.save(foreign)
    refused = CliRunner().invoke(app, [*args, "--value-model", str(foreign)])
    assert refused.exit_code == 2 and "was fitted over model" in refused.output
    assert other_model.model_id in refused.output


def test_critic_mix_with_value_model(calling, env, tasks, head_file):
    """Agent Q's mix over a value head: each non-root leaf's value is a * V + (1 - a) * critic."""
    head = ValueModel(calling).load(head_file)
    cfg = engine_config("unused", search__value="value_model", search__critic_mix=0.25)
    batch = search_batch(tasks[:2], policy=calling, env=env, reward=make_reward(cfg, env), config=cfg, seed=0,
                         value_model=head)
    inner = [n for n in batch.table.nodes if n.edge is not None and not n.terminal]
    assert inner
    predicted = head.predict([state_conversation(n.state.messages, n.state.task) for n in inner])
    for node, v in zip(inner, predicted):
        assert node.edge.critic_score is not None
        assert node.value_estimate == pytest.approx(0.25 * v + 0.75 * node.edge.critic_score, abs=1e-5)
